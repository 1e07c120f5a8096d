// ShmCollectives: rounds of copy-in, barrier, direct loads from the peers' slots (the MPI-3
// unified memory model: MPI_Win_sync orders this process's loads and stores against the barrier).
//
// A round moves piece j (at most P elements) of every rank's block. Slot k is cut into one region
// of P elements per block owner s. Reduce: rank k copies piece j of every block s != k into
// region s of its slot; barrier; owner r sums region r of every slot, its own piece read from its
// buffer, in rank order, into its buffer. Gather: owner r copies its piece into region r of its
// slot; barrier; every rank copies region s of slot s into piece j of its block s. A barrier
// closes the round, so no rank refills its slot while a peer still reads it.
#include "mesh/shm_collectives.hpp"

#include <sys/statvfs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include "mesh/rank_order_sum.hpp"

namespace meshmoe {

namespace {

// Open MPI's directory for the backing files of shared windows, and whether it has room for
// `bytes` more: rank 0 of `node` looks, every rank gets its verdict (one directory per node).
// A tmpfs that fills up kills the job with SIGBUS at a page's first touch, not with an error.
struct BackingRoom {
  bool fits = false;
  std::string dir;
  double free_bytes = 0;
};
BackingRoom backing_room(MPI_Comm node, double bytes) {
  const char* env = std::getenv("OMPI_MCA_osc_sm_backing_directory");
  BackingRoom room{false, env && *env ? env : "/dev/shm", 0};
  int rank = 0;
  MPI_Comm_rank(node, &rank);
  double verdict[2] = {0, 0};  // fits, free bytes
  if (rank == 0) {
    struct statvfs fs {};
    if (statvfs(room.dir.c_str(), &fs) == 0) verdict[1] = double(fs.f_bavail) * double(fs.f_frsize);
    verdict[0] = verdict[1] >= 1.05 * bytes;
  }
  MPI_Bcast(verdict, 2, MPI_DOUBLE, 0, node);
  room.fits = verdict[0] != 0, room.free_bytes = verdict[1];
  return room;
}

// A collective free could hang after MPI_Finalize or while an exception unwinds on this rank
// alone: then the process exit releases the memory.
bool collective_free_safe() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return !finalized && std::uncaught_exceptions() == 0;
}

}  // namespace

std::unique_ptr<ShmCollectives> ShmCollectives::open(MPI_Comm comm, const std::string& label, size_t slot_bytes) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Comm node = MPI_COMM_NULL;
  // key = rank: the node group's ranks are the group's ranks when it holds all of them.
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) != MPI_SUCCESS)
    throw Error(label + ": MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  if (node_size != size) {  // on every rank alike: some rank of the group is on another node
    MPI_Comm_free(&node);
    return nullptr;
  }
  // The slot window grows up to slot_bytes per rank: without room for that, MPI's collectives.
  const BackingRoom room = backing_room(node, double(slot_bytes) * size);
  if (!room.fits) {
    if (rank == 0)
      std::fprintf(stderr,
                   "meshmoe: warning: %s: %s has %.0f MiB free, less than the shared-memory collectives' window "
                   "(%d x %.0f MiB): MPI's collectives instead (a larger /dev/shm, e.g. --shm-size, or "
                   "OMPI_MCA_osc_sm_backing_directory elsewhere gives the faster path)\n",
                   label.c_str(), room.dir.c_str(), room.free_bytes / (1 << 20), size, double(slot_bytes) / (1 << 20));
    MPI_Comm_free(&node);
    return nullptr;
  }
  MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
  return std::unique_ptr<ShmCollectives>(new ShmCollectives(node, label));
}

ShmCollectives::ShmCollectives(MPI_Comm node, std::string label) : node_(node), label_(std::move(label)) {
  MPI_Comm_rank(node_, &rank_);
  MPI_Comm_size(node_, &size_);
}

ShmCollectives::~ShmCollectives() {
  if (!collective_free_safe()) return;
  free_window();
  for (Resident& r : resident_) free_resident(r);
  MPI_Comm_free(&node_);
}

void ShmCollectives::check(int rc, const char* call) const {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(label_ + ": shared-memory collectives: " + call + " failed: " + std::string(msg, size_t(len)) +
              " (run.shm_collectives = false uses MPI's collectives instead)");
}

