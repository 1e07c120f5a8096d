// NcclComm: NCCL collectives on device buffers, one communicator per axis group.
#include "mesh/nccl_comm.hpp"

#include <cuda_runtime.h>

#include <string>

#include "tensor/cuda_check.hpp"

namespace meshmoe {
namespace {

void nccl_check(ncclResult_t r, const std::string& where, const char* call) {
  if (r != ncclSuccess) throw Error(where + ": " + call + " failed: " + ncclGetErrorString(r));
}
void cuda_check(cudaError_t r, const std::string& where, const char* call) {
  if (r != cudaSuccess) throw Error(where + ": " + call + " failed: " + cudaGetErrorString(r));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U64: return ncclUint64;
    case DType::U8: return ncclUint8;
  }
  throw Error("nccl_type: unknown DType");
}

ncclRedOp_t nccl_op(Op op) {
  switch (op) {
    case Op::Sum: return ncclSum;
    case Op::Max: return ncclMax;
    case Op::Min: return ncclMin;
  }
  throw Error("nccl_op: unknown Op");
}

const char* at(const void* p, size_t elems, DType t) { return static_cast<const char*>(p) + elems * dtype_size(t); }
char* at(void* p, size_t elems, DType t) { return static_cast<char*>(p) + elems * dtype_size(t); }

}  // namespace

void select_local_device(MPI_Comm world) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  int devices = 0;
  cuda_check(cudaGetDeviceCount(&devices), "select_local_device", "cudaGetDeviceCount");
  if (devices < 1) throw Error("select_local_device: no CUDA device visible to this rank");
  cuda_check(cudaSetDevice(local % devices), "select_local_device", "cudaSetDevice");
}

NcclComm::NcclComm(MpiComm& group, std::string label) : group_(group), label_(std::move(label)) {
  ncclUniqueId id;
  if (group_.rank() == 0) nccl_check(ncclGetUniqueId(&id), name(), "ncclGetUniqueId");
  group_.broadcast(reinterpret_cast<uint8_t*>(&id), sizeof(id), 0);
  stream_ = cuda_stream();  // in order with the kernels that produce and read the buffers
  nccl_check(ncclCommInitRank(&comm_, group_.size(), id, group_.rank()), name(), "ncclCommInitRank");
}

NcclComm::~NcclComm() {
  if (comm_) {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
  }
}

std::string NcclComm::name() const { return label_ + " (" + std::to_string(size()) + " ranks)"; }

void NcclComm::synchronize() { cuda_check(cudaStreamSynchronize(stream_), name(), "cudaStreamSynchronize"); }

void NcclComm::barrier() {
  synchronize();
  group_.barrier();
}

void NcclComm::queue_all_reduce(void* buf, size_t n, DType t, Op op) {
  nccl_check(ncclAllReduce(buf, buf, n, nccl_type(t), nccl_op(op), comm_, stream_), name(), "ncclAllReduce");
}

void NcclComm::queue_broadcast(void* buf, size_t n, DType t, int root) {
  check_rank(root, "broadcast root");
  nccl_check(ncclBroadcast(buf, buf, n, nccl_type(t), root, comm_, stream_), name(), "ncclBroadcast");
}

void NcclComm::queue_all_gather(const void* send, size_t n, void* recv, DType t) {
  nccl_check(ncclAllGather(send, recv, n, nccl_type(t), comm_, stream_), name(), "ncclAllGather");
}

void NcclComm::queue_reduce_scatter(const void* send, void* recv, size_t n, DType t, Op op) {
  nccl_check(ncclReduceScatter(send, recv, n, nccl_type(t), nccl_op(op), comm_, stream_), name(),
             "ncclReduceScatter");
}

