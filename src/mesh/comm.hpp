// Comm: the one way code talks to other ranks (DESIGN principle 3). A Comm is bound to one group of
// ranks (one mesh axis group, or the world); reading `mesh.axis(Axis::Data).all_reduce(...)` tells
// you what crosses the wire and between whom.
//
// Backends: MpiComm (host buffers, mpi_comm.hpp) and NcclComm (device buffers, nccl_comm.hpp).
// Both implement the small type-erased core below; the typed templates at the end of the class are
// what layers call. Element counts are per-rank element counts, never bytes.
//
// Every operation is collective over the group except send/recv. All ranks must call collectives
// in the same order with matching counts. Ranks in calls are group ranks (0..size()-1), not world
// ranks. For GShard's vocabulary (section 3.2): AllReduce, AllGather, AllToAll, CollectivePermute
// map to all_reduce, all_gather, all_to_all(v), permute.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.hpp"

namespace meshmoe {

enum class Op { Sum, Max, Min };

// Element types a Comm moves. U8 also carries raw bytes (char, std::byte).
enum class DType { F32, F64, I32, I64, U64, U8 };

size_t dtype_size(DType t);

template <class T>
constexpr DType dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return DType::F32;
  else if constexpr (std::is_same_v<U, double>) return DType::F64;
  else if constexpr (std::is_same_v<U, int32_t>) return DType::I32;
  else if constexpr (std::is_same_v<U, int64_t>) return DType::I64;
  else if constexpr (std::is_same_v<U, uint64_t>) return DType::U64;
  else if constexpr (std::is_same_v<U, uint8_t> || std::is_same_v<U, char> || std::is_same_v<U, std::byte>)
    return DType::U8;
  else static_assert(sizeof(T) == 0, "Comm: unsupported element type");
}

// Rank root's string on every rank, as two broadcasts: its size, then its bytes. `bcast(p, n)`
// broadcasts the n bytes at p from the root. Comm::broadcast_string uses it, and so does the
// MPI_Comm form in mesh/agree.hpp, for groups that exist before the mesh does.
template <class BroadcastBytes>
std::string broadcast_sized(std::string s, BroadcastBytes&& bcast) {
  uint64_t n = s.size();
  bcast(&n, sizeof n);
  s.resize(size_t(n));
  if (n > 0) bcast(s.data(), s.size());
  return s;
}

