// MpiComm: Comm over an MPI communicator, for host buffers.
#pragma once
#include <mpi.h>

#include <deque>
#include <memory>

#include "mesh/comm.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

class ShmCollectives;
class NodeHierarchy;

// When the group lives on one node, large float/double sums (all_reduce, reduce_scatterv) and
// the variable gathers go through a shared-memory window (mesh/shm_collectives.hpp) instead of
// MPI's collectives; the sums then add in rank order. When it spans nodes with L >= 2 of its
// ranks on each, the large float/double all-reduces are hierarchical (mesh/node_hierarchy.hpp)
// and the node-shared memory is one window per node (one copy of the weights per node, whose
// owners' blocks node_copy_all_gather brings from the other nodes). Every rank of a group must hold the same
// settings (run.shm_collectives; tests lower the sizes to cross the rounds with small buffers).
struct ShmSettings {
  bool enabled = true;
  size_t min_bytes = size_t(256) << 10;   // smaller buffers keep MPI (latency, not bandwidth)
  size_t slot_bytes = size_t(64) << 20;   // per rank: larger buffers move in rounds of this
  int test_ranks_per_node = 0;            // tests only: nodes of this many consecutive ranks
};

MPI_Datatype mpi_type(DType t);
MPI_Op mpi_op(Op op);

class MpiComm final : public Comm {
 public:
  // Takes ownership of `comm` (freed in the destructor) and sets MPI_ERRORS_RETURN on it, so MPI
  // failures become meshmoe::Error. `label` names the group in messages ("data axis").
  MpiComm(MPI_Comm comm, std::string label);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  MpiComm(MpiComm&& o) noexcept;
  MpiComm& operator=(MpiComm&& o) noexcept;

  MPI_Comm mpi() const { return comm_; }

  void set_shm(const ShmSettings& s) { shm_settings_ = s; }
  // Collective on the first call: true when the shared-memory path is enabled and the group is
  // on one node (then buffers of at least min_bytes take it).
  bool shm_active();
  // Collective on the first call: the hierarchical path when the shared-memory path is enabled
  // and the group spans nodes with the same number (>= 2) of its ranks on each; else nullptr.
  NodeHierarchy* hierarchy();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override;
  std::string name() const override;
  // Through the shared-memory window group (nullptr when run.shm_collectives is off).
  void* node_shared_alloc(size_t bytes) override;
  bool hierarchical() const override { return shm_state_ == ShmState::Hierarchical; }
  void* node_shared_alloc_one(size_t bytes) override;
  int node_rank() const override;
  void node_copy_all_gather_raw(void* buf, const size_t* counts, DType t) override;
  void node_shared_free(void* p) override;
  void node_shared_fence() override;

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
  void wait_sends() override;
  void iall_reduce_raw(void* buf, size_t n, DType t, Op op) override;
  bool test_all_reduces() override;
  void wait_all_reduces() override;
  std::vector<size_t> exchange_counts(std::span<const size_t> send_counts) override;

 private:
  void check(int rc, const char* call) const;
  int count(size_t n, const char* what) const;  // size_t -> MPI int count, Error above INT_MAX
  // counts [size] -> MPI int counts and their prefix sums (displacements), checked like count().
  void counts_and_displs(const size_t* counts, const char* what, std::vector<int>& c, std::vector<int>& d) const;
  void release() noexcept;
  // The shared-memory path for `bytes` of buffer, or nullptr (MPI): the same answer on every rank.
  ShmCollectives* shm_for(size_t bytes);
  // The same for a reduction: the window only sums, and only float and double.
  ShmCollectives* shm_sum_for(size_t bytes, DType t, Op op);
  // The hierarchical path for an all-reduce of `bytes` (a group spanning nodes), or nullptr.
  NodeHierarchy* hierarchical_sum_for(size_t bytes, DType t, Op op);
  ShmCollectives* node_window();
  // node_shared_alloc (one_copy false) and node_shared_alloc_one (true), agreed by every rank.
  void* node_alloc(size_t bytes, bool one_copy);
  size_t total_bytes(const size_t* counts, DType t) const;  // of the blocks of a variable collective

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<MPI_Request> pending_sends_;
  std::vector<MPI_Request> pending_reduces_;
  // Host copies of device memory under the pending operations (std::deque: an element never moves).
  std::deque<HostStaged> staged_sends_, staged_reduces_;
  void finish_reduces();  // the pending reductions are complete: copies back, lists cleared
  std::string label_;
  int rank_ = 0, size_ = 0;
  ShmSettings shm_settings_;
  enum class ShmState { Unknown, On, Hierarchical, Off } shm_state_ = ShmState::Unknown;
  void open_shm();  // collective: decides shm_state_
  std::unique_ptr<ShmCollectives> shm_;
  std::unique_ptr<NodeHierarchy> hierarchy_;
};

}  // namespace meshmoe
