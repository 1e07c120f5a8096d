// MpiComm: every operation is one MPI call on the group's communicator (blocking, but for isend and
// iall_reduce, which leave requests that wait_sends / test_all_reduces / wait_all_reduces complete),
// except the large float/double sums and variable gathers of a group on one node, which go through
// a shared-memory window (mesh/shm_collectives.hpp).
#include "mesh/mpi_comm.hpp"

#include <climits>
#include <cstring>
#include <utility>

#include "mesh/node_hierarchy.hpp"
#include "mesh/shm_collectives.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

static_assert(sizeof(size_t) == sizeof(uint64_t), "counts travel as MPI_UINT64_T");

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U64: return MPI_UINT64_T;
    case DType::U8: return MPI_UINT8_T;
  }
  throw Error("mpi_type: unknown DType");
}

MPI_Op mpi_op(Op op) {
  switch (op) {
    case Op::Sum: return MPI_SUM;
    case Op::Max: return MPI_MAX;
    case Op::Min: return MPI_MIN;
  }
  throw Error("mpi_op: unknown Op");
}

MpiComm::MpiComm(MPI_Comm comm, std::string label) : comm_(comm), label_(std::move(label)) {
  if (comm_ == MPI_COMM_NULL) throw Error("MpiComm(" + label_ + "): null communicator");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

MpiComm::~MpiComm() { release(); }

MpiComm::MpiComm(MpiComm&& o) noexcept
    : comm_(std::exchange(o.comm_, MPI_COMM_NULL)),
      label_(std::move(o.label_)),
      rank_(o.rank_),
      size_(o.size_),
      shm_settings_(o.shm_settings_),
      shm_state_(std::exchange(o.shm_state_, ShmState::Unknown)),
      shm_(std::move(o.shm_)),
      hierarchy_(std::move(o.hierarchy_)) {}

MpiComm& MpiComm::operator=(MpiComm&& o) noexcept {
  if (this != &o) {
    release();
    comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
    label_ = std::move(o.label_);
    rank_ = o.rank_;
    size_ = o.size_;
    shm_settings_ = o.shm_settings_;
    shm_state_ = std::exchange(o.shm_state_, ShmState::Unknown);
    shm_ = std::move(o.shm_);
    hierarchy_ = std::move(o.hierarchy_);
  }
  return *this;
}

void MpiComm::release() noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  shm_.reset();
  hierarchy_.reset();
  shm_state_ = ShmState::Unknown;
  // MPI_Comm_free after MPI_Finalize is erroneous; by then the library has released everything.
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

std::string MpiComm::name() const { return label_ + " (" + std::to_string(size_) + " ranks)"; }

void MpiComm::check(int rc, const char* call) const {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(name() + ": " + call + " failed: " + std::string(msg, size_t(len)));
}

int MpiComm::count(size_t n, const char* what) const {
  if (n > size_t(INT_MAX))
    throw Error(name() + ": " + what + " of " + std::to_string(n) +
                " elements exceeds the MPI count limit (INT_MAX); split the transfer");
  return int(n);
}

void MpiComm::open_shm() {
  if (shm_state_ != ShmState::Unknown || !shm_settings_.enabled || size_ < 2) return;
  shm_state_ = ShmState::Off;
  if (shm_settings_.test_ranks_per_node <= 0) shm_ = ShmCollectives::open(comm_, name(), shm_settings_.slot_bytes);
  if (shm_) {
    shm_state_ = ShmState::On;
    return;
  }
  hierarchy_ = NodeHierarchy::open(comm_, name(), shm_settings_.slot_bytes, shm_settings_.test_ranks_per_node);
  if (hierarchy_) shm_state_ = ShmState::Hierarchical;
}

bool MpiComm::shm_active() {
  if (!shm_settings_.enabled) return false;
  open_shm();
  return shm_state_ == ShmState::On;
}

NodeHierarchy* MpiComm::hierarchy() {
  if (!shm_settings_.enabled) return nullptr;
  open_shm();
  return shm_state_ == ShmState::Hierarchical ? hierarchy_.get() : nullptr;
}

// The window of this rank's node: the group's when it is on one node, the node's share of it when
// the group spans nodes (hierarchical), else nullptr.
ShmCollectives* MpiComm::node_window() {
  if (!shm_settings_.enabled) return nullptr;
  open_shm();
  return shm_ ? shm_.get() : hierarchy_ ? &hierarchy_->node() : nullptr;
}

ShmCollectives* MpiComm::shm_for(size_t bytes) {
  return bytes >= shm_settings_.min_bytes && shm_active() ? shm_.get() : nullptr;
}

ShmCollectives* MpiComm::shm_sum_for(size_t bytes, DType t, Op op) {
  return op == Op::Sum && (t == DType::F32 || t == DType::F64) ? shm_for(bytes) : nullptr;
}

NodeHierarchy* MpiComm::hierarchical_sum_for(size_t bytes, DType t, Op op) {
  return op == Op::Sum && (t == DType::F32 || t == DType::F64) && bytes >= shm_settings_.min_bytes ? hierarchy()
                                                                                                   : nullptr;
}

// Spanning nodes, every rank's memory is shared with the ranks of its node only (one window per
// node), and the one copy of the weights is one per node: node_copy_all_gather brings the other
// nodes' blocks into it.
void* MpiComm::node_alloc(size_t bytes, bool one_copy) {
  ShmCollectives* w = node_window();
  if (!w) return nullptr;
  void* p = one_copy ? w->shared_alloc_one(bytes) : w->shared_alloc(bytes);
  if (shm_) return p;  // the group's window: every rank has the same answer
  // The hierarchical path is collective over the group too: the nodes agree on their answers.
  int all = p != nullptr;
  check(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce");
  if (!all && p) w->shared_free(p), p = nullptr;
  return p;
}

void* MpiComm::node_shared_alloc(size_t bytes) { return node_alloc(bytes, false); }
void* MpiComm::node_shared_alloc_one(size_t bytes) { return node_alloc(bytes, true); }

int MpiComm::node_rank() const { return hierarchy_ ? hierarchy_->local_rank() : rank_; }

void MpiComm::node_copy_all_gather_raw(void* buf, const size_t* counts, DType t) {
  if (!hierarchy_) return;  // on one node the one copy is the group's
  hierarchy_->all_gather_into_node_copy(buf, counts, t, shm_settings_.slot_bytes);
}

void MpiComm::node_shared_free(void* p) {
  if (!p) return;
  if (shm_) shm_->shared_free(p);
  else if (hierarchy_) hierarchy_->node().shared_free(p);
}

void MpiComm::node_shared_fence() {
  if (shm_active()) return shm_->shared_fence();
  if (hierarchy_) hierarchy_->node().shared_fence();
  barrier();
}

void MpiComm::barrier() { check(MPI_Barrier(comm_), "MPI_Barrier"); }

// MPI reads and writes the buffers from the host (tensor/device.hpp, transfer points), device
// memory through host copies (HostStaged: what MPI reads is copied to the host first, a copy that
// waits for the queued work; what it writes is copied back after, queued in order with it). A
// host buffer needs no wait: device work never writes host memory, so MPI on the host's values
// (the step's sums, the stop decision, the log's timings) lets the device run on.
void MpiComm::all_reduce_raw(void* buf_in, size_t n, DType t, Op op) {
  const int c = count(n, "all_reduce");  // the same limits on both paths
  HostStaged staged(buf_in, n * dtype_size(t), /*read=*/true);
  void* buf = staged.host();
  if (ShmCollectives* shm = shm_sum_for(n * dtype_size(t), t, op)) {
    // Blocks of n / size elements (the first n % size one longer): every rank sums one.
    std::vector<size_t> counts(static_cast<size_t>(size_));
    for (size_t r = 0; r < counts.size(); ++r) counts[r] = n / counts.size() + (r < n % counts.size() ? 1 : 0);
    shm->run(buf, counts.data(), t, /*reduce=*/true, /*gather=*/true, shm_settings_.slot_bytes);
  } else if (NodeHierarchy* h = hierarchical_sum_for(n * dtype_size(t), t, op)) {
    h->all_reduce_sum(buf, n, t, shm_settings_.slot_bytes);
  } else {
    check(MPI_Allreduce(MPI_IN_PLACE, buf, c, mpi_type(t), mpi_op(op), comm_), "MPI_Allreduce");
  }
  staged.write_back();
}

void MpiComm::broadcast_raw(void* buf, size_t n, DType t, int root) {
  check_rank(root, "broadcast root");
  HostStaged staged(buf, n * dtype_size(t), /*read=*/rank_ == root);
  check(MPI_Bcast(staged.host(), count(n, "broadcast"), mpi_type(t), root, comm_), "MPI_Bcast");
  staged.write_back();
}

void MpiComm::all_gather_raw(const void* send, size_t n, void* recv, DType t) {
  count(n * size_t(size_), "all_gather result");
  const int c = count(n, "all_gather");
  HostStaged in(send, n * dtype_size(t), true), out(recv, n * size_t(size_) * dtype_size(t), false);
  check(MPI_Allgather(in.host(), c, mpi_type(t), out.host(), c, mpi_type(t), comm_), "MPI_Allgather");
  out.write_back();
}

void MpiComm::reduce_scatter_raw(const void* send, void* recv, size_t n, DType t, Op op) {
  count(n * size_t(size_), "reduce_scatter input");
  HostStaged in(send, n * size_t(size_) * dtype_size(t), true), out(recv, n * dtype_size(t), false);
  check(MPI_Reduce_scatter_block(in.host(), out.host(), count(n, "reduce_scatter"), mpi_type(t), mpi_op(op), comm_),
        "MPI_Reduce_scatter_block");
  out.write_back();
}

void MpiComm::counts_and_displs(const size_t* counts, const char* what, std::vector<int>& c,
                                std::vector<int>& d) const {
  c.resize(size_t(size_));
  d.resize(size_t(size_));
  size_t off = 0;
  for (size_t r = 0; r < size_t(size_); ++r) {
    c[r] = count(counts[r], what);
    d[r] = count(off, what);
    off += counts[r];
  }
  count(off, what);
}

size_t MpiComm::total_bytes(const size_t* counts, DType t) const {
  size_t total = 0;
  for (size_t r = 0; r < size_t(size_); ++r) total += counts[r];
  return total * dtype_size(t);
}

void MpiComm::reduce_scatterv_in_place_raw(void* buf_in, const size_t* counts, DType t, Op op) {
  std::vector<int> c, d;
  counts_and_displs(counts, "reduce_scatterv", c, d);  // the same limits on both paths
  HostStaged staged(buf_in, total_bytes(counts, t), /*read=*/true);
  void* buf = staged.host();
  if (ShmCollectives* shm = shm_sum_for(total_bytes(counts, t), t, op)) {
    shm->run(buf, counts, t, /*reduce=*/true, /*gather=*/false, shm_settings_.slot_bytes);
  } else {
    // In place, MPI leaves this rank's reduced block at the start of buf: move it to its own place.
    check(MPI_Reduce_scatter(MPI_IN_PLACE, buf, c.data(), mpi_type(t), mpi_op(op), comm_), "MPI_Reduce_scatter");
    char* base = static_cast<char*>(buf);
    const size_t mine = size_t(d[size_t(rank_)]) * dtype_size(t);
    if (mine > 0) std::memmove(base + mine, base, counts[rank_] * dtype_size(t));
  }
  staged.write_back();
}

void MpiComm::all_gatherv_in_place_raw(void* buf_in, const size_t* counts, DType t) {
  std::vector<int> c, d;
  counts_and_displs(counts, "all_gatherv", c, d);
  HostStaged staged(buf_in, total_bytes(counts, t), /*read=*/true);
  void* buf = staged.host();
  if (ShmCollectives* shm = shm_for(total_bytes(counts, t))) {
    shm->run(buf, counts, t, /*reduce=*/false, /*gather=*/true, shm_settings_.slot_bytes);
  } else {
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c.data(), d.data(), mpi_type(t), comm_),
          "MPI_Allgatherv");
  }
  staged.write_back();
}

