// RoutedComm: one axis group's Comm for a run on a device, over two backends of the same group:
// a call whose buffers are all device memory goes to `device` (NcclComm on a GPU: in place, queued
// on the rank's stream), any with a host buffer to `host` (MpiComm, which stages device memory
// through host copies). Every rank of the group must pick the same backend for a call: the code
// passes host memory where it passes it on every rank (scalars, sums, counts), and null (no data
// on this rank) takes the device's side. Host-side work stays on the host backend: the counts
// exchange of a variable all-to-all, node-shared memory, the waits of non-blocking host transfers.
// Both backends see their calls in the program's order on every rank, so each keeps its
// collectives matched.
#pragma once
#include <string>

#include "mesh/comm.hpp"

namespace meshmoe {

class RoutedComm final : public Comm {
 public:
  // Keeps references to both (which must outlive this); they must span the same group.
  RoutedComm(Comm& host, Comm& device);

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  void barrier() override;  // the device's queued collectives first, then the host's barrier
  void synchronize() override { device_.synchronize(); }
  std::string name() const override { return host_.name() + " + " + device_.name(); }
  void* node_shared_alloc(size_t bytes) override { return host_.node_shared_alloc(bytes); }
  bool hierarchical() const override { return host_.hierarchical(); }
  void* node_shared_alloc_one(size_t bytes) override { return host_.node_shared_alloc_one(bytes); }
  int node_rank() const override { return host_.node_rank(); }
  void node_copy_all_gather_raw(void* buf, const size_t* counts, DType t) override {
    host_.node_copy_all_gather_raw(buf, counts, t);
  }
  void node_shared_free(void* p) override { host_.node_shared_free(p); }
  void node_shared_fence() override { host_.node_shared_fence(); }

  void all_reduce_raw(void* buf, size_t n, DType t, Op op) override;
  void broadcast_raw(void* buf, size_t n, DType t, int root) override;
  void all_gather_raw(const void* send, size_t n, void* recv, DType t) override;
  void reduce_scatter_raw(const void* send, void* recv, size_t n, DType t, Op op) override;
  void reduce_scatterv_in_place_raw(void* buf, const size_t* counts, DType t, Op op) override;
  void all_gatherv_in_place_raw(void* buf, const size_t* counts, DType t) override;
  void all_to_all_raw(const void* send, void* recv, size_t n, DType t) override;
  void all_to_allv_raw(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                       DType t) override;
  void permute_raw(const void* send, size_t n_send, int dest, void* recv, size_t n_recv, int source,
                   DType t) override;
  void send_raw(const void* buf, size_t n, DType t, int dest, int tag) override;
  void recv_raw(void* buf, size_t n, DType t, int source, int tag) override;
  void isend_raw(const void* buf, size_t n, DType t, int dest, int tag) override;
  void wait_sends() override { host_.wait_sends(); }
  void iall_reduce_raw(void* buf, size_t n, DType t, Op op) override;
  bool test_all_reduces() override { return host_.test_all_reduces(); }
  void wait_all_reduces() override { host_.wait_all_reduces(); }
  std::vector<size_t> exchange_counts(std::span<const size_t> send_counts) override {
    return host_.exchange_counts(send_counts);
  }

 private:
  Comm& host_;
  Comm& device_;
  // The backend of a call with these buffers.
  Comm& to(const void* a, const void* b = nullptr);
};

}  // namespace meshmoe