void ShmCollectives::free_window() {
  if (win_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(win_);
  MPI_Win_free(&win_);
  win_ = MPI_WIN_NULL;
  slot_bytes_ = 0;
  base_.clear();
}

void ShmCollectives::reserve(size_t bytes) {
  if (bytes <= slot_bytes_) return;
  free_window();
  char* mine = nullptr;
  check(MPI_Win_allocate_shared(MPI_Aint(bytes), 1, MPI_INFO_NULL, node_, &mine, &win_), "MPI_Win_allocate_shared");
  slot_bytes_ = bytes;
  base_.assign(size_t(size_), nullptr);
  for (int r = 0; r < size_; ++r) {
    MPI_Aint got = 0;
    int disp = 0;
    check(MPI_Win_shared_query(win_, r, &got, &disp, &base_[size_t(r)]), "MPI_Win_shared_query");
    if (size_t(got) < bytes) throw Error(label_ + ": shared-memory window slot smaller than asked");
  }
  // One passive epoch for the window's lifetime; the rounds order their accesses by sync().
  check(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), "MPI_Win_lock_all");
}

void ShmCollectives::sync() { sync(win_); }
void ShmCollectives::sync(MPI_Win win) {
  check(MPI_Win_sync(win), "MPI_Win_sync");
  check(MPI_Barrier(node_), "MPI_Barrier");
  check(MPI_Win_sync(win), "MPI_Win_sync");
}

ShmCollectives::Resident* ShmCollectives::allocate_resident(size_t bytes, bool one_copy) {
  bytes = std::max<size_t>((bytes + 4095) & ~size_t(4095), 4096);
  if (!backing_room(node_, double(bytes) * (one_copy ? 1 : size_)).fits) return nullptr;
  Resident r{MPI_WIN_NULL, bytes, std::vector<char*>(size_t(size_), nullptr), one_copy};
  MPI_Info info = MPI_INFO_NULL;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");  // each rank's memory page-aligned, its own pages
  char* mine = nullptr;
  const size_t my_bytes = one_copy && rank_ > 0 ? 0 : bytes;
  const int rc = MPI_Win_allocate_shared(MPI_Aint(my_bytes), 1, info, node_, &mine, &r.win);
  MPI_Info_free(&info);
  check(rc, "MPI_Win_allocate_shared");
  for (int k = 0; k < (one_copy ? 1 : size_); ++k) {
    MPI_Aint got = 0;
    int disp = 0;
    check(MPI_Win_shared_query(r.win, k, &got, &disp, &r.base[size_t(k)]), "MPI_Win_shared_query");
    if (size_t(got) < bytes) throw Error(label_ + ": shared-memory window smaller than asked");
  }
  check(MPI_Win_lock_all(MPI_MODE_NOCHECK, r.win), "MPI_Win_lock_all");
  if (my_bytes > 0) std::memset(mine, 0, my_bytes);  // this rank's pages made by this rank
  resident_.push_back(std::move(r));
  sync(resident_.back().win);
  return &resident_.back();
}

void* ShmCollectives::shared_alloc(size_t bytes) {
  Resident* r = allocate_resident(bytes, false);
  return r ? r->base[size_t(rank_)] : nullptr;
}

void* ShmCollectives::shared_alloc_one(size_t bytes) {
  Resident* r = allocate_resident(bytes, true);
  return r ? r->base[0] : nullptr;
}

void ShmCollectives::shared_fence() {
  for (const Resident& r : resident_) check(MPI_Win_sync(r.win), "MPI_Win_sync");
  check(MPI_Barrier(node_), "MPI_Barrier");
  for (const Resident& r : resident_) check(MPI_Win_sync(r.win), "MPI_Win_sync");
}

void ShmCollectives::free_resident(Resident& r) {
  MPI_Win_unlock_all(r.win);
  MPI_Win_free(&r.win);
}

void ShmCollectives::shared_free(void* p) {
  if (!collective_free_safe()) return;
  for (auto r = resident_.begin(); r != resident_.end(); ++r)
    if (r->base[r->one_copy ? 0 : size_t(rank_)] == p) {
      free_resident(*r);
      resident_.erase(r);
      return;
    }
}

