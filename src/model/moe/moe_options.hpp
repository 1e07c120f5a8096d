// Settings of one MoE layer, filled by the trainer from the deck's [moe] section (moe_options(cfg)),
// and the capacity of a forward's groups shared by the router, the dispatchers and the sharding code.
#pragma once
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "deck/config.hpp"
#include "model/activation.hpp"
#include "model/moe/router_equations.hpp"

namespace meshmoe {

struct MoeOptions {
  int d_model = 0;          // M
  int num_experts = 0;      // E (global)
  int d_ff = 0;             // H of each expert
  Activation activation = Activation::Relu;
  RouterKind router = RouterKind::Top2;
  int top_k = 2;            // used when router = TopK
  int group_size = 0;       // S
  double capacity_factor_train = 1.25;
  double capacity_factor_eval = 2.0;
  bool dropless = false;
  DecodeCapacity decode_capacity = DecodeCapacity::Dropless;
  SecondExpertPolicy second_expert = SecondExpertPolicy::Random;
  double second_expert_threshold = 0.2;
  bool declined_takes_slot = false;  // GShard Algorithm 1 line 22 literally (router.cpp)
  bool no_token_left_behind = false;
  AuxLossForm aux_loss_form = AuxLossForm::Switch;
  double jitter_eps = 0.0;
  double expert_dropout = 0.0;
  int shared_experts = 0;   // n shared experts of width d_ff, every token through them (moe_layer.hpp)
  BalanceKind balance = BalanceKind::AuxLoss;  // aux_loss, or bias: the router's selection bias (router.hpp)
  double bias_update_rate = 1e-3;              // u of the selection-bias update
  MoeGate gate = MoeGate::Softmax;             // scores and gate weights (router_equations.hpp "Gates")
  double routed_scale = 1.0;                   // y = routed_scale * sum of gated expert outputs + shared
  uint32_t layer_id = 0;    // keys this layer's random streams (Rng layer field)

  // Hidden width of the shared experts as one feed-forward: n x H (moe_layer.hpp).
  int shared_hidden() const { return shared_experts * d_ff; }

  // Choices per token: 1, 2 or top_k; expert choice: E, choice e of a token being expert e's (taken
  // or not: router.hpp).
  int k() const {
    switch (router) {
      case RouterKind::Top1: return 1;
      case RouterKind::Top2: return 2;
      case RouterKind::TopK: return top_k;
      case RouterKind::ExpertChoice: return num_experts;
    }
    return top_k;
  }
  bool expert_choice() const { return router == RouterKind::ExpertChoice; }
  // Gates renormalised over the token's chosen experts (router_equations.hpp "Scores and gates"):
  // top-2 and top-k with moe.gate = softmax, any k with softmax_topk or sigmoid; the router
  // probability itself with softmax top-1 (Switch eq. 2), softmax_unnormalised and expert choice
  // (Zhou et al. section 3.1).
  bool renormalised() const {
    if (expert_choice() || gate == MoeGate::SoftmaxUnnormalised) return false;
    return gate != MoeGate::Softmax || router == RouterKind::Top2 || router == RouterKind::TopK;
  }
  bool sigmoid() const { return gate == MoeGate::Sigmoid; }

  // Capacity per group per expert (expert_capacity: GShard section 2.2, Switch section 2.2 eq. 3;
  // docs/ARCHITECTURE.md "Principles" 1): the factor chosen by training/eval, k choices per token (1
  // under expert choice); dropless -> C = S. S: the tokens per group of this forward when not
  // moe.group_size (StepContext::moe_group_size).
  int capacity(bool training, int S = 0) const {
    const int group_size = S > 0 ? S : this->group_size;
    if (dropless) return group_size;
    return expert_capacity(expert_choice() ? 1 : k(), group_size, num_experts,
                           training ? capacity_factor_train : capacity_factor_eval);
  }
  // Decoding's groups are a step's new tokens (a few per stream): a capacity factor there drops
  // choices that the same tokens in a moe.group_size group would keep (docs/user-guide.md "Translation"), so
  // decoding is dropless unless moe.decode_capacity = eval.
  int decode_capacity_of(int S) const { return decode_capacity == DecodeCapacity::Dropless ? S : capacity(false, S); }

  // Throws InputError for settings the layer cannot run (the deck schema checks ranges; this checks
  // the combinations).
  void validate() const {
    auto bad = [](const std::string& m) { throw InputError(m); };
    if (d_model < 1 || d_ff < 1 || group_size < 1) bad("moe: d_model, expert d_ff and moe.group_size must be >= 1");
    if (num_experts < 1) bad("moe.num_experts must be >= 1");
    if (k() < 1) bad("moe.top_k must be >= 1");
    if (k() > num_experts)
      bad("moe: " + std::to_string(k()) + " experts per token (moe.router / moe.top_k) but only moe.num_experts = " +
          std::to_string(num_experts) + " experts; use fewer choices or more experts");
    if (jitter_eps < 0 || jitter_eps >= 1) bad("moe.jitter_eps must be in [0, 1)");
    if (expert_dropout < 0 || expert_dropout >= 1) bad("moe.expert_dropout must be in [0, 1)");
    if (shared_experts < 0) bad("moe.shared_experts must be >= 0");
    if (bias_update_rate < 0) bad("moe.bias_update_rate must be >= 0");
    if (!(routed_scale > 0)) bad("moe.routed_scale must be > 0");
    if (expert_choice() && gate != MoeGate::Softmax)
      bad("moe.router = \"expert_choice\" needs moe.gate = \"softmax\" (each expert ranks tokens by their softmax "
          "probability)");
    if (expert_choice() && (dropless || no_token_left_behind || balance == BalanceKind::Bias))
      bad("moe.router = \"expert_choice\" does not combine with moe.dropless, moe.no_token_left_behind or "
          "moe.balance = \"bias\" (each expert takes its top-C tokens: nothing to drop, reroute or balance)");
  }
};

// [moe] and [model] keys -> options of MoE layer `layer_id`.
inline MoeOptions moe_options(const Config& cfg, uint32_t layer_id) {
  MoeOptions o;
  o.d_model = int(cfg.model.d_model);
  o.num_experts = int(cfg.moe.num_experts);
  o.d_ff = int(cfg.moe.expert_d_ff > 0 ? cfg.moe.expert_d_ff : cfg.model.d_ff);
  o.activation = cfg.model.activation;
  o.router = cfg.moe.router;
  o.top_k = int(cfg.moe.top_k);
  o.group_size = int(cfg.moe.group_size);
  o.capacity_factor_train = cfg.moe.capacity_factor_train;
  o.capacity_factor_eval = cfg.moe.capacity_factor_eval;
  o.dropless = cfg.moe.dropless;
  o.decode_capacity = cfg.moe.decode_capacity;
  o.second_expert = cfg.moe.second_expert;
  o.second_expert_threshold = cfg.moe.second_expert_threshold;
  o.declined_takes_slot = cfg.moe.declined_takes_slot;
  o.no_token_left_behind = cfg.moe.no_token_left_behind;
  o.aux_loss_form = cfg.moe.aux_loss_form;
  o.jitter_eps = cfg.moe.jitter_eps;
  o.expert_dropout = cfg.moe.expert_dropout;
  o.shared_experts = int(cfg.moe.shared_experts);
  o.balance = cfg.moe.balance;
  o.bias_update_rate = cfg.moe.bias_update_rate;
  o.gate = cfg.moe.gate;
  o.routed_scale = cfg.moe.routed_scale;
  o.layer_id = layer_id;
  o.validate();
  return o;
}

}  // namespace meshmoe