// Sentinel rank for permute(): "no partner" (the ends of a pipeline). No data moves on that side.
inline constexpr int kNoRank = -1;

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void barrier() = 0;
  // True when buffers live in device memory (NCCL); host-only conveniences refuse then.
  virtual bool device_memory() const { return false; }
  // Waits until every operation issued on this Comm has completed (no-op for MPI, which is
  // synchronous; a stream synchronize for NCCL).
  virtual void synchronize() {}
  // A short label for errors and logs, e.g. "data axis (2 ranks)".
  virtual std::string name() const = 0;
  // Collective: `bytes` of zeroed host memory of this rank that the collectives of this group read
  // from and write to directly when a buffer lies in it on every rank (MpiComm on one node:
  // mesh/shm_collectives.hpp; spanning nodes, shared with the ranks of this node only:
  // mesh/node_hierarchy.hpp), or nullptr on every rank (the default; no room). Lives as long as
  // the Comm.
  virtual void* node_shared_alloc(size_t /*bytes*/) { return nullptr; }
  // Whether the large sums are hierarchical (the group spans nodes; known once node_shared_alloc
  // or a large all_reduce has run).
  virtual bool hierarchical() const { return false; }
  // Collective: one `bytes` of zeroed host memory for the ranks of each node of the group (the
  // whole group's when it is on one node), the same memory on every rank of a node (the node's
  // first rank's; each process's own address), which the collectives do not read in place;
  // nullptr on every rank as node_shared_alloc.
  virtual void* node_shared_alloc_one(size_t /*bytes*/) { return nullptr; }
  // This rank's place among the ranks of the group whose node-shared memory it shares (its node,
  // in group order): the group rank where the group is on one node (the default).
  virtual int node_rank() const { return rank(); }
  // Collective, over memory from node_shared_alloc_one that holds one block per rank, packed in
  // rank order (counts[r] elements of rank r), after each rank wrote its own block into its
  // node's copy: the blocks of the ranks on other nodes come into this node's copy (MpiComm
  // spanning nodes: mesh/node_hierarchy.hpp); nothing where the group's one copy is everyone's
  // (the default). The node's other ranks read what came after node_shared_fence().
  virtual void node_copy_all_gather_raw(void* /*buf*/, const size_t* /*counts*/, DType /*t*/) {}
  // Collective: returns memory from node_shared_alloc or node_shared_alloc_one (skipped while an
  // exception unwinds, when a collective could hang: then the Comm's end frees it).
  virtual void node_shared_free(void* /*p*/) {}
  // Collective: what each rank wrote to its node-shared memory before the call, every rank reads
  // after it (a barrier with the memory made visible). A barrier where there is none.
  virtual void node_shared_fence() { barrier(); }

  // ---- type-erased core ----------------------------------------------------------------------
  virtual void all_reduce_raw(void* buf, size_t n, DType t, Op op) = 0;
  virtual void broadcast_raw(void* buf, size_t n, DType t, int root) = 0;
  // send [n] -> recv [size*n], block r from rank r.
  virtual void all_gather_raw(const void* send, size_t n, void* recv, DType t) = 0;
  // send [size*n] -> recv [n]: rank r gets block r reduced over all ranks.
  virtual void reduce_scatter_raw(const void* send, void* recv, size_t n, DType t, Op op) = 0;
  // Variable blocks in place: buf holds one block per rank, packed in rank order (counts[r]
  // elements for rank r). reduce_scatterv: afterwards rank r's own block holds the reduction over
  // all ranks of their block r; the other blocks are undefined. all_gatherv: rank r's block
  // goes to every rank, which then holds all the blocks. A backend without them throws (the
  // default). Used by the sharded optimizer state (src/parallel/gradient_sync.hpp).
  virtual void reduce_scatterv_in_place_raw(void* buf, const size_t* counts, DType t, Op op);
  virtual void all_gatherv_in_place_raw(void* buf, const size_t* counts, DType t);
  // send [size*n] -> recv [size*n]: block j of send goes to rank j, block i of recv came from rank i.
  virtual void all_to_all_raw(const void* send, void* recv, size_t n, DType t) = 0;
  // Variable blocks, packed in rank order (displacements are prefix sums of the counts).
  // send_counts[j] elements go to rank j; recv_counts[i] elements arrive from rank i.
  virtual void all_to_allv_raw(const void* send, const size_t* send_counts, void* recv,
                               const size_t* recv_counts, DType t) = 0;
  // Each rank sends n_send elements to `dest` and receives n_recv elements from `source`
  // (kNoRank: skip that side). Every rank of the group must call it.
  virtual void permute_raw(const void* send, size_t n_send, int dest, void* recv, size_t n_recv, int source,
                           DType t) = 0;
  // Point-to-point (not collective). Messages between one pair of ranks match in order of `tag`
  // (MPI) or in issue order (NCCL, which ignores tags).
  virtual void send_raw(const void* buf, size_t n, DType t, int dest, int tag) = 0;
  virtual void recv_raw(void* buf, size_t n, DType t, int source, int tag) = 0;
  // A send that returns at once; `buf` must stay untouched until wait_sends() returns. Pipeline
  // schedules use it so that two neighbours can each send before they receive (1F1B) without a
  // deadlock. The default (NCCL, whose sends are already asynchronous to the host) sends now.
  virtual void isend_raw(const void* buf, size_t n, DType t, int dest, int tag) { send_raw(buf, n, t, dest, tag); }
  // Waits for every isend of this Comm to complete.
  virtual void wait_sends() {}
  // A non-blocking all-reduce in place: returns at once; `buf` must stay untouched until
  // wait_all_reduces() returns or test_all_reduces() returned true. Blocking and non-blocking
  // collectives keep one order on every rank of the group (MPI 3.1 section 5.12). The default
  // (NCCL, whose collectives are already asynchronous to the host on the comm's stream) reduces now.
  virtual void iall_reduce_raw(void* buf, size_t n, DType t, Op op) { all_reduce_raw(buf, n, t, op); }
  // Lets the pending non-blocking all-reduces progress (Open MPI moves them only inside MPI calls)
  // and returns true when all of them have completed.
  virtual bool test_all_reduces() { return true; }
  // Waits for every pending non-blocking all-reduce of this Comm to complete.
  virtual void wait_all_reduces() {}

  // Counts exchange before a variable all-to-all: given what this rank sends to each rank
  // ([size] host array), returns what it receives from each rank. Always on the host.
  // THIS IS THE HOST WAIT POINT of a variable all-to-all (as Megatron-Core's token dispatcher: counts before data, one named wait): the host
  // cannot size or launch the data exchange until every peer's counts have arrived.
  virtual std::vector<size_t> exchange_counts(std::span<const size_t> send_counts) = 0;

  // ---- typed API -----------------------------------------------------------------------------
  template <class T>
  void all_reduce(T* buf, size_t n, Op op = Op::Sum) {
    all_reduce_raw(buf, n, dtype_of<T>(), op);
  }
  template <class T>
  void iall_reduce(T* buf, size_t n, Op op = Op::Sum) {
    iall_reduce_raw(buf, n, dtype_of<T>(), op);
  }
  template <class T>
  void broadcast(T* buf, size_t n, int root) {
    broadcast_raw(buf, n, dtype_of<T>(), root);
  }
  // Host buffers only: rank `root`'s string on every rank.
  std::string broadcast_string(std::string s, int root);
  template <class T>
  void all_gather(const T* send, size_t n, T* recv) {
    all_gather_raw(send, n, recv, dtype_of<T>());
  }
  template <class T>
  void reduce_scatterv_in_place(T* buf, std::span<const size_t> counts, Op op = Op::Sum) {
    check_counts(counts, "reduce_scatterv counts");
    reduce_scatterv_in_place_raw(buf, counts.data(), dtype_of<T>(), op);
  }
  template <class T>
  void all_gatherv_in_place(T* buf, std::span<const size_t> counts) {
    check_counts(counts, "all_gatherv counts");
    all_gatherv_in_place_raw(buf, counts.data(), dtype_of<T>());
  }
  template <class T>
  void node_copy_all_gather(T* buf, std::span<const size_t> counts) {
    check_counts(counts, "node_copy_all_gather counts");
    node_copy_all_gather_raw(buf, counts.data(), dtype_of<T>());
  }
  template <class T>
  void all_to_all(const T* send, T* recv, size_t n_per_rank) {
    all_to_all_raw(send, recv, n_per_rank, dtype_of<T>());
  }
  // Counts known on both sides (e.g. from an earlier exchange_counts).
  template <class T>
  void all_to_allv(const T* send, std::span<const size_t> send_counts, T* recv, std::span<const size_t> recv_counts) {
    check_counts(send_counts, "all_to_allv send_counts");
    check_counts(recv_counts, "all_to_allv recv_counts");
    all_to_allv_raw(send, send_counts.data(), recv, recv_counts.data(), dtype_of<T>());
  }
  // Only send counts known: exchanges counts first (host wait), then the data into `recv`, which
  // must hold recv_capacity elements. Returns the receive counts. Throws Error (one rank alone:
  // main() aborts the job) when the data would not fit.
  template <class T>
  std::vector<size_t> all_to_allv(const T* send, std::span<const size_t> send_counts, T* recv, size_t recv_capacity) {
    check_counts(send_counts, "all_to_allv send_counts");
    std::vector<size_t> recv_counts = exchange_counts(send_counts);
    size_t total = 0;
    for (size_t c : recv_counts) total += c;
    if (total > recv_capacity)
      throw Error(name() + ": all_to_allv receives " + std::to_string(total) + " elements but the buffer holds " +
                  std::to_string(recv_capacity));
    all_to_allv_raw(send, send_counts.data(), recv, recv_counts.data(), dtype_of<T>());
    return recv_counts;
  }
  // Host buffers only: exchanges counts, resizes `recv` to fit, returns the receive counts.
  template <class T>
  std::vector<size_t> all_to_allv(const T* send, std::span<const size_t> send_counts, std::vector<T>& recv) {
    if (device_memory()) throw Error(name() + ": all_to_allv into a std::vector needs host memory");
    check_counts(send_counts, "all_to_allv send_counts");
    std::vector<size_t> recv_counts = exchange_counts(send_counts);
    size_t total = 0;
    for (size_t c : recv_counts) total += c;
    recv.resize(total);
    all_to_allv_raw(send, send_counts.data(), recv.data(), recv_counts.data(), dtype_of<T>());
    return recv_counts;
  }
  // Collective permute with equal counts on both sides.
  template <class T>
  void permute(const T* send, T* recv, size_t n, int dest, int source) {
    permute_raw(send, n, dest, recv, n, source, dtype_of<T>());
  }
  template <class T>
  void send(const T* buf, size_t n, int dest, int tag = 0) {
    send_raw(buf, n, dtype_of<T>(), dest, tag);
  }
  template <class T>
  void recv(T* buf, size_t n, int source, int tag = 0) {
    recv_raw(buf, n, dtype_of<T>(), source, tag);
  }
  template <class T>
  void isend(const T* buf, size_t n, int dest, int tag = 0) {
    isend_raw(buf, n, dtype_of<T>(), dest, tag);
  }

 protected:
  void check_counts(std::span<const size_t> counts, const char* what) const {
    if (counts.size() != size_t(size()))
      throw Error(name() + ": " + what + " has " + std::to_string(counts.size()) +
                  " entries, expected one per rank (" + std::to_string(size()) + ")");
  }
  // Shared argument checks for backends.
  void check_rank(int r, const char* what, bool allow_none = false) const;
};

}  // namespace meshmoe