void NcclComm::queue_reduce_scatterv_in_place(void* buf, const size_t* counts, DType t, Op op) {
  size_t off = 0;
  nccl_check(ncclGroupStart(), name(), "ncclGroupStart");
  for (int r = 0; r < size(); ++r) {
    nccl_check(ncclReduce(at(buf, off, t), at(buf, off, t), counts[r], nccl_type(t), nccl_op(op), r, comm_, stream_),
               name(), "ncclReduce");
    off += counts[r];
  }
  nccl_check(ncclGroupEnd(), name(), "ncclGroupEnd");
}

void NcclComm::queue_all_gatherv_in_place(void* buf, const size_t* counts, DType t) {
  size_t off = 0;
  nccl_check(ncclGroupStart(), name(), "ncclGroupStart");
  for (int r = 0; r < size(); ++r) {
    nccl_check(ncclBroadcast(at(buf, off, t), at(buf, off, t), counts[r], nccl_type(t), r, comm_, stream_), name(),
               "ncclBroadcast");
    off += counts[r];
  }
  nccl_check(ncclGroupEnd(), name(), "ncclGroupEnd");
}

void NcclComm::queue_all_to_all(const void* send, void* recv, size_t n, DType t) {
  const ncclDataType_t nt = nccl_type(t);
  nccl_check(ncclGroupStart(), name(), "ncclGroupStart");
  for (int j = 0; j < size(); ++j) {
    nccl_check(ncclSend(at(send, size_t(j) * n, t), n, nt, j, comm_, stream_), name(), "ncclSend");
    nccl_check(ncclRecv(at(recv, size_t(j) * n, t), n, nt, j, comm_, stream_), name(), "ncclRecv");
  }
  nccl_check(ncclGroupEnd(), name(), "ncclGroupEnd");
}

void NcclComm::queue_all_to_allv(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                               DType t) {
  const ncclDataType_t nt = nccl_type(t);
  size_t s_off = 0, r_off = 0;
  nccl_check(ncclGroupStart(), name(), "ncclGroupStart");
  for (int j = 0; j < size(); ++j) {
    // Zero-count pairs still post (NCCL matches a zero-byte send with a zero-byte receive).
    nccl_check(ncclSend(at(send, s_off, t), send_counts[j], nt, j, comm_, stream_), name(), "ncclSend");
    nccl_check(ncclRecv(at(recv, r_off, t), recv_counts[j], nt, j, comm_, stream_), name(), "ncclRecv");
    s_off += send_counts[j];
    r_off += recv_counts[j];
  }
  nccl_check(ncclGroupEnd(), name(), "ncclGroupEnd");
}

std::vector<size_t> NcclComm::exchange_counts(std::span<const size_t> send_counts) {
  return group_.exchange_counts(send_counts);
}

void NcclComm::queue_permute(const void* send, size_t n_send, int dest, void* recv, size_t n_recv, int source,
                           DType t) {
  check_rank(dest, "permute destination", /*allow_none=*/true);
  check_rank(source, "permute source", /*allow_none=*/true);
  const ncclDataType_t nt = nccl_type(t);
  nccl_check(ncclGroupStart(), name(), "ncclGroupStart");
  if (dest != kNoRank) nccl_check(ncclSend(send, n_send, nt, dest, comm_, stream_), name(), "ncclSend");
  if (source != kNoRank) nccl_check(ncclRecv(recv, n_recv, nt, source, comm_, stream_), name(), "ncclRecv");
  nccl_check(ncclGroupEnd(), name(), "ncclGroupEnd");
}

void NcclComm::queue_send(const void* buf, size_t n, DType t, int dest, int tag) {
  check_rank(dest, "send destination");
  nccl_check(ncclSend(buf, n, nccl_type(t), dest, comm_, stream_), name(), "ncclSend");
}

void NcclComm::queue_recv(void* buf, size_t n, DType t, int source, int tag) {
  check_rank(source, "receive source");
  nccl_check(ncclRecv(buf, n, nccl_type(t), source, comm_, stream_), name(), "ncclRecv");
}

}  // namespace meshmoe
