// NodeHierarchy: an all-reduce as a reduce-scatter inside each node (the window's rank-order sum),
// a deterministic all-reduce of each rank's slice among the ranks of its local index on the
// other nodes (MPI_Alltoallv of the pieces, a sum in node order, MPI_Allgatherv), and an
// all-gather inside each node; and the all-gather of the owners' blocks into each node's one copy
// of the weights. docs/ARCHITECTURE.md "Hierarchical collectives".
#include "mesh/node_hierarchy.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <exception>
#include <utility>

#include "mesh/mpi_comm.hpp"
#include "mesh/rank_order_sum.hpp"

namespace meshmoe {

namespace {

// n elements cut into `parts` near-equal blocks, the first n % parts one longer.
std::vector<size_t> near_equal(size_t n, size_t parts) {
  std::vector<size_t> c(parts);
  for (size_t r = 0; r < parts; ++r) c[r] = n / parts + (r < n % parts ? 1 : 0);
  return c;
}

}  // namespace

std::unique_ptr<NodeHierarchy> NodeHierarchy::open(MPI_Comm comm, const std::string& label, size_t slot_bytes,
                                                   int ranks_per_node) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Comm node = MPI_COMM_NULL;
  // key = rank: a node's ranks keep their group order.
  const int rc = ranks_per_node > 0 ? MPI_Comm_split(comm, rank / ranks_per_node, rank, &node)
                                    : MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  if (rc != MPI_SUCCESS) throw Error(label + ": splitting the group by node failed");
  int local_rank = 0, local_size = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  // Every node the same L, and more than one node: else the caller keeps MPI (or the one-node window).
  int sizes[2] = {local_size, -local_size};
  MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, comm);
  if (sizes[0] != -sizes[1] || local_size < 2 || local_size == size) {
    MPI_Comm_free(&node);
    return nullptr;
  }
  // The node's place: its lowest group rank (its local rank 0, as key = rank).
  int leader = rank;
  MPI_Bcast(&leader, 1, MPI_INT, 0, node);
  MPI_Comm cross = MPI_COMM_NULL;
  if (MPI_Comm_split(comm, local_rank, leader, &cross) != MPI_SUCCESS) {
    MPI_Comm_free(&node);
    throw Error(label + ": splitting the group across nodes failed");
  }
  std::unique_ptr<ShmCollectives> window = ShmCollectives::open(node, label + " (node)", slot_bytes);
  MPI_Comm_free(&node);  // the window keeps its own communicator
  // A node without room for its window: MPI everywhere, so that every rank takes one path.
  int all_open = window != nullptr;
  MPI_Allreduce(MPI_IN_PLACE, &all_open, 1, MPI_INT, MPI_MIN, comm);
  if (!all_open) {
    window.reset();
    MPI_Comm_free(&cross);
    return nullptr;
  }
  int node_index = 0;
  MPI_Comm_rank(cross, &node_index);
  return std::unique_ptr<NodeHierarchy>(
      new NodeHierarchy(std::move(window), cross, size / local_size, local_rank, local_size, rank, label));
}

NodeHierarchy::NodeHierarchy(std::unique_ptr<ShmCollectives> node, MPI_Comm cross, int nodes, int local_rank,
                             int local_size, int rank, std::string label)
    : node_(std::move(node)),
      cross_(cross),
      nodes_(nodes),
      local_rank_(local_rank),
      local_size_(local_size),
      label_(std::move(label)) {
  MPI_Comm_set_errhandler(cross_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(cross_, &node_index_);
  cross_ranks_.resize(size_t(nodes_));
  check(MPI_Allgather(&rank, 1, MPI_INT, cross_ranks_.data(), 1, MPI_INT, cross_), "MPI_Allgather");
}

NodeHierarchy::~NodeHierarchy() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  node_.reset();
  if (!finalized && std::uncaught_exceptions() == 0) MPI_Comm_free(&cross_);
}

void NodeHierarchy::check(int rc, const char* call) const {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(label_ + ": hierarchical collectives: " + call + " failed: " + std::string(msg, size_t(len)) +
              " (run.shm_collectives = false uses MPI's collectives instead)");
}