void MpiComm::all_to_all_raw(const void* send, void* recv, size_t n, DType t) {
  count(n * size_t(size_), "all_to_all buffer");
  const int c = count(n, "all_to_all");
  const size_t bytes = n * size_t(size_) * dtype_size(t);
  HostStaged in(send, bytes, true), out(recv, bytes, false);
  check(MPI_Alltoall(in.host(), c, mpi_type(t), out.host(), c, mpi_type(t), comm_), "MPI_Alltoall");
  out.write_back();
}

void MpiComm::all_to_allv_raw(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                              DType t) {
  // Displacements are prefix sums of the counts; both must fit MPI's int.
  const size_t p = static_cast<size_t>(size_);
  std::vector<int> sc(p), sd(p), rc(p), rd(p);
  size_t s_off = 0, r_off = 0;
  for (size_t i = 0; i < p; ++i) {
    sc[i] = count(send_counts[i], "all_to_allv send count");
    rc[i] = count(recv_counts[i], "all_to_allv receive count");
    sd[i] = count(s_off, "all_to_allv send displacement");
    rd[i] = count(r_off, "all_to_allv receive displacement");
    s_off += send_counts[i];
    r_off += recv_counts[i];
  }
  count(s_off, "all_to_allv send total");
  count(r_off, "all_to_allv receive total");
  HostStaged in(send, s_off * dtype_size(t), true), out(recv, r_off * dtype_size(t), false);
  check(MPI_Alltoallv(in.host(), sc.data(), sd.data(), mpi_type(t), out.host(), rc.data(), rd.data(), mpi_type(t),
                      comm_),
        "MPI_Alltoallv");
  out.write_back();
}

