// The statistics of one training step (README "metrics.h5": /loss, /aux_loss, /z_loss,
// /moe/layer<i>/expert_load and dropped_fraction): summed over this rank's forwards, then over the
// pipeline stages and the data ranks, then turned into the step's figures.
#pragma once
#include <cstddef>
#include <vector>

#include "mesh/comm.hpp"
#include "model/transformer.hpp"

namespace meshmoe {

struct StepStats {
  double loss = 0, aux = 0, z = 0, grad_norm = 0, lr = 0;
  std::vector<std::vector<double>> load;  // [moe layer][E] fraction of the step's dispatched choices
  std::vector<double> dropped;            // [moe layer] dropped fraction
  bool skipped = false;  // non-finite loss or gradient norm: no update
  bool empty = false;    // no target token in the step's batch: no forward, no update
};

class StepSums {
 public:
  StepSums(size_t moe_layers, size_t experts) : layers_(moe_layers), experts_(experts), v_(4 + moe_layers * (experts + 2), 0.0) {}

  // One forward's statistics: its loss sums and, for the MoE layers `moe` of this stage (the first
  // of them is the model's `first_moe_layer`-th, so that the stages' sums add up), the choices
  // dispatched to each expert, wanted and dropped.
  void add(const ForwardStats& f, const std::vector<const MoeLayer<float>*>& moe, size_t first_moe_layer);

  // Sums over the pipeline stages, then the data ranks (one flat all-reduce each).
  void all_reduce(Comm& pipe, Comm& data) {
    pipe.all_reduce(v_.data(), v_.size(), Op::Sum);
    data.all_reduce(v_.data(), v_.size(), Op::Sum);
  }

  double target_tokens() const { return v_[1]; }

  // The step's figures for a batch of `tokens` tokens in `groups` routing groups: cross-entropy per
  // target token (NaN when the batch holds none), load-balancing loss per group, z-loss per token,
  // and per MoE layer the load fractions and the dropped fraction.
  StepStats stats(double tokens, double groups) const;

 private:
  double* layer(size_t l) { return &v_[4 + l * (experts_ + 2)]; }
  const double* layer(size_t l) const { return &v_[4 + l * (experts_ + 2)]; }
  size_t layers_, experts_;
  std::vector<double> v_;  // ce, mask, aux, z, then per MoE layer: load[E], wanted, dropped
};

}  // namespace meshmoe
