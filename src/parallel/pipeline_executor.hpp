// How one step's batch moves through this rank's part of the mesh: the micro-batches of the data
// axis, and the 1F1B pipeline schedule over the pipe axis (Pipeline-MoE section 3.3.5; the
// schedule itself is pipeline_schedule.hpp). The trainer calls train() once per step and
// forward_only() for each evaluation micro-batch.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/timers.hpp"
#include "data/batcher.hpp"
#include "mesh/mesh.hpp"
#include "model/transformer.hpp"

namespace meshmoe {

// This rank's part of the model on `mesh`: its coordinates and the communicators of its layers.
inline ModelSharding model_sharding(Mesh& mesh) {
  ModelSharding sh;
  sh.tensor_rank = mesh.coord(Axis::Tensor);
  sh.tensor_size = mesh.extent(Axis::Tensor);
  sh.tensor = &mesh.axis(Axis::Tensor);
  sh.pipe_rank = mesh.coord(Axis::Pipe);
  sh.pipe_size = mesh.extent(Axis::Pipe);
  sh.data = &mesh.axis(Axis::Data);
  sh.data_rank = mesh.coord(Axis::Data);
  sh.data_size = mesh.extent(Axis::Data);
  return sh;
}

// One micro-batch of this rank: its rows of the global batch and the context keyed by them.
struct Micro {
  Batch rows;
  StepContext ctx;
  MicroBatch view() const { return MicroBatch{rows.rows, rows.seq_len, rows.inputs.data(), rows.targets.data(), rows.mask.data()}; }
};

// The step's global batch is split into `micro_batches` micro-batches of consecutive rows, and each
// micro-batch over the data axis (this rank is coordinate `d` of `data`): the token groups, and so
// the routing, do not depend on the mesh. Random numbers are keyed by the rows' global token index.
std::vector<Micro> split_micro_batches(const Batch& batch, int micro_batches, int data, int d, uint64_t seed, int64_t step,
                                       bool training, PhaseTimers* timers);

class PipelineExecutor {
 public:
  PipelineExecutor(Transformer<float>& model, Mesh& mesh, PhaseTimers& timers) : model_(model), mesh_(mesh), timers_(timers) {}

  // Forward and backward of every micro-batch through this stage on the 1F1B schedule. Activations
  // go to the next stage and gradients to the previous one by send/recv over the pipe axis. A stage
  // keeps only each in-flight micro-batch's input and recomputes its forward before the backward
  // when a later forward has run in between (the layers hold one micro-batch's saved activations).
  // Without a pipeline this is forward, backward for each micro-batch in turn. `on_forward` sees
  // the statistics of every forward (recomputes excluded).
  void train(std::vector<Micro>& micros, const LossWeights& w, const std::function<void(const ForwardStats&)>& on_forward);

  // The first non-finite layer output this rank saw in the last train() ("" when none).
  const std::string& first_nonfinite() const { return first_nonfinite_; }

  // Evaluation: the forward of one micro-batch (the `index`-th of its batch) through this stage:
  // received from the previous stage, sent on to the next. The statistics count on the last stage.
  ForwardStats forward_only(const Micro& mb, int index);

  // With tied embeddings on a pipeline, the first stage's token embedding and the last stage's copy
  // of it (the output projection) are one parameter: both get the sum of the two gradients.
  void sync_tied_embedding(bool tied_embeddings);

 private:
  Transformer<float>& model_;
  Mesh& mesh_;
  PhaseTimers& timers_;
  std::string first_nonfinite_;
  Buffer<float> eval_x_;
};

}  // namespace meshmoe
