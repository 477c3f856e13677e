// cublas_v2.h — cocoviz emulation: the part of cuBLAS that emitted programs use, on the host
// (cocoviz_emu/core.h explains the model). Not NVIDIA's header; the enum values are the real
// ones, so status codes print the same.
//
// Emulated: handles (cublasCreate, cublasDestroy — which synchronizes the device, as cuBLAS
// documents — cublasSetStream/GetStream, cublasSetPointerMode/GetPointerMode),
// cublasGetStatusString/Name (cuBLAS 13's texts), cublasGemmStridedBatchedEx (as
// batchCount cublasGemmEx calls) and cublasGemmEx with cuBLAS's
// column-major semantics and argument checks. A GEMM is one operation on the handle's
// stream: it reads A and B (only the rows of each column that it uses), C when beta != 0,
// alpha and beta in device pointer mode, and writes C; each access is checked for bounds and
// against unordered work on other streams. cublasSetWorkspace: a user workspace (256-byte
// aligned, inside a live device allocation) that every later GEMM on the handle writes —
// recorded as a write of its first bytes, so two GEMMs sharing one workspace on streams
// nothing orders are a hazard (cuBLAS: a routine may run several kernels that rely on the
// workspace staying intact) — until cublasSetStream resets the handle to the default pool,
// as cuBLAS documents. Math modes, algorithms (accepted, ignored) and every other routine
// are not emulated.
//
// Numerics: products are accumulated in the compute type (float; double for COMPUTE_64F;
// half, each step one fused rounding, for COMPUTE_16F) in k order, with separate multiply
// and add, then C = alpha * acc + beta * C is rounded once to C's type. Tensor-core numerics
// (blocked or split-k accumulation order, fused multiply-add, TF32/bf16 down-conversion of
// f32 inputs under the _FAST_ compute types) are not emulated: results can differ from a GPU
// in the last bits of f32 accumulation.
#ifndef COCOVIZ_EMU_CUBLAS_V2_H_
#define COCOVIZ_EMU_CUBLAS_V2_H_

#include "cuda_runtime.h"

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
  CUBLAS_OP_C = 2,
  CUBLAS_OP_HERMITAN = 2,
  CUBLAS_OP_CONJG = 3  // a placeholder in cuBLAS too: rejected
} cublasOperation_t;

typedef enum { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 } cublasPointerMode_t;

typedef enum {
  CUBLAS_GEMM_DFALT = -1,
  CUBLAS_GEMM_DEFAULT = -1,
  CUBLAS_GEMM_ALGO0 = 0,
  CUBLAS_GEMM_ALGO1 = 1,
  CUBLAS_GEMM_ALGO2 = 2,
  CUBLAS_GEMM_ALGO3 = 3,
  CUBLAS_GEMM_ALGO4 = 4,
  CUBLAS_GEMM_ALGO5 = 5,
  CUBLAS_GEMM_ALGO6 = 6,
  CUBLAS_GEMM_ALGO7 = 7,
  CUBLAS_GEMM_ALGO8 = 8,
  CUBLAS_GEMM_ALGO9 = 9,
  CUBLAS_GEMM_ALGO10 = 10,
  CUBLAS_GEMM_ALGO11 = 11,
  CUBLAS_GEMM_ALGO12 = 12,
  CUBLAS_GEMM_ALGO13 = 13,
  CUBLAS_GEMM_ALGO14 = 14,
  CUBLAS_GEMM_ALGO15 = 15,
  CUBLAS_GEMM_ALGO16 = 16,
  CUBLAS_GEMM_ALGO17 = 17,
  CUBLAS_GEMM_ALGO18 = 18,
  CUBLAS_GEMM_ALGO19 = 19,
  CUBLAS_GEMM_ALGO20 = 20,
  CUBLAS_GEMM_ALGO21 = 21,
  CUBLAS_GEMM_ALGO22 = 22,
  CUBLAS_GEMM_ALGO23 = 23,
  CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
  CUBLAS_GEMM_DFALT_TENSOR_OP = 99,
  CUBLAS_GEMM_ALGO0_TENSOR_OP = 100,
  CUBLAS_GEMM_ALGO1_TENSOR_OP = 101,
  CUBLAS_GEMM_ALGO2_TENSOR_OP = 102,
  CUBLAS_GEMM_ALGO3_TENSOR_OP = 103,
  CUBLAS_GEMM_ALGO4_TENSOR_OP = 104,
  CUBLAS_GEMM_ALGO5_TENSOR_OP = 105,
  CUBLAS_GEMM_ALGO6_TENSOR_OP = 106,
  CUBLAS_GEMM_ALGO7_TENSOR_OP = 107,
  CUBLAS_GEMM_ALGO8_TENSOR_OP = 108,
  CUBLAS_GEMM_ALGO9_TENSOR_OP = 109,
  CUBLAS_GEMM_ALGO10_TENSOR_OP = 110,
  CUBLAS_GEMM_ALGO11_TENSOR_OP = 111,
  CUBLAS_GEMM_ALGO12_TENSOR_OP = 112,
  CUBLAS_GEMM_ALGO13_TENSOR_OP = 113,
  CUBLAS_GEMM_ALGO14_TENSOR_OP = 114,
  CUBLAS_GEMM_ALGO15_TENSOR_OP = 115,
  CUBLAS_GEMM_AUTOTUNE = 999
} cublasGemmAlgo_t;

