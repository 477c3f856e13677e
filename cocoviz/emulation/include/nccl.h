// nccl.h — cocoviz emulation: the NCCL host API that emitted programs use, on MPI (one MPI
// rank = one process = one emulated GPU). Not NVIDIA's header: the names, values and
// signatures of the real one (NCCL 2.28+) for the subset cocoviz's generated code needs;
// src/nccl.cpp implements it and lists the rules it checks. Argument errors the real NCCL
// reports return its error code (with a text for ncclGetLastError); violations the real
// NCCL would silently compute garbage or hang on (mismatched collectives, illegal
// send/receive overlap, a peer pointer outside a window) end the job via cocoviz_emu::fail.
#ifndef COCOVIZ_EMU_NCCL_H_
#define COCOVIZ_EMU_NCCL_H_

#include <cstddef>
#include <cstdint>

#include "cuda_runtime.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_SUFFIX "cocoviz-emulation"
#define NCCL_VERSION_CODE 22800
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL nullptr

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_API_MAGIC 0xcafebeef

// Window registration flags
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

// Communicator configuration: the emulation takes none (pass nullptr); the type is left
// incomplete so that a program setting options fails to compile rather than having them
// silently ignored.
typedef struct ncclConfig_v22800 ncclConfig_t;

typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,  // declared for completeness; the emulation rejects them
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

// ------------------------------------------------------------ errors, version
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);  // the last error's explanation ("" if none)
ncclResult_t ncclGetVersion(int* version);

// -------------------------------------------------------------- communicators
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
// Emulation: every rank of MPI_COMM_WORLD must call ncclCommInitRank at the same point
// (the ranks of one id form one communicator; other ids form others).
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);

// ------------------------------------------------------- symmetric memory, windows
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t ncclMemFree(void* ptr);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

// ------------------------------------------------------------------ collectives
// In place: AllReduce/Broadcast/Reduce if sendbuff == recvbuff; AllGather if sendbuff ==
// recvbuff + rank * sendcount; ReduceScatter if recvbuff == sendbuff + rank * recvcount.
// Any other overlap of the send and receive ranges is an error.
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);

// ----------------------------------------------------------------- point to point
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);

// ------------------------------------------------------------------------ groups
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

#endif  // COCOVIZ_EMU_NCCL_H_
