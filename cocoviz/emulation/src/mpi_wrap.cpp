// mpi_wrap.cpp — cocoviz emulation: the blocking MPI calls of emitted programs, through MPI's
// profiling interface (each MPI_X calls PMPI_X, as the MPI standard's chapter "Tool Support"
// allows a tool to), so that a rank blocked inside one shows on its status board. The
// deadlock detector (src/core.cpp, "waiting") then knows that rank is not going to post
// anything the waiting ranks need: a rank stuck in MPI_Allreduce at the end of an iteration
// while its peer waits for an ncclSend that never comes is a deadlock found in a second,
// not a 60 s watchdog. The calls behave exactly as MPI's own.
#include <mpi.h>

#include "cocoviz_emu/core.h"

namespace {

// Marks this rank as inside a blocking MPI call for the scope's lifetime.
struct InMpi {
  explicit InMpi(const char* call) { ::cocoviz_emu::mpi_blocking_enter(call); }
  ~InMpi() { ::cocoviz_emu::mpi_blocking_leave(); }
  InMpi(const InMpi&) = delete;
  InMpi& operator=(const InMpi&) = delete;
};

}  // namespace

extern "C" {

int MPI_Barrier(MPI_Comm comm) {
  InMpi m("MPI_Barrier");
  return PMPI_Barrier(comm);
}

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  InMpi m("MPI_Allreduce");
  return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}

int MPI_Reduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, int root,
               MPI_Comm comm) {
  InMpi m("MPI_Reduce");
  return PMPI_Reduce(sendbuf, recvbuf, count, datatype, op, root, comm);
}

int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm comm) {
  InMpi m("MPI_Allgather");
  return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}

int MPI_Gather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
               MPI_Datatype recvtype, int root, MPI_Comm comm) {
  InMpi m("MPI_Gather");
  return PMPI_Gather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm);
}

int MPI_Bcast(void* buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm) {
  InMpi m("MPI_Bcast");
  return PMPI_Bcast(buffer, count, datatype, root, comm);
}

int MPI_Reduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount, MPI_Datatype datatype, MPI_Op op,
                             MPI_Comm comm) {
  InMpi m("MPI_Reduce_scatter_block");
  return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm);
}

int MPI_Alltoall(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                 MPI_Datatype recvtype, MPI_Comm comm) {
  InMpi m("MPI_Alltoall");
  return PMPI_Alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}

int MPI_Alltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype,
                  void* recvbuf, const int recvcounts[], const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm) {
  InMpi m("MPI_Alltoallv");
  return PMPI_Alltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm);
}

int MPI_Send(const void* buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm) {
  InMpi m("MPI_Send");
  return PMPI_Send(buf, count, datatype, dest, tag, comm);
}

int MPI_Recv(void* buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm, MPI_Status* status) {
  InMpi m("MPI_Recv");
  return PMPI_Recv(buf, count, datatype, source, tag, comm, status);
}

int MPI_Wait(MPI_Request* request, MPI_Status* status) {
  InMpi m("MPI_Wait");
  return PMPI_Wait(request, status);
}

int MPI_Waitall(int count, MPI_Request array_of_requests[], MPI_Status* array_of_statuses) {
  InMpi m("MPI_Waitall");
  return PMPI_Waitall(count, array_of_requests, array_of_statuses);
}

int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* newcomm) {
  InMpi m("MPI_Comm_split");
  return PMPI_Comm_split(comm, color, key, newcomm);
}

int MPI_Comm_split_type(MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm* newcomm) {
  InMpi m("MPI_Comm_split_type");
  return PMPI_Comm_split_type(comm, split_type, key, info, newcomm);
}

int MPI_Win_allocate_shared(MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm, void* baseptr, MPI_Win* win) {
  InMpi m("MPI_Win_allocate_shared");
  return PMPI_Win_allocate_shared(size, disp_unit, info, comm, baseptr, win);
}

int MPI_Win_free(MPI_Win* win) {
  InMpi m("MPI_Win_free");
  return PMPI_Win_free(win);
}

int MPI_Finalize(void) {
  InMpi m("MPI_Finalize");
  return PMPI_Finalize();
}

}  // extern "C"
