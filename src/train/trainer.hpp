// `meshmoe train`: the training loop. Reads the dataset, builds the model on this rank's part of
// the mesh, trains run.steps optimizer steps, evaluates, and writes runs/<name>/ (docs/user-guide.md
// "Files a run writes").
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/timers.hpp"
#include "deck/deck.hpp"
#include "mesh/mesh.hpp"
#include "checkpoint/checkpoint.hpp"
#include "parallel/pipeline_executor.hpp"
#include "run/startup.hpp"
#include "train/evaluate.hpp"

namespace meshmoe {

// What a command built on the training loop adds to it (`meshmoe distill`: src/train/distill.hpp).
class TrainHooks {
 public:
  virtual ~TrainHooks() = default;
  // Collective, every step, after the step's micro-batches are cut and before the student's
  // forward: may give each micro-batch soft targets (Micro::soft_targets, valid until the step
  // ends) and set the loss weights' distill_alpha. `timers`: the step's phase timers.
  virtual void before_loss(std::vector<Micro>& micros, LossWeights& w, PhaseTimers& timers) = 0;
  // Collective, once the run has finished all its steps (not after a stop or a failure): `student`
  // evaluates the trained model on the validation sample; `record` adds scalars to metrics.h5 at
  // the last step (rank 0 writes).
  virtual void after_run(const std::function<Evaluation()>& student,
                         const std::function<void(const std::map<std::string, double>&)>& record) = 0;
};

struct TrainOptions {
  // `train --init-from FILE` (a checkpoint or a safetensors export): a fresh run's parameters are
  // copied from it by name and logical shape (src/run/run_checkpoints.hpp, init_from), with
  // `init.upcycle` each dense feed-forward into the experts of the MoE block that replaces it.
  std::string init_from;
  InitFromOptions init;  // its seed is the deck's run.seed
  TrainHooks* hooks = nullptr;
};

// `start`: the deck's Startup::training on `mesh` (run/startup.hpp), whose pieces the model is built
// from. Returns the process exit code: kExitOk when the run finished, kExitCheckpointed when a
// signal or run.max_walltime stopped it with a checkpoint, kExitFailure after run.max_bad_steps
// non-finite steps or when a checkpoint is due and the parameters or optimizer state are not
// finite (none written).
int train_main(const Deck& deck, Mesh& mesh, const Startup& start, const std::string& version,
               const TrainOptions& opt = {});

}  // namespace meshmoe
