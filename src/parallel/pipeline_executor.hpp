// How one step's batch moves through this rank's part of the mesh: the micro-batches of the data
// axis, and the 1F1B pipeline schedule over the pipe axis (Pipeline-MoE section 3.3.5; the
// schedule itself is pipeline_schedule.hpp). The trainer calls train() once per step and
// forward_only() for each evaluation micro-batch.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/timers.hpp"
#include "data/batcher.hpp"
#include "mesh/mesh.hpp"
#include "model/activation_stash.hpp"
#include "model/transformer.hpp"
#include "parallel/pipeline_schedule.hpp"

namespace meshmoe {

// One micro-batch of this rank: its rows of the global batch and the context keyed by them.
struct Micro {
  Batch rows;
  StepContext ctx;
  const float* soft_targets = nullptr;  // distillation: MicroBatch::soft_targets (TrainHooks::before_loss)
  MicroBatch view() const {
    const bool packed = !rows.segment.empty();
    MicroBatch mb{rows.rows,        rows.seq_len,
                  rows.inputs.data(), rows.targets.data(),
                  rows.mask.data(), packed ? rows.segment.data() : nullptr,
                  packed ? rows.position.data() : nullptr};
    if (rows.enc_len > 0)
      mb.enc_len = rows.enc_len, mb.enc_inputs = rows.enc_inputs.data(), mb.enc_segment = rows.enc_segment.data(),
      mb.enc_position = rows.enc_position.data();
    mb.soft_targets = soft_targets;
    return mb;
  }
};

// The step's global batch is split into `micro_batches` micro-batches of consecutive rows, and each
// micro-batch over the data axis (this rank is coordinate `d` of `data`): the token groups, and so
// the routing, do not depend on the mesh. Random numbers are keyed by the rows' global token index.
std::vector<Micro> split_micro_batches(const Batch& batch, int micro_batches, int data, int d, uint64_t seed, int64_t step,
                                       bool training, PhaseTimers* timers);

class PipelineExecutor {
 public:
  PipelineExecutor(Transformer<float>& model, Mesh& mesh, PhaseTimers& timers, Recompute recompute = Recompute::None)
      : model_(model), mesh_(mesh), timers_(timers), recompute_(recompute) {}

  // Forward and backward of every micro-batch through this stage on the 1F1B schedule. Activations
  // go to the next stage and gradients to the previous one by send/recv over the pipe axis.
  // Recompute::None: when a forward runs while an earlier micro-batch still awaits its backward,
  // the layers' saved state of that one is parked in a stash and swapped back before its backward
  // (at most P-p-1 parked on stage p: the 1F1B bound of P-p in flight, one of them in the layers).
  // Recompute::Block: a stage keeps only each in-flight micro-batch's input and recomputes its
  // forward before the backward when a later forward has run in between (phase
  // pipeline_recompute). Both give bitwise the same gradients. Without a pipeline this is
  // forward, backward for each micro-batch in turn. `on_forward` sees the statistics of every
  // forward (recomputes excluded).
  void train(std::vector<Micro>& micros, const LossWeights& w, const std::function<void(const ForwardStats&)>& on_forward);

  // Since the last take_bubble(): seconds this rank waited on the pipe axis (receives and the
  // step's final send wait) and seconds it spent in train(). Their ratio is the rank's measured
  // bubble fraction (0 without a pipeline).
  struct Bubble {
    double wait_s = 0, train_s = 0;
  };
  Bubble take_bubble() { return std::exchange(bubble_, Bubble{}); }
  // Tests only: the most micro-batches parked at once in the last train() (Recompute::None's stash).
  int parked_peak() const { return parked_peak_; }

  // The first non-finite layer output this rank saw in the last train() ("" when none).
  const std::string& first_nonfinite() const { return first_nonfinite_; }

  // Evaluation: the forward of one micro-batch (the `index`-th of its batch) through this stage:
  // received from the previous stage, sent on to the next. The statistics count on the last stage.
  // `ctx`: the forward's context, by default the micro-batch's own (distillation's teacher runs
  // the student's micro-batches in evaluation mode).
  ForwardStats forward_only(const Micro& mb, int index) { return forward_only(mb, index, mb.ctx); }
  ForwardStats forward_only(const Micro& mb, int index, const StepContext& ctx);

  // With tied embeddings on a pipeline, the first stage's token embedding and the last stage's copy
  // of it (the output projection) are one parameter: both get the sum of the two gradients.
  void sync_tied_embedding(bool tied_embeddings);

 private:
  // Parks the layers' state of micro-batch `micro` in a free stash.
  void park(int micro);
  // Brings micro-batch `micro`'s state back into the layers; the state they held goes into its
  // stash, owned by `displaced` (-1: nobody needs it, the stash is free).
  void unpark(int micro, int displaced);

  Transformer<float>& model_;
  Mesh& mesh_;
  PhaseTimers& timers_;
  Recompute recompute_;
  std::string first_nonfinite_;
  Buffer<float> eval_x_;
  std::vector<ActivationStash> stash_;  // P-p-1 on stage p; reused over steps (buffers circulate)
  std::vector<int> stash_owner_;        // micro-batch parked in stash_[i], -1 when free
  int parked_peak_ = 0;
  Bubble bubble_;
};

}  // namespace meshmoe
