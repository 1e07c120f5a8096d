// NcclComm: Comm over NCCL for device buffers (built only with MESHMOE_CUDA).
// MPI is used only to hand out the NCCL unique id (created on the group's rank 0) and for the
// host-side counts exchange of all_to_allv. Every operation is enqueued on the rank's stream
// (cuda_stream(), the kernels' own, so in order with them: mesh/queued_comm.hpp) and returns at
// once; synchronize() waits.
// NCCL has no variable all-to-all (nor an all-to-all at all): both are grouped ncclSend/ncclRecv.
#pragma once
#ifdef MESHMOE_CUDA
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include "mesh/mpi_comm.hpp"
#include "mesh/queued_comm.hpp"

namespace meshmoe {

// Collective over `world`: cudaSetDevice(node-local rank % device count). Error without a GPU.
void select_local_device(MPI_Comm world);

class NcclComm final : public QueuedComm {
 public:
  // Collective over `group`'s ranks; keeps a reference to `group` (which must outlive this).
  NcclComm(MpiComm& group, std::string label);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void barrier() override;  // drains the stream, then an MPI barrier on the group
  void synchronize() override;
  std::string name() const override;

  // Over the MPI group on the host (counts are host data); the host waits here.
  std::vector<size_t> exchange_counts(std::span<const size_t> send_counts) override;

 protected:
  void queue_all_reduce(void* buf, size_t n, DType t, Op op) override;
  void queue_broadcast(void* buf, size_t n, DType t, int root) override;
  void queue_all_gather(const void* send, size_t n, void* recv, DType t) override;
  void queue_reduce_scatter(const void* send, void* recv, size_t n, DType t, Op op) override;
  // Grouped ncclReduce / ncclBroadcast, one per rank's block (NCCL has no variable-count
  // reduce-scatter or all-gather).
  void queue_reduce_scatterv_in_place(void* buf, const size_t* counts, DType t, Op op) override;
  void queue_all_gatherv_in_place(void* buf, const size_t* counts, DType t) override;
  void queue_all_to_all(const void* send, void* recv, size_t n, DType t) override;
  void queue_all_to_allv(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                         DType t) override;
  void queue_permute(const void* send, size_t n_send, int dest, void* recv, size_t n_recv, int source,
                     DType t) override;
  void queue_send(const void* buf, size_t n, DType t, int dest, int tag) override;
  void queue_recv(void* buf, size_t n, DType t, int source, int tag) override;

 private:
  MpiComm& group_;
  std::string label_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace meshmoe
#endif  // MESHMOE_CUDA
