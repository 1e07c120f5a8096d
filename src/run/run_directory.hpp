// The run directory (docs/user-guide.md "Files a run writes") belongs to one run at a time. On a cluster
// ranks do not share everything and jobs get started twice, so before anything is written:
//   - ownership: rank 0 holds an flock on <dir>/run.lock and on <dir>/ckpt/.run.lock for the whole
//     run; a second run started in the same directory, or whose ckpt/ is (through links) the same
//     directory, finds one held and stops (InputError, exit 2) naming the holder;
//   - every file the run writes can be written: ckpt/ is a writable directory on every rank (not a
//     file, a link to nothing or a read-only mount), metrics.h5 and deck.toml are writable files;
//   - one directory for all ranks: run.lock carries a nonce that every rank must read back, else
//     the directory is not on a file system every rank shares (a relative run.out_dir and ranks
//     started in different working directories) and the run stops before its first collective
//     checkpoint write could hang;
//   - a fresh start in a directory that holds an earlier run's checkpoints or metrics moves them
//     aside to <dir>/superseded-<time>/ (move_aside), so that a later `run.resume = "auto"` and the
//     checkpoint pruning only ever see this run's own lineage.
#pragma once
#include <mpi.h>

#include <string>

#include "deck/deck.hpp"

namespace meshmoe {

// The run directory of a deck: run.out_dir, or runs/<run.name>.
std::string run_directory(const Config& cfg);

// Collective: rank 0 writes deck.toml (the effective deck) into the run directory `dir`; a failure
// throws InputError on every rank.
void write_deck_file(const Deck& deck, const std::string& dir, MPI_Comm world);

class RunDirectory {
 public:
  // Collective over `world`: creates `dir` and `dir`/ckpt, takes the locks, checks that every rank sees
  // them and can write what the run writes.
  // Throws InputError on every rank alike (the failing rank named) when it cannot.
  RunDirectory(std::string dir, MPI_Comm world);
  ~RunDirectory();  // releases the lock (the process exit does too, however it ends)
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::string& path() const { return dir_; }
  // A new lineage id for checkpoints (same on every rank): this start's nonce.
  const std::string& nonce() const { return nonce_; }

  // Collective. When the directory holds an earlier run's state (ckpt/ with checkpoint files,
  // metrics.h5, deck.toml), moves it into <dir>/superseded-<UTC time>/ and returns a line saying
  // what went where ("" when there was nothing). Throws InputError alike when a move fails.
  std::string move_aside(MPI_Comm world) const;

 private:
  // The text of a lock file: who holds it.
  std::string lock_text() const;
  // flock of `lock_path` into `fd` (closed first), its text written; "" or why not (`what` names the directory).
  std::string take_lock(const std::string& lock_path, const std::string& what, int& fd) const;
  // ckpt/ is a directory this rank can write (created when missing and `create`), and locked; "" or why not.
  std::string check_checkpoint_dir(bool create) const;

  std::string dir_, nonce_;
  int lock_fd_ = -1;               // rank 0 only
  mutable int ckpt_lock_fd_ = -1;  // rank 0 only; taken again when move_aside moves ckpt/ away
};

}  // namespace meshmoe
