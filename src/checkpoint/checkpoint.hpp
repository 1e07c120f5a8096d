// Checkpoint files (DESIGN "Files a run writes"): one HDF5 file per checkpoint,
// ckpt/step_%08d.h5, holding every parameter (/params/<name>) and every optimizer state tensor
// (/optim/<name>) in its LOGICAL (unsharded) shape, written collectively as hyperslabs by the ranks
// that hold them, chunked with the Fletcher32 filter; step, RNG seed, data cursor, update count,
// effective deck, mesh and program version as root attributes.
//
// Writing is atomic: step_N.h5.tmp is written, closed and fsynced, then renamed to step_N.h5, and
// only then is ckpt/LATEST replaced (write LATEST.tmp, fsync, rename, fsync the directory). Old
// checkpoints are pruned after that (keep_last newest + multiples of keep_every).
//
// Reading works on any mesh: every rank reads the blocks its ParamStore and optimizer state hold
// (resharding = reading other hyperslabs), with the Fletcher32 check.
//
// Which rank writes what: every rank announces the blocks it holds (allgather); for each distinct
// block of a tensor the lowest world rank holding it writes it (= coordinate 0 on every axis the
// tensor is not split over, the first pipeline stage for a tied embedding); all other ranks take
// part in the collective call selecting none. The distinct blocks must tile the logical shape
// exactly, else the write fails before anything is created (a model that loses elements).
//
// The code: checkpoint_format.cpp (attributes, value checks, the ranks' messages; shared through
// checkpoint_format.hpp), checkpoint_write.cpp, checkpoint_read.cpp (read, init-from, verify) and
// checkpoint_dir.cpp (file names, LATEST, pruning, the choice of a checkpoint).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "data/batcher.hpp"
#include "mesh/mesh.hpp"
#include "model/params.hpp"
#include "optim/optimizer.hpp"

