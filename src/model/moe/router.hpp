// The MoE router: softmax or sigmoid gating (moe.gate, router_equations.hpp "Scores and gates"), top-k choice with per-group expert capacity, random routing of the
// second expert, No-Token-Left-Behind, load-balancing and z losses (GShard section 2.2 / Algorithm 1,
// Switch sections 2.1-2.4 and appendices B, C, F); or expert choice, each expert taking its top-C
// tokens of the group (Zhou et al. 2022, section 3.1).
//
// Its output is a list of (expert, slot, gate) triples, one per (token, choice): the index form that
// the dispatchers consume. The einsum oracle builds GShard's dense dispatch/combine tensors from the
// same triples.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/context.hpp"
#include "model/moe/moe_options.hpp"
#include "model/params.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

// Routing decisions for N = G * S local tokens, k choices each. Choice c = n * k + i is the i-th
// choice of token n (i = 0 the best expert); its slot is a position in the buffer of expert
// expert[c] for group n / S. Expert choice (moe.router = expert_choice): k = E and choice
// c = n * E + e is expert e's, kDropped when e did not take token n.
template <typename T>
struct Routing {
  int N = 0, k = 0, S = 0, G = 0, C = 0, E = 0;
  static constexpr int kDropped = -1;   // expert[c] of a choice lost to capacity
  static constexpr int kDeclined = -2;  // expert[c] of a second choice not taken by random/threshold routing
  Buffer<int> expert;         // [N*k] expert of the choice, < 0 when not dispatched (kDropped, kDeclined)
  Buffer<int> slot;           // [N*k] slot in [0, C), -1 when not dispatched
  Buffer<T> gate;             // [N*k] combine weight, 0 when not dispatched
  std::vector<int64_t> load;  // [E] choices dispatched to each expert (all local groups)
  int64_t wanted = 0;         // choices meant to be dispatched (N*k - declined)
  int64_t dropped = 0;        // of those, choices lost to capacity (after NTLB rerouting)
  int64_t rerouted = 0;       // choices placed by NTLB
  int64_t declined = 0;       // second choices not dispatched by random / threshold routing
  // [E] the three above per expert: dropped and declined by the expert chosen, rerouted by the
  // expert that took the choice (each sums to its count above)
  std::vector<int64_t> expert_dropped, expert_rerouted, expert_declined;
  static constexpr int kPlacedBins = 4;
  std::vector<int64_t> experts_per_token;  // [kPlacedBins] tokens with 0, 1, 2, >= 3 experts
};

// Auxiliary-loss-free balancing (Wang et al. 2024, as DeepSeek-V3 uses it): after a step with
// `load` [E] choices dispatched to each expert (all ranks' tokens), bias[e] += rate * sign(mean load
// - load[e]): an underloaded expert becomes likelier to be selected, an overloaded one less.
void update_selection_bias(float* bias, const double* load, int E, double rate);

template <typename T>
class Router {
 public:
  explicit Router(const MoeOptions& opt);

  // prefix.wg [M, E], fan_in M.
  void declare(ParamStore<T>& store, const std::string& prefix);

  // The forward in two parts, so that the totals reach the host with the step's other scalars
  // (MoeLayer::record_stats, tensor/step_scalars.hpp): route, x [N, M] -> routing()'s triples and
  // the totals (totals(), device memory), device work only; take_totals(the host's copy of them):
  // routing()'s load and counts, aux_sum
  // (sum over local groups of the load-balancing loss of moe.aux_loss_form: Switch eq. 4 without
  // alpha, or GShard Algorithm 1 line 13; router_equations.hpp), z_sum (sum over tokens of the
  // z-loss terms logsumexp(logits)^2: each group's in token order, then over the groups) and
  // entropy_sum. N must be a multiple of group_size.
  void route(const StepContext& ctx, const T* x, int N);
  const Buffer<double>& totals() const { return totals_; }
  void take_totals(const double* totals);
  void read_totals();  // take_totals of a copy of totals() (a transfer point: a wait)
  // dgate [N*k] (d loss / d gate of each choice; ignored where not dispatched) -> dx [N, M] (added),
  // wg.g (added). The aux and z terms enter with weights aux_weight and z_weight (the trainer's
  // balance_loss_weight and z_loss_weight, router_equations.hpp).
  void backward(const StepContext& ctx, const T* dgate, T* dx, int N, double aux_weight, double z_weight);

  // What backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(jittered_);
    f(jitter_);
    f(xj_);
    f(probs_);
    f(lse_);
    f(top_);
    f(norm_);
    f(frac_);
    f(r_);
  }

  // moe.balance = bias: the selection bias [E] (state, not a parameter: checkpointed beside the
  // optimizer state; the same on every rank). Added to the probabilities for the top-k choice only.
  Buffer<float> selection_bias;
  // The step's update from its loads (update_selection_bias; nothing without a bias).
  void update_bias(std::span<const double> load);
  double bias_max_abs() const;

  const Routing<T>& routing() const { return r_; }
  // Tests only: the last forward's [N, E] softmax of the router logits (sigmoid: the scores), kept
  // for the backward.
  const Buffer<T>& probs() const { return probs_; }
  double aux_sum = 0, z_sum = 0;
  double entropy_sum = 0;  // sum over tokens of the entropy (nats) of the token's router softmax
  ParamView<T> wg;  // [M, E]

 private:
  MoeOptions opt_;
  void route_expert_choice(int N, int S, int G, int C);  // forward's routing for moe.router = expert_choice
  void sum_totals(const int64_t* group_stats, const int* top);  // into totals_ (device work)
  const float* bias() const { return selection_bias.empty() ? nullptr : selection_bias.data(); }
  bool jittered_ = false;
  Buffer<T> jitter_;      // [N, M] multipliers in [1-eps, 1+eps) (training with jitter only)
  Buffer<T> xj_;          // [N, M] jittered router input
  Buffer<T> logits_;      // [N, E]
  Buffer<T> probs_;       // [N, E] softmax probabilities, or sigmoid scores (moe.gate = sigmoid)
  Buffer<double> lse_;    // [N] logsumexp of the logits; sigmoid: the sum of the token's scores
  Buffer<int> top_;       // [N*k] the token's k best experts, best first (before capacity)
  Buffer<double> norm_;   // [N] gate normaliser Z (sum of the top-k probabilities; 1 for top1)
  Buffer<double> frac_;   // [G, E] Switch eq. 5: fraction of the group's tokens with top-1 = e (switch_balance_terms)
  Routing<T> r_;
  // Scratch, not saved state (members so that a step does not allocate them). Forward: want [N*k]
  // (choice wants dispatch), and per group count [G, E], position [G, E], dropped [N*k], stats
  // [G, RouterTotalsLayout::group_width()] (RouterAssignGroup), the Switch load-balancing terms
  // balance_term [G, E], the totals and their per-group terms (sum_totals). Backward: dxr [N, M] (jitter only).
  Buffer<uint8_t> want_, dropped_;
  Buffer<int> count_, position_;
  Buffer<double> balance_term_;
  Buffer<int64_t> group_stats_;
  Buffer<double> group_terms_, totals_;  // [G, RouterTotalsLayout] and [RouterTotalsLayout]
  Buffer<T> dxr_;
};

}  // namespace meshmoe
