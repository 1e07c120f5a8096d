// Intra-node collectives through an MPI-3 shared-memory window (docs/ARCHITECTURE.md
// "Shared-memory collectives"): each rank of a group that lives on one node owns a slot of the
// window; a collective copies pieces of the ranks' buffers into their slots, and every rank reads
// its peers' slots directly (one load from the peer's memory instead of MPI's fragment pipeline).
// MpiComm uses it for large float/double sums and for the variable gathers; it is not a Comm.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "mesh/comm.hpp"

namespace meshmoe {

class ShmCollectives {
 public:
  // Collective over `comm`: the window's group when every rank of `comm` shares this node (the
  // MPI_COMM_TYPE_SHARED split of `comm` is as large as `comm`) and Open MPI's backing directory
  // for shared windows (/dev/shm unless OMPI_MCA_osc_sm_backing_directory says otherwise) has room
  // for slot_bytes per rank (else a warning from the group's rank 0), nullptr on every rank
  // otherwise. `label` names the group in errors.
  static std::unique_ptr<ShmCollectives> open(MPI_Comm comm, const std::string& label, size_t slot_bytes);
  // Frees the window (collective), except while an exception unwinds on this rank alone or after
  // MPI_Finalize, when a collective could hang: then the process exit releases it.
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  // buf holds one block per rank, packed in rank order (counts[r] elements for rank r), as in
  // Comm::reduce_scatterv_in_place_raw. reduce (F32/F64 only): rank r's block becomes the sum of
  // every rank's block r, added in rank order 0..n-1 (((b_0 + b_1) + b_2) + ...), the same
  // order whatever the sizes. gather: every rank's block goes to every rank (after the reduce
  // when both: an all-reduce). The data moves in rounds of at most `slot_bytes` per rank, so the
  // window stays that size whatever the buffer.
  // A buffer inside node-shared memory (shared_alloc) at the same offset on every rank moves
  // without the slots: each rank sums its block from the peers' memory into its own, then copies
  // the peers' blocks from theirs (1.25 bytes moved per byte summed with 2 ranks, 2.25 through
  // the slots). The ranks agree on the path first, so a buffer resident on some ranks only takes
  // the slots everywhere.
  void run(void* buf, const size_t* counts, DType t, bool reduce, bool gather, size_t slot_bytes);

  // Collective: `bytes` of memory of this rank that every rank of the group can read (the
  // model's flat weights and gradients: ParamStore::allocate), zeroed, in a window of its own that
  // lives as long as this object; nullptr on every rank when the backing directory (see open) has
  // less room than the group's total.
  void* shared_alloc(size_t bytes);
  // Collective: `bytes` of the group's first rank's memory, zeroed, the same memory on every rank
  // (at each process's own address): one copy for the group (ParamStore's weights with sharded
  // optimizer state). The collectives do not read it in place. nullptr on every rank as above.
  void* shared_alloc_one(size_t bytes);
  // Collective: frees what shared_alloc or shared_alloc_one returned (not while an exception
  // unwinds on this rank).
  void shared_free(void* p);
  // Collective: every rank's writes to the shared_alloc memory visible to every rank, then a
  // barrier: what a rank wrote there before the call, the others read after it.
  void shared_fence();

 private:
  ShmCollectives(MPI_Comm node, std::string label);
  void check(int rc, const char* call) const;
  void reserve(size_t bytes);  // collective: grows the window to `bytes` per rank
  void free_window();
  // The resident path of run(); false (on every rank alike) when buf is not resident everywhere.
  bool run_resident(char* buf, const std::vector<size_t>& off, DType t, bool reduce, bool gather);
  void sync(MPI_Win win);
  void sync();                 // every rank's writes to its slot visible to all, then a barrier
  char* slot(int r) const { return base_[size_t(r)]; }

  MPI_Comm node_;
  std::string label_;
  int rank_ = 0, size_ = 0;
  MPI_Win win_ = MPI_WIN_NULL;
  size_t slot_bytes_ = 0;
  std::vector<char*> base_;  // [size]: every rank's slot in this process's address space
  struct Resident {
    MPI_Win win;
    size_t bytes;
    std::vector<char*> base;  // [size]: every rank's memory of this window
    bool one_copy = false;    // shared_alloc_one: base[0] only
  };
  Resident* allocate_resident(size_t bytes, bool one_copy);
  std::vector<Resident> resident_;  // shared_alloc's windows
  static void free_resident(Resident& r);  // collective
};

}  // namespace meshmoe