namespace meshmoe {

// What a checkpoint records besides the tensors. On write every rank passes the same values
// (rank 0's are used); write_checkpoint fills `mesh`, `param_count` and `world_size` itself.
struct CheckpointMeta {
  int64_t step = 0;          // training steps done; the resumed run continues with step + 1
  int64_t update_count = 0;  // optimizer updates applied (Optimizer::step's t of the last one)
  uint64_t seed = 0;         // run.seed: keys every Philox stream
  DataCursor data_cursor;    // where the training batcher stands
  std::string optimizer;     // "adamw" | "adafactor" (informational, checked by the caller)
  std::string deck;          // the effective deck text (after --set overrides)
  std::string version;       // program version (MESHMOE_VERSION)
  std::map<std::string, int64_t> counters;  // anything else, e.g. {"bad_steps", 0}; /counters attrs
  std::vector<int64_t> lang_tokens;  // TrainProgress::lang_tokens (attribute lang_tokens); empty in older files
  // The line of checkpoints this one belongs to: the id of the fresh start that began it
  // (src/train/run_directory.hpp); pruning removes only checkpoints of the writer's lineage.
  // Empty in files written before lineages existed.
  std::string lineage;
  std::string forked_from;  // a fresh lineage started from another checkpoint: "PATH (step N)"
  // The dataset trained on (src/data/dataset_identity.hpp); empty in older files.
  std::string data_path, data_summary, data_fingerprint, data_languages;
  // Filled on write, read back on read:
  MeshShape mesh;            // the mesh the checkpoint was written on
  int64_t param_count = 0;   // total logical parameter elements
  int64_t world_size = 0;
};

struct RetentionPolicy {
  int keep_last = 3;   // checkpoint.keep_last (>= 1)
  int keep_every = 0;  // checkpoint.keep_every (0: none extra)
  // Only checkpoints of this lineage are ever removed (and counted); files of another lineage or
  // whose lineage cannot be read are left alone.
  std::string lineage;
};

// "step_00001000.h5"
std::string checkpoint_file_name(int64_t step);

// write_checkpoint refused the state: a parameter or optimizer state value is NaN or infinite, or a
// second moment is negative. Thrown on every rank alike, before anything is written; LATEST and
// the committed checkpoints are untouched. what(): "the parameters at step N are not finite
// (<tensor> [i, j] = nan); no checkpoint written; the newest good checkpoint is <dir>/LATEST -> ..."
class NonFiniteState : public Error {
 public:
  using Error::Error;
};

// Optimizer state tensors that are second moments (squared-gradient averages), so never negative:
// AdamW's "<param>/exp_avg_sq", Adafactor's "<param>/v_row", "<param>/v_col" and "<param>/v"
// (src/train/adamw.cpp, adafactor.cpp).
bool is_second_moment_state(const std::string& name);

// Collective over mesh.world(). Writes <ckpt_dir>/step_%08d.h5 (meta.step) atomically, updates
// <ckpt_dir>/LATEST, then prunes by `keep`. Creates ckpt_dir if missing. Returns the path of the
// committed file on every rank. Throws (on every rank alike) InputError when ckpt_dir cannot be
// created or written, Error for inconsistent inputs (tensor shapes disagreeing between ranks,
// blocks that do not tile a tensor). A failure of one rank inside the collective write (e.g. a full
// disk) cannot be agreed on (the others wait in HDF5's collectives): that rank prints the reason and
// calls MPI_Abort (exit code 1); the committed checkpoints stay untouched. Before the file is
// created every rank scans the blocks it writes: a non-finite value (or a negative second moment)
// anywhere makes every rank throw NonFiniteState, with nothing written.
std::string write_checkpoint(const std::string& ckpt_dir, const ParamStore<float>& store,
                             const std::vector<StateTensor>& state, const CheckpointMeta& meta,
                             const Mesh& mesh, const RetentionPolicy& keep = {});

// How read_checkpoint's error about parameters or state of other shapes begins (the resume adds
// the deck keys that differ from the checkpoint's).
inline constexpr const char* kIncompatibleModel = "checkpoint from an incompatible model";

// Collective over `comm` (every rank of the run, any mesh). Every rank reads the blocks of every
// parameter its store holds into store.weights() and of every state tensor into *t.data (resized
// to the block). Throws InputError on every rank alike when the file is missing, unreadable or
// corrupt (Fletcher32), or when it does not fit: "checkpoint from an incompatible model: ..."
// (a parameter or state tensor missing or of another logical shape). Returns the meta.
CheckpointMeta read_checkpoint(const std::string& path, ParamStore<float>& store, std::vector<StateTensor>& state,
                               MPI_Comm comm);

// `train --init-from` (docs/export.md "Starting from a file"; distill's student, Switch section
// 4.2): collective over `comm`. The file is a meshmoe checkpoint (its /params, from any mesh) or a
// safetensors export (`meshmoe export`, or any F32 safetensors file under meshmoe's names). Every
// parameter of `store` whose name and logical shape the file holds gets its block from it; with
// `upcycle` (sparse upcycling, Komatsuzaki et al. 2023 section 3) every expert of
// blocks.<i>.moe.experts.w_in / w_out gets the dense blocks.<i>.mlp.w_in / w_out of the file,
// each element times (1 + upcycle_noise (2u - 1)), u uniform in [0, 1) from Philox keyed by
// (seed, block i, the element's logical index), so the same on every mesh; the others keep
// their values (the router: its fresh initialisation). Returns, on every rank, the logical
// parameters of all ranks (each once, sorted) by what happened to them.
// Throws InputError on every rank alike when the file is missing, unreadable or holds a non-finite
// value in a block it copies; and, unless `partial`, when a tensor of the file has a parameter's
// name but another shape (`mismatched` names both shapes) or nothing would be copied; with
// `upcycle`, when no expert tensor could be upcycled or an expert's dense source has another
// shape than one expert (the message says why).
struct InitFromOptions {
  bool partial = false;       // copy what matches, leave the rest at initialisation (--init-partial)
  bool upcycle = false;       // --upcycle
  double upcycle_noise = 0;   // --upcycle-noise
  uint64_t seed = 0;          // run.seed: keys the noise
};
struct InitFromResult {
  std::vector<std::string> copied, upcycled, kept;
  std::vector<std::string> mismatched;  // "name: [a, b] in the file, [c, d] in this model"
};
InitFromResult init_from_checkpoint(const std::string& path, ParamStore<float>& store, MPI_Comm comm,
                                    const InitFromOptions& opt = {});

// The logical tensors of a checkpoint file, read by this process alone (`meshmoe export`): every
// parameter under its name, then the MoE routers' selection biases (moe.balance = bias) under
// "blocks.<i>.moe.router/selection_bias"; sorted by name, block indices as numbers. Throws
// InputError when the file is not a readable checkpoint or holds a non-finite value.
struct LogicalTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
std::vector<LogicalTensor> read_logical_tensors(const std::string& path);

// Reads only the attributes (serial, this process). Throws InputError when unreadable.
CheckpointMeta read_checkpoint_meta(const std::string& path);

struct VerifyResult {
  bool ok = false;
  std::string message;  // "ok: step 20, 6 parameters, 9 optimizer tensors" or the reason it is bad
};
// Serial (this process only). Opens the file, checks the attributes, reads every dataset fully
// (Fletcher32 verifies each chunk), checks that every value is finite and every second moment
// (is_second_moment_state) >= 0 (the message names the tensor, the first bad index and value),
// and checks param_count. Never throws.
VerifyResult verify_checkpoint(const std::string& path);

struct ResumeChoice {
  std::string path;                   // the checkpoint to resume from; empty when none is usable
  std::vector<std::string> warnings;  // corrupt / truncated / stale .tmp / bad LATEST, one each
};
// Collective over `comm` (rank 0 looks, the verdict is broadcast). The file LATEST names when it
// verifies, else the newest step_*.h5 that verifies; every file skipped and every stale
// step_*.h5.tmp is reported in `warnings`. A missing ckpt_dir gives an empty choice.
ResumeChoice find_resume_checkpoint(const std::string& ckpt_dir, MPI_Comm comm);

// The lineage attribute of a checkpoint file ("" when it has none); throws Error when unreadable.
std::string checkpoint_lineage(const std::string& path);

// Committed checkpoints in ckpt_dir as (step, path), oldest first (no .tmp, no verification).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& ckpt_dir);

// The file name LATEST in `dir` holds ("" when there is none); throws Error when it holds
// something that is not a checkpoint name.
std::string read_latest_name(const std::string& dir);

// A checkpoint named on the command line (`--checkpoint`, `--teacher`, `--baseline`, `--init-from`,
// `ckpt info|verify`): a checkpoint file, a checkpoint directory (the file its LATEST names) or a
// run directory (the file its ckpt/LATEST names). This process only; returns the file's path, or
// throws InputError saying what was looked for.
std::string find_named_checkpoint(const std::string& given);

// find_named_checkpoint, collective over `comm`: rank 0 looks and every rank gets its answer; then
// every rank must see that file (a directory not shared by every node), else every rank throws
// InputError naming the first rank that does not. `option` ("--teacher", ...) begins the messages.
std::string resolve_named_checkpoint(const std::string& given, const std::string& option, MPI_Comm comm);

// The tensors of a checkpoint's group "params" or "optim": name (path under the group) and shape.
struct CheckpointTensorInfo {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<CheckpointTensorInfo> checkpoint_tensors(const std::string& path, const std::string& group);

}  // namespace meshmoe
