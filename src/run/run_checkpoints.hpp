// The checkpoints of one training run (docs/user-guide.md "Checkpoints and restart"): run.resume at start-up,
// a checkpoint every checkpoint.every steps and at the end, the checkpoint before a stop (signal,
// run.max_walltime, exit code 75), after run.max_bad_steps non-finite steps (of the last good
// step), and before an agreed failure. The files themselves: src/train/checkpoint.hpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/batcher.hpp"
#include "data/dataset_identity.hpp"
#include "deck/deck.hpp"
#include "deck/deck_changes.hpp"
#include "mesh/mesh.hpp"
#include "model/params.hpp"
#include "checkpoint/checkpoint.hpp"
#include "optim/optimizer.hpp"
#include "run/run_directory.hpp"

namespace meshmoe {

template <typename T>
class Transformer;

// The selection biases of the model's MoE layers (moe.balance = bias) as checkpoint state
// "blocks.<i>.moe.router/selection_bias" [E]: every rank holds the whole tensor (replicated over
// data and tensor), so a checkpoint reloads on any mesh. Empty without biases.
std::vector<StateTensor> selection_bias_state(Transformer<float>& model);

// Where training stands besides the tensors and the batcher: what a checkpoint records and a
// resume gives back (CheckpointMeta's step, update_count and counters).
struct TrainProgress {
  int64_t start_step = 0;      // steps already done (from a checkpoint)
  int64_t updates = 0;         // optimizer updates applied (the optimizer's t)
  int64_t bad_steps = 0;       // consecutive non-finite steps
  int64_t empty_steps = 0;     // steps without a target token so far
  DataCursor good_cursor;      // the data cursor after the last step whose update was applied
  bool eval_pending = false;   // the evaluation of the last completed step was interrupted
  // [languages] target tokens (loss mask 1) of the batches whose update was applied, per language
  // of the dataset's table, from step 1 on (metrics.h5 /data/lang_tokens).
  std::vector<int64_t> lang_tokens;
};

// Collective over `world`: was the checkpoint file `path` trained on the data at `data_path`? Rank 0
// compares the fingerprint that resume compares (src/data/dataset_identity.hpp) with that data's;
// on a difference every rank throws InputError naming both and the sentences of the difference
// ("--checkpoint"/"--teacher"/"--baseline" = `option` begins it), unless `allow_other` (the
// command's --allow-other-data): then rank 0 warns and the command goes on. A checkpoint that
// records no fingerprint (an older version) passes.
void check_checkpoint_data(const std::string& option, const std::string& path, const std::string& data_path,
                           bool allow_other, MPI_Comm world);

// `train --init-from FILE` on a fresh start (collective): the checkpoint or safetensors file that
// `given` names (resolve_named_checkpoint) initialises `params` (init_from_checkpoint's rules and
// refusals, src/checkpoint/checkpoint.hpp); rank 0 prints what was copied, upcycled, and left at
// its initialisation.
void init_from(const std::string& given, const InitFromOptions& opt, ParamStore<float>& params, Mesh& mesh);

class RunCheckpoints {
 public:
  // Writes and reads <run_dir>/ckpt. `params`, `optimizer`, `batcher` and `progress` are the
  // trainer's: saved from, and restored into by resume(). `data` is rank 0's identity of the
  // dataset trained on (src/data/dataset_identity.hpp).
  RunCheckpoints(const Deck& deck, std::string version, Mesh& mesh, const RunDirectory& run_dir, DatasetIdentity data,
                 ParamStore<float>& params, Optimizer& optimizer, Batcher& batcher, TrainProgress& progress);

  // State of the model that is not a parameter (the MoE routers' selection biases, moe.balance =
  // bias): saved and resumed with the optimizer state, under /optim/<name>, in logical shapes.
  void add_model_state(std::vector<StateTensor> state) { model_state_ = std::move(state); }

  // Collective. run.resume: auto (the newest complete checkpoint of the run directory, if any),
  // never, or a checkpoint path. Parameters, optimizer state, data cursor, update and bad-step
  // counts come back; the mesh may differ from the one that wrote the checkpoint. Resuming the run
  // directory's newest checkpoint continues its lineage; anything else is a fresh start (or a fork
  // of the given file) and first moves an earlier run's files aside, so that a later `auto` resume
  // and the pruning only ever see this run's own checkpoints (src/train/run_directory.hpp).
  void resume();

  // Collective. Writes ckpt/step_N.h5 (atomic, then LATEST, then pruning by checkpoint.keep_*).
  // `cursor`: the data cursor to record (default: where the batcher stands); a checkpoint of the
  // last good step (after non-finite steps) records that step's cursor and no bad steps.
  // Returns false (rank 0 has said why) when the state is not finite and nothing was written: the
  // caller exits with kExitFailure.
  bool save(int64_t step, const DataCursor* cursor = nullptr);

  // A stop request (stop_requested's reason `why`: 1 signal, 2 run.max_walltime) after step
  // `last_step`: the checkpoint, then kExitCheckpointed (kExitFailure when none could be written).
  // Nothing done since the last checkpoint (or since a fresh start): no checkpoint, kExitCheckpointed
  // with a line saying so; run.max_walltime before the first step of this start: kExitFailure (a
  // requeued job would loop without progress).
  int stop(int64_t last_step, int why);

  // A failure that every rank reached together after some steps (it was agreed): the steps done
  // are not lost; the caller then reports the failure.
  void save_before_failure(int64_t done);

 private:
  // A checkpoint records the dataset it was trained on; resuming it on other data would continue a
  // data cursor and per-language metrics that belong to that data (docs/user-guide.md "Checkpoints and restart").
  void check_same_data(const std::string& path, const CheckpointMeta& head);
  // The deck keys that differ from the deck stored in the checkpoint (every rank); report_changes
  // prints them once the checkpoint has loaded: a warning for those that change the training.
  std::vector<DeckChange> changes_since(const std::string& path, const CheckpointMeta& head);
  void report_changes(const std::vector<DeckChange>& changes, int64_t step) const;

  const Deck& deck_;
  const Config& cfg_;
  std::string version_;
  Mesh& mesh_;
  const RunDirectory& run_dir_;
  std::string ckpt_dir_;
  DatasetIdentity data_identity_;  // rank 0 only
  ParamStore<float>& params_;
  Optimizer& optimizer_;
  Batcher& batcher_;
  TrainProgress& progress_;
  std::vector<StateTensor> model_state_;
  // The optimizer's state tensors, then the model's.
  std::vector<StateTensor> state() const;
  int64_t last_checkpoint_ = 0;  // step of the newest checkpoint written or resumed from (this lineage)
  std::string lineage_, forked_from_;  // CheckpointMeta::lineage / forked_from of what this run writes
};

}  // namespace meshmoe