typedef enum {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_16F_PEDANTIC = 65,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
  CUBLAS_COMPUTE_32F_EMULATED_16BFX9 = 78,
  CUBLAS_COMPUTE_64F = 70,
  CUBLAS_COMPUTE_64F_PEDANTIC = 71,
  CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT = 79,
  CUBLAS_COMPUTE_32I = 72,
  CUBLAS_COMPUTE_32I_PEDANTIC = 73
} cublasComputeType_t;

typedef cudaDataType cublasDataType_t;

struct cublasContext;  // defined in src/cublas.cpp
typedef struct cublasContext* cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream);
cublasStatus_t cublasGetPointerMode(cublasHandle_t handle, cublasPointerMode_t* mode);
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode);
const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);

// C = alpha * op(A) * op(B) + beta * C, column-major: op(A) is m x k, op(B) k x n, C m x n;
// element (i, j) of a matrix X with leading dimension ld is X[i + j * ld].
//
// Returns CUBLAS_STATUS_NOT_INITIALIZED for a null, destroyed or unknown handle;
// CUBLAS_STATUS_INVALID_VALUE for an operation other than N, T, C, m, n or k < 0,
// lda < max(1, transa == N ? m : k), ldb < max(1, transb == N ? k : n), ldc < max(1, m),
// a null alpha or beta, an unknown algorithm; CUBLAS_STATUS_NOT_SUPPORTED for a type
// combination other than (A/B type, C type, compute type, alpha/beta type):
//   16F/16F, 16F/32F, 16BF/16BF, 16BF/32F, 32F/32F with COMPUTE_32F(_PEDANTIC), float;
//   32F/32F with COMPUTE_32F_FAST_16F/_FAST_16BF/_FAST_TF32/_EMULATED_16BFX9, float;
//   64F/64F with COMPUTE_64F(_PEDANTIC, _EMULATED_FIXEDPOINT), double;
//   16F/16F with COMPUTE_16F(_PEDANTIC), __half;
// (int8 GEMMs and complex types are not emulated); CUBLAS_STATUS_EXECUTION_FAILED when the
// handle's stream was destroyed. Each of these adds a note saying what was wrong. Device
// ranges that leave their allocation (e.g. a leading dimension too large for the buffer),
// alpha or beta in device memory in host pointer mode (or on the host in device pointer
// mode) end the run with the emulation's report. m == 0 or n == 0 does nothing; k == 0
// gives C = beta * C. With beta == 0, C is not read (NaN there does not propagate).
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);

// batchCount GEMMs as cublasGemmEx, the i-th on A + i*strideA, B + i*strideB and
// C + i*strideC (strides in elements; 0 reuses one matrix for every GEMM, as cuBLAS
// allows for A and B); each GEMM is checked and run as one cublasGemmEx on the handle's
// stream. A negative batchCount or stride is CUBLAS_STATUS_INVALID_VALUE.
cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
    int k, const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
    const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo);

#endif  // COCOVIZ_EMU_CUBLAS_V2_H_
