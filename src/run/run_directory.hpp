// The run directory (docs/user-guide.md "Files a run writes") belongs to one run at a time. On a cluster
// ranks do not share everything and jobs get started twice, so before anything is written:
//   - ownership: rank 0 holds an flock on <dir>/run.lock for the whole run; a second run started in
//     the same directory finds it held and stops (InputError, exit 2) naming the holder;
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
  // Collective over `world`: creates `dir`, takes the lock and checks that every rank sees it.
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
  std::string dir_, nonce_;
  int lock_fd_ = -1;  // rank 0 only
};

}  // namespace meshmoe
