// Hierarchical sums for a group whose ranks span several nodes (docs/ARCHITECTURE.md
// "Hierarchical collectives"): inside each node through a shared-memory window
// (mesh/shm_collectives.hpp), between nodes through MPI among the ranks of one local index, then
// back inside each node. MpiComm uses it for the large float/double all-reduces of such a group,
// its window for the node-shared weights and gradients (one window per node), and its all-gather
// into the nodes' copies for one copy of the weights per node (optim.shard_state).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "mesh/comm.hpp"
#include "mesh/shm_collectives.hpp"

namespace meshmoe {

class NodeHierarchy {
 public:
  // Collective over `comm`: non-null on every rank when `comm` spans two or more nodes with the
  // same number L >= 2 of its ranks on each and every node's window opens (ShmCollectives::open);
  // nullptr on every rank otherwise. `ranks_per_node` > 0 (tests only) cuts `comm` into nodes of
  // that many consecutive ranks instead of asking MPI which ranks share memory.
  static std::unique_ptr<NodeHierarchy> open(MPI_Comm comm, const std::string& label, size_t slot_bytes,
                                             int ranks_per_node = 0);
  ~NodeHierarchy();
  NodeHierarchy(const NodeHierarchy&) = delete;
  NodeHierarchy& operator=(const NodeHierarchy&) = delete;

  // In place, n elements of F32 or F64: every rank gets sum over nodes k = 0..N-1 (in node order,
  // a node's place being that of its lowest rank in the group) of the node sum, which adds the
  // node's ranks in their group order: (((r0 + r1) + ...) + ((r_L + r_L+1) + ...)) + ... . All
  // ranks hold the same bits. Between nodes it moves 2 (N - 1) / N of the buffer per node (each
  // of the node's L ranks carries 1/L of it), where a flat ring all-reduce of P ranks moves
  // 2 (P - 1) / P of it over every link of the ring that crosses nodes.
  void all_reduce_sum(void* buf, size_t n, DType t, size_t slot_bytes);

  // In place, buf in this node's one copy (ShmCollectives::shared_alloc_one) holding one block per
  // group rank, packed in group-rank order (counts[r] elements of rank r), each rank having
  // written its own block there: afterwards every node's copy holds every block. Between nodes
  // the ranks of one local index all-gather their blocks (MPI_Allgatherv, in chunks of at most
  // slot_bytes for the N blocks' pieces), so node k's rank of local index l brings in the blocks
  // of the other nodes' ranks of index l: each node receives the others' blocks once, its L
  // ranks sharing the transfer. Copies of the sent bits: every node's copy is the same. The node's
  // other ranks see the blocks after the window's shared_fence().
  void all_gather_into_node_copy(void* buf, const size_t* counts, DType t, size_t slot_bytes);

  ShmCollectives& node() { return *node_; }
  int nodes() const { return nodes_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // Payload bytes this rank has sent to ranks of other nodes (all_reduce_sum,
  // all_gather_into_node_copy) so far.
  size_t cross_node_bytes() const { return cross_bytes_; }

 private:
  NodeHierarchy(std::unique_ptr<ShmCollectives> node, MPI_Comm cross, int nodes, int local_rank, int local_size,
                int rank, std::string label);
  void check(int rc, const char* call) const;

  std::unique_ptr<ShmCollectives> node_;  // this node's ranks of the group
  MPI_Comm cross_;                        // the ranks of this local index, one per node, in node order
  int nodes_, local_rank_, local_size_, node_index_;
  std::vector<int> cross_ranks_;  // [nodes]: the group rank of each rank of cross_
  std::string label_;
  std::vector<char> pieces_;  // the N nodes' sums of one chunk of this rank's slice
  size_t cross_bytes_ = 0;
};

}  // namespace meshmoe