// Device memory: the host copy lives until the reduction completes, then goes back (finish_reduces).
void MpiComm::iall_reduce_raw(void* buf, size_t n, DType t, Op op) {
  const int c = count(n, "iall_reduce");
  staged_reduces_.emplace_back(buf, n * dtype_size(t), /*read=*/true);
  MPI_Request r;
  check(MPI_Iallreduce(MPI_IN_PLACE, staged_reduces_.back().host(), c, mpi_type(t), mpi_op(op), comm_, &r),
        "MPI_Iallreduce");
  pending_reduces_.push_back(r);
}

void MpiComm::finish_reduces() {
  pending_reduces_.clear();
  for (HostStaged& s : staged_reduces_) s.write_back();
  staged_reduces_.clear();
}

bool MpiComm::test_all_reduces() {
  if (pending_reduces_.empty()) return true;
  int done = 0;
  check(MPI_Testall(int(pending_reduces_.size()), pending_reduces_.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
  if (done) finish_reduces();
  return done != 0;
}

void MpiComm::wait_all_reduces() {
  if (pending_reduces_.empty()) return;
  check(MPI_Waitall(int(pending_reduces_.size()), pending_reduces_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  finish_reduces();
}

std::vector<size_t> MpiComm::exchange_counts(std::span<const size_t> send_counts) {
  check_counts(send_counts, "all_to_allv send_counts");
  std::vector<size_t> recv_counts(static_cast<size_t>(size_));
  // Blocking: the host waits here for every peer's counts (the named wait point, comm.hpp).
  check(MPI_Alltoall(send_counts.data(), 1, MPI_UINT64_T, recv_counts.data(), 1, MPI_UINT64_T, comm_),
        "MPI_Alltoall (counts)");
  return recv_counts;
}

void MpiComm::permute_raw(const void* send, size_t n_send, int dest, void* recv, size_t n_recv, int source,
                          DType t) {
  check_rank(dest, "permute destination", /*allow_none=*/true);
  check_rank(source, "permute source", /*allow_none=*/true);
  const int d = dest == kNoRank ? MPI_PROC_NULL : dest, s = source == kNoRank ? MPI_PROC_NULL : source;
  constexpr int kPermuteTag = 7001;
  MPI_Status st;
  HostStaged in(send, d == MPI_PROC_NULL ? 0 : n_send * dtype_size(t), true);
  HostStaged out(recv, s == MPI_PROC_NULL ? 0 : n_recv * dtype_size(t), false);
  check(MPI_Sendrecv(in.host(), count(n_send, "permute send"), mpi_type(t), d, kPermuteTag, out.host(),
                     count(n_recv, "permute receive"), mpi_type(t), s, kPermuteTag, comm_, &st),
        "MPI_Sendrecv");
  out.write_back();
  if (s != MPI_PROC_NULL) {
    int got = 0;
    MPI_Get_count(&st, mpi_type(t), &got);
    if (size_t(got) != n_recv)
      throw Error(name() + ": permute expected " + std::to_string(n_recv) + " elements from rank " +
                  std::to_string(source) + " but got " + std::to_string(got));
  }
}

void MpiComm::send_raw(const void* buf, size_t n, DType t, int dest, int tag) {
  check_rank(dest, "send destination");
  HostStaged in(buf, n * dtype_size(t), true);
  check(MPI_Send(in.host(), count(n, "send"), mpi_type(t), dest, tag, comm_), "MPI_Send");
}

void MpiComm::recv_raw(void* buf, size_t n, DType t, int source, int tag) {
  check_rank(source, "receive source");
  MPI_Status st;
  HostStaged out(buf, n * dtype_size(t), false);
  check(MPI_Recv(out.host(), count(n, "recv"), mpi_type(t), source, tag, comm_, &st), "MPI_Recv");
  out.write_back();
  int got = 0;
  MPI_Get_count(&st, mpi_type(t), &got);
  if (size_t(got) != n)
    throw Error(name() + ": recv expected " + std::to_string(n) + " elements from rank " + std::to_string(source) +
                " (tag " + std::to_string(tag) + ") but got " + std::to_string(got));
}

void MpiComm::isend_raw(const void* buf, size_t n, DType t, int dest, int tag) {
  check_rank(dest, "send destination");
  const int c = count(n, "isend");
  staged_sends_.emplace_back(buf, n * dtype_size(t), /*read=*/true);  // lives until wait_sends
  MPI_Request r;
  check(MPI_Isend(staged_sends_.back().host(), c, mpi_type(t), dest, tag, comm_, &r), "MPI_Isend");
  pending_sends_.push_back(r);
}

void MpiComm::wait_sends() {
  if (pending_sends_.empty()) return;
  check(MPI_Waitall(int(pending_sends_.size()), pending_sends_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  pending_sends_.clear();
  staged_sends_.clear();
}

}  // namespace meshmoe