bool ShmCollectives::run_resident(char* buf, const std::vector<size_t>& off, DType t, bool reduce, bool gather) {
  if (resident_.empty()) return false;  // on every rank alike: shared_alloc is collective
  const size_t n = size_t(size_), me = size_t(rank_), elem = dtype_size(t);
  const size_t bytes = off[n] * elem;
  // (window, offset) where buf lies, and their negations: one MPI_MAX gives every rank the largest
  // and the smallest of each; they agree when those are equal.
  int64_t where[4] = {-1, -1, 1, 1};
  for (size_t w = 0; w < resident_.size(); ++w) {
    if (resident_[w].one_copy) continue;
    char* base = resident_[w].base[me];
    if (buf >= base && buf + bytes <= base + resident_[w].bytes) {
      where[0] = int64_t(w), where[1] = buf - base, where[2] = -where[0], where[3] = -where[1];
      check(MPI_Win_sync(resident_[w].win), "MPI_Win_sync");  // this rank's writes to buf visible
      break;
    }
  }
  // Also the start barrier: every rank's buffer is final when this returns.
  check(MPI_Allreduce(MPI_IN_PLACE, where, 4, MPI_INT64_T, MPI_MAX, node_), "MPI_Allreduce");
  if (where[0] < 0 || where[0] != -where[2] || where[1] != -where[3]) return false;
  const Resident& r = resident_[size_t(where[0])];
  check(MPI_Win_sync(r.win), "MPI_Win_sync");
  const size_t offset = size_t(where[1]);
  auto block = [&](size_t k, size_t s) { return r.base[k] + offset + off[s] * elem; };  // block s in rank k's memory
  const size_t mine = off[me + 1] - off[me];
  if (reduce && mine > 0) {
    auto sum_block = [&](auto zero) {
      using T = decltype(zero);
      std::vector<const T*> ops(n);
      for (size_t k = 0; k < n; ++k) ops[k] = reinterpret_cast<const T*>(block(k, me));
      sum_in_rank_order(reinterpret_cast<T*>(block(me, me)), ops, mine);
    };
    if (t == DType::F32) sum_block(0.0f);
    else sum_block(0.0);
  }
  if (reduce && gather) sync(r.win);
  if (gather)
    for (size_t s = 0; s < n; ++s)
      if (s != me && off[s + 1] > off[s]) std::memcpy(block(me, s), block(s, s), (off[s + 1] - off[s]) * elem);
  sync(r.win);  // no rank changes its buffer while a peer still reads it
  return true;
}

void ShmCollectives::run(void* buf, const size_t* counts, DType t, bool reduce, bool gather, size_t slot_bytes) {
  if (reduce && t != DType::F32 && t != DType::F64)
    throw std::logic_error("ShmCollectives: sums of float and double only");
  const size_t n = size_t(size_), me = size_t(rank_), elem = dtype_size(t);
  std::vector<size_t> off(n + 1, 0);
  size_t longest = 0;
  for (size_t s = 0; s < n; ++s) off[s + 1] = off[s] + counts[s], longest = std::max(longest, counts[s]);
  if (longest == 0) return;
  if (run_resident(static_cast<char*>(buf), off, t, reduce, gather)) return;
  // P elements per region, n regions per slot: a round's slot within slot_bytes.
  const size_t P = std::clamp(slot_bytes / (n * elem), size_t(1), longest);
  if (n * P * elem > slot_bytes_) reserve(std::max(n * P * elem, std::min(2 * slot_bytes_, slot_bytes)));
  char* b = static_cast<char*>(buf);
  char* own = slot(rank_);
  auto region = [&](size_t k, size_t s) { return slot(int(k)) + s * P * elem; };
  auto piece = [&](size_t s, size_t j) { return b + (off[s] + j * P) * elem; };
  auto length = [&](size_t s, size_t j) { return counts[s] > j * P ? std::min(P, counts[s] - j * P) : size_t(0); };

  for (size_t j = 0; j * P < longest; ++j) {
    if (reduce) {
      for (size_t s = 0; s < n; ++s)
        if (s != me && length(s, j) > 0) std::memcpy(own + s * P * elem, piece(s, j), length(s, j) * elem);
      sync();
      if (const size_t len = length(me, j); len > 0) {
        auto sum_piece = [&](auto zero) {
          using T = decltype(zero);
          std::vector<const T*> ops(n);
          for (size_t k = 0; k < n; ++k) ops[k] = reinterpret_cast<const T*>(k == me ? piece(me, j) : region(k, me));
          sum_in_rank_order(reinterpret_cast<T*>(piece(me, j)), ops, len);
        };
        if (t == DType::F32) sum_piece(0.0f);
        else sum_piece(0.0);
      }
    }
    if (gather) {
      // With the reduce before it no barrier is needed here: the peers read other regions of this
      // slot in the reduce, and region `me` of it only after the barrier below.
      if (length(me, j) > 0) std::memcpy(own + me * P * elem, piece(me, j), length(me, j) * elem);
      sync();
      for (size_t s = 0; s < n; ++s)
        if (s != me && length(s, j) > 0) std::memcpy(piece(s, j), region(s, s), length(s, j) * elem);
    }
    sync();
  }
}

}  // namespace meshmoe