void NodeHierarchy::all_reduce_sum(void* buf, size_t n, DType t, size_t slot_bytes) {
  if (t != DType::F32 && t != DType::F64) throw std::logic_error("NodeHierarchy: sums of float and double only");
  const size_t elem = dtype_size(t), N = size_t(nodes_);
  // 1. Inside the node: local rank l gets the node's sum of slice l.
  const std::vector<size_t> slices = near_equal(n, size_t(local_size_));
  node_->run(buf, slices.data(), t, /*reduce=*/true, /*gather=*/false, slot_bytes);
  // 2. Between nodes, slice l among the ranks of local index l, in chunks whose N pieces fit the
  //    window's size: piece k of a chunk is summed by node k over the nodes in node order, then
  //    every node gets every piece.
  size_t slice_begin = 0;
  for (int l = 0; l < local_rank_; ++l) slice_begin += slices[size_t(l)];
  char* slice = static_cast<char*>(buf) + slice_begin * elem;
  const size_t slice_len = slices[size_t(local_rank_)];
  const size_t chunk = std::clamp(slot_bytes / elem, N, size_t(INT_MAX) / 2);
  const MPI_Datatype type = t == DType::F32 ? MPI_FLOAT : MPI_DOUBLE;
  std::vector<int> counts(N), displs(N), mine_counts(N), mine_displs(N);
  for (size_t begin = 0; begin < slice_len; begin += chunk) {
    const size_t len = std::min(chunk, slice_len - begin);
    const std::vector<size_t> pieces = near_equal(len, N);
    for (size_t k = 0, off = 0; k < N; off += pieces[k], ++k) counts[k] = int(pieces[k]), displs[k] = int(off);
    const size_t me = size_t(node_index_), mine = pieces[me];
    for (size_t k = 0; k < N; ++k) mine_counts[k] = int(mine), mine_displs[k] = int(k * mine);
    char* at = slice + begin * elem;
    if (pieces_.size() < N * mine * elem) pieces_.resize(N * mine * elem);
    check(MPI_Alltoallv(at, counts.data(), displs.data(), type, pieces_.data(), mine_counts.data(),
                        mine_displs.data(), type, cross_),
          "MPI_Alltoallv");
    if (mine > 0) {
      auto sum = [&](auto zero) {
        using T = decltype(zero);
        std::vector<const T*> ops(N);
        for (size_t k = 0; k < N; ++k) ops[k] = reinterpret_cast<const T*>(pieces_.data()) + k * mine;
        sum_in_rank_order(reinterpret_cast<T*>(at) + displs[me], ops, mine);
      };
      if (t == DType::F32) sum(0.0f);
      else sum(0.0);
    }
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, at, counts.data(), displs.data(), type, cross_),
          "MPI_Allgatherv");
    cross_bytes_ += ((len - mine) + (N - 1) * mine) * elem;
  }
  // 3. Inside the node: every rank gets every slice.
  node_->run(buf, slices.data(), t, /*reduce=*/false, /*gather=*/true, slot_bytes);
}

void NodeHierarchy::all_gather_into_node_copy(void* buf, const size_t* counts, DType t, size_t slot_bytes) {
  const size_t elem = dtype_size(t), N = size_t(nodes_), me = size_t(node_index_);
  // Where each cross rank's block starts in buf, and its length.
  std::vector<size_t> begin(N), len(N);
  size_t longest = 0;
  for (size_t k = 0; k < N; ++k) {
    const size_t g = size_t(cross_ranks_[k]);
    for (size_t r = 0; r < g; ++r) begin[k] += counts[r];
    len[k] = counts[g], longest = std::max(longest, len[k]);
  }
  // Rounds of at most `chunk` elements of each block, received side by side into pieces_.
  const size_t chunk = std::clamp(slot_bytes / (N * elem), size_t(1), size_t(INT_MAX) / N);
  if (pieces_.size() < N * std::min(chunk, longest) * elem) pieces_.resize(N * std::min(chunk, longest) * elem);
  char* base = static_cast<char*>(buf);
  const MPI_Datatype type = mpi_type(t);
  std::vector<int> piece(N), displs(N);
  for (size_t k = 0; k < N; ++k) displs[k] = int(k * std::min(chunk, longest));
  for (size_t at = 0; at < longest; at += chunk) {
    for (size_t k = 0; k < N; ++k) piece[k] = int(len[k] > at ? std::min(chunk, len[k] - at) : 0);
    check(MPI_Allgatherv(base + (begin[me] + at) * elem, piece[me], type, pieces_.data(), piece.data(),
                         displs.data(), type, cross_),
          "MPI_Allgatherv");
    for (size_t k = 0; k < N; ++k)
      if (k != me && piece[k] > 0)
        std::memcpy(base + (begin[k] + at) * elem, pieces_.data() + size_t(displs[k]) * elem, size_t(piece[k]) * elem);
    cross_bytes_ += (N - 1) * size_t(piece[me]) * elem;
  }
}

}  // namespace meshmoe
