// The statistics of one training step (docs/user-guide.md "metrics.h5": /loss, /aux_loss, /z_loss,
// /moe/layer<i>/...): summed over this rank's forwards, then over the
// pipeline stages and the data ranks, then turned into the step's figures.
#pragma once
#include <cstddef>
#include <vector>

#include "mesh/comm.hpp"
#include "model/transformer.hpp"

namespace meshmoe {

// One MoE layer's routing in a step (every rank's tokens).
struct MoeLayerStats {
  double dropped = 0;   // fraction of the wanted choices dropped for capacity
  double rerouted = 0;  // fraction of the wanted choices placed by No-Token-Left-Behind
  double declined = 0;  // fraction of the second choices that random / threshold routing declined (0 for top-1)
  double entropy = 0;   // mean over tokens of the router softmax's entropy (nats; ln E when uniform)
  double capacity = 0;  // C, slots per expert and routing group
  double bias_max_abs = 0;  // moe.balance = bias: max |selection bias| in the step's forwards
  std::vector<double> experts_per_token;  // [4] fraction of the routed tokens with 0, 1, 2, >= 3 experts
  double wanted = 0;  // choices meant to be dispatched (the denominator of dropped and rerouted)
  // [E] choices dropped and declined by the expert chosen, rerouted by the expert that took them:
  // counts whose sums over the experts are dropped x wanted, rerouted x wanted and declined x the
  // second choices
  std::vector<double> expert_dropped, expert_rerouted, expert_declined;
};

struct StepStats {
  double loss = 0, aux = 0, z = 0, grad_norm = 0, lr = 0;
  // Distillation: cross-entropy per target token against the teacher's probabilities; NaN without.
  double soft_loss = 0;
  bool distill = false;
  std::vector<std::vector<double>> load;  // [moe layer][E] fraction of the step's dispatched choices
  std::vector<std::vector<double>> load_count;  // [moe layer][E] the step's dispatched choices (counts)
  std::vector<MoeLayerStats> moe;         // [moe layer]
  bool skipped = false;  // non-finite loss or gradient norm: no update
  bool empty = false;    // no target token in the step's batch: no forward, no update
};

class StepSums {
 public:
  StepSums(size_t moe_layers, size_t experts)
      : layers_(moe_layers, MoeLayerSums{std::vector<double>(experts, 0.0), std::vector<double>(experts, 0.0),
                                         std::vector<double>(experts, 0.0), std::vector<double>(experts, 0.0)}) {}

  // One forward's statistics: its loss sums and, for the MoE layers `moe` of this stage (the first
  // of them is the model's `first_moe_layer`-th, so that the stages' sums add up), the choices
  // dispatched to each expert, wanted and dropped.
  void add(const ForwardStats& f, const std::vector<const MoeLayer<float>*>& moe, size_t first_moe_layer);

  // Sums over the pipeline stages, then the data ranks: every sum in one buffer, one all-reduce
  // per axis.
  void all_reduce(Comm& pipe, Comm& data);

  double target_tokens() const { return mask_; }

  // The step's figures for a batch of `tokens` tokens in `groups` routing groups: cross-entropy per
  // target token (NaN when the batch holds none), load-balancing loss per group, z-loss per token,
  // and per MoE layer the load fractions and its routing (MoeLayerStats).
  StepStats stats(double tokens, double groups) const;

 private:
  struct MoeLayerSums {
    std::vector<double> load;  // [E] choices dispatched to each expert
    std::vector<double> expert_dropped, expert_rerouted, expert_declined;  // [E] (MoeLayerStats)
    double wanted = 0, dropped = 0, rerouted = 0, declined = 0, second_choices = 0;
    double tokens = 0, entropy = 0;  // routed tokens, sum of their router entropies
    double capacity = 0, forwards = 0;  // sum of C over the forwards that ran the layer, their count
    double bias_max_abs = 0;            // its sum over those forwards
    std::vector<double> experts_per_token = std::vector<double>(MoeStats::kExpertCountBins, 0.0);  // token counts
  };
  double ce_ = 0, mask_ = 0, aux_ = 0, z_ = 0;  // cross-entropy, target tokens, aux and z losses
  double soft_ = 0;                             // distillation: cross-entropy against the soft targets
  std::vector<MoeLayerSums> layers_;          // every MoE layer of the model
};

}  // namespace meshmoe
