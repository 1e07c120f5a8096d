// What the checkpoint units share (not for other callers: they use checkpoint.hpp). The format of a
// file (its root attributes, the dataset of each tensor, the checks on its values), the byte
// messages the ranks exchange about it, and the commit of a written file into its directory.
//
// The units: checkpoint_format.cpp (this header), checkpoint_write.cpp (write_checkpoint),
// checkpoint_read.cpp (read, init-from, verify), checkpoint_dir.cpp (the directory: step file
// names, LATEST, pruning, choosing a checkpoint to resume from or that a command line names).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "io/h5.hpp"
#include "checkpoint/checkpoint.hpp"

namespace meshmoe::ckpt {

int64_t product(const std::vector<int64_t>& d);
int comm_rank(MPI_Comm c);
int comm_size(MPI_Comm c);

// ---------------------------------------------------------------------------------------------
// A tiny byte serializer for the allgather of block lists and the broadcast of meta / verdicts.

struct Out {
  std::string buf;
  void i64(int64_t v);
  void str(const std::string& s);
  void dims(const std::vector<int64_t>& d);
};
struct In {
  const char* p;
  const char* end;
  explicit In(const std::string& s) : p(s.data()), end(s.data() + s.size()) {}
  int64_t i64();
  std::string str();
  std::vector<int64_t> dims();
  bool done() const { return p >= end; }
};

// Every rank's string, in rank order, on every rank.
std::vector<std::string> allgather_strings(const std::string& mine, MPI_Comm comm);

// ---------------------------------------------------------------------------------------------
// The file: root attributes and datasets.

enum class Kind : int64_t { Param = 0, Optim = 1 };

// "/params/<name>" or "/optim/<name>".
std::string dataset_path(Kind k, const std::string& name);

// Meta as bytes (rank 0's meta broadcast before a write) and as the file's root attributes.
std::string pack_meta(const CheckpointMeta& m);
CheckpointMeta unpack_meta(const std::string& s);
void write_meta_attrs(h5::File& f, const CheckpointMeta& m, int64_t n_params, int64_t n_optim);
// Throws InputError when the file is not a meshmoe checkpoint of this format version or lacks an
// attribute.
CheckpointMeta read_meta_attrs(const h5::File& f);

// Every dataset under `loc` (recursively), as (path relative to loc, dataset).
void walk_datasets(const h5::Location& loc, const std::string& prefix,
                   std::vector<std::pair<std::string, h5::Dataset>>& out);

// ---------------------------------------------------------------------------------------------
// Values: a checkpoint holds only finite values, and second moments >= 0.

// Index of the first of data[0..n) that is NaN or infinite, or (nonnegative) below 0; -1 when none.
int64_t first_bad_value(const float* data, int64_t n, bool nonnegative);

// "blocks.0.attn.wq [3, 5] = inf" plus why it is bad: element i of the block (row-major in
// `local`) at `offset`.
std::string bad_value_str(const std::string& name, const std::vector<int64_t>& offset,
                          const std::vector<int64_t>& local, int64_t i, float v);

// ---------------------------------------------------------------------------------------------
// The directory (checkpoint_dir.cpp).

// Rank 0, after the collective write of `tmp`: the data file reaches the disk before its name
// (`path`) does, ckpt_dir/LATEST is replaced after both, then older checkpoints are pruned by
// `keep`. Throws Error.
void commit_checkpoint(const std::string& tmp, const std::string& path, const std::string& ckpt_dir,
                       int64_t step, const RetentionPolicy& keep);

}  // namespace meshmoe::ckpt
