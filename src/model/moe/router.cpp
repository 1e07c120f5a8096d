#include "model/moe/router.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "core/error.hpp"
#include "core/philox.hpp"
#include "model/layer_shapes.hpp"
#include "model/moe/router_bodies.hpp"
#include "tensor/blas.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

static_assert(RouterAssignGroup<float>::kDropped == Routing<float>::kDropped &&
              RouterAssignGroup<float>::kDeclined == Routing<float>::kDeclined &&
              RouterExpertChoiceColumn<float>::kDropped == Routing<float>::kDropped);

template <typename T>
void Router<T>::declare(ParamStore<T>& store, const std::string& prefix) {
  declare_params(store, router_params(prefix, opt_.d_model, opt_.num_experts), {&wg});
}

// x [N, M] -> logits [N, E] -> probs [N, E] -> triples (expert, slot, gate) [N*k], then the totals
template <typename T>
void Router<T>::route(const StepContext& ctx, const T* x, int N) {
  const int M = opt_.d_model, E = opt_.num_experts, k = opt_.k();
  const int S = ctx.moe_group_size > 0 ? ctx.moe_group_size : opt_.group_size;
  if (N % S != 0)
    throw InputError("MoE layer got " + std::to_string(N) + " tokens, not a multiple of moe.group_size = " +
                     std::to_string(S));
  const int G = N / S, C = ctx.decoding ? opt_.decode_capacity_of(S) : opt_.capacity(ctx.training, S);

  // Switch appendix C: multiplicative jitter on the router input, training only. Keyed by global
  // token index * M + m so that sharding does not change it.
  const T* xr = x;
  jittered_ = ctx.training && opt_.jitter_eps > 0;
  xj_.resize(size_t(N) * M);
  if (jittered_) {
    jitter_.resize(size_t(N) * M);
    const Rng rng{ctx.seed, ctx.step, opt_.layer_id, RngPurpose::Jitter};
    for_each_index_2d(N, M,
                      RouterJitterElement<T>{.rng = rng,
                                             .token_offset = ctx.token_offset,
                                             .x = x,
                                             .jitter = jitter_.data(),
                                             .xj = xj_.data(),
                                             .M = M,
                                             .eps = opt_.jitter_eps});
    xr = xj_.data();
  } else {
    copy_from(xj_.data(), x, size_t(N) * M);  // backward needs the router input for dwg
  }

  // GShard Algorithm 2 line 1: gates = softmax(einsum(GSM,ME->GSE)). Softmax accumulated in double
  // (Switch section 2.4: the router in float32 at least; its GEMMs keep fp32 operands with
  // model.precision = bf16 too).
  logits_.resize(size_t(N) * E);
  probs_.resize(size_t(N) * E);
  lse_.resize(N);
  // moe.gate = sigmoid (DeepSeek-V3 section 2.1.2): sigmoid scores instead, lse_ holding their sum.
  matmul_fp32(false, false, N, E, M, xr, wg.w, logits_.data());
  if (opt_.sigmoid())
    for_each_index(N, RouterSigmoidRow<T>{.logits = logits_.data(), .probs = probs_.data(), .row_sum = lse_.data(), .E = E});
  else
    for_each_index(N, RouterSoftmaxRow<T>{.logits = logits_.data(), .probs = probs_.data(), .lse = lse_.data(), .E = E});
  if (opt_.expert_choice()) {
    route_expert_choice(N, S, G, C);
    return;
  }

  // Top-k experts per token, best first; ties go to the lower expert index. Top-1 (Switch eq. 2):
  // gate = p_top1, not renormalised. Top-2 (GShard Algorithm 1 lines 6, 16) and top-k, and any k with
  // moe.gate = softmax_topk or sigmoid: gates renormalised over the k chosen experts (routed_gate). Which choices want dispatch: all, except the top-2
  // second expert under random routing (training only: evaluation dispatches it always) or
  // threshold routing (train and eval).
  top_.resize(size_t(N) * k);
  norm_.resize(N);
  want_.resize(size_t(N) * k);
  {
    const bool top2 = opt_.router == RouterKind::Top2;
    const bool random_second = top2 && opt_.second_expert == SecondExpertPolicy::Random && ctx.training;
    const bool threshold_second = top2 && opt_.second_expert == SecondExpertPolicy::Threshold;
    const Rng rng{ctx.seed, ctx.step, opt_.layer_id, RngPurpose::SecondExpert};
    for_each_index(N, RouterTopChoicesRow<T>{.rng = rng,
                                             .token_offset = ctx.token_offset,
                                             .probs = probs_.data(),
                                             .top = top_.data(),
                                             .norm = norm_.data(),
                                             .want = want_.data(),
                                             .E = E,
                                             .k = k,
                                             .renorm = opt_.renormalised(),
                                             .random_second = random_second,
                                             .threshold_second = threshold_second,
                                             .threshold = opt_.second_expert_threshold,
                                             .bias = bias()});
  }

  // Slot assignment per group (GShard "local group dispatching"): first choices fill capacity in token
  // order, then second choices, ... So a 2nd-choice token's position is the count of 1st-choice tokens
  // kept by that expert plus its rank among the 2nd choices (Algorithm 1 lines 8 and 18; as in
  // mesh-tensorflow, declined random-routing choices take no position). Choices over capacity are
  // dropped: output 0, the residual carries the token. moe.declined_takes_slot reads Algorithm 1
  // line 22 literally instead: "c_e2 <- c + 1" sits after the if, so a declined second choice
  // advances its expert's position counter too and leaves its slot empty (a zero row of the expert
  // buffer, dispatcher.hpp); the load counts the filled slots only.
  //
  // No-Token-Left-Behind (Switch appendix B, Figure 11). Rule: after the plain assignment, the
  // dropped choices of the group are visited in choice order, then token order (all dropped first
  // choices first, as the stages above); each goes to the best-ranked expert (by router probability)
  // that is not among the token's k original choices, does not already hold one of its rerouted
  // choices, and still has room. Gate = p(new expert) / Z, Z the token's usual normaliser (1 for
  // top1, so the gate is the router probability of the expert that actually processes it). Since
  // experts only fill up, this single pass equals iterating Switch's "route the overflowed tokens to
  // their next-highest expert" stages until nothing moves, with full experts skipped at once. It only
  // adds placements: it never drops more than plain routing.
  //
  // On the host each group is one body, sequential in its tokens (RouterAssignGroup). Where the
  // buffers live on a device the slots come from prefix sums instead, a warp per (group, expert)
  // on the GPU (RouterSlotsByScan), then a warp per group for its totals and NTLB, whose dropped
  // choices are found by ballots and whose experts are ranked by the lanes (RouterAssignRest): the
  // same bits. The loss terms are apart, with the totals (sum_totals).
  r_.N = N, r_.k = k, r_.S = S, r_.G = G, r_.C = C, r_.E = E;
  r_.expert.resize(size_t(N) * k);
  r_.slot.resize(size_t(N) * k);
  r_.gate.resize(size_t(N) * k);
  count_.resize(size_t(G) * E);
  position_.resize(size_t(G) * E);
  dropped_.resize(size_t(N) * k);
  const RouterTotalsLayout at{.E = E, .bins = Routing<T>::kPlacedBins};
  group_stats_.resize(size_t(G) * size_t(at.group_width()));
  const RouterAssignGroup<T> assign{.probs = probs_.data(),
                                   .top = top_.data(),
                                   .norm = norm_.data(),
                                   .want = want_.data(),
                                   .expert = r_.expert.data(),
                                   .slot = r_.slot.data(),
                                   .gate = r_.gate.data(),
                                   .count = count_.data(),
                                   .position = position_.data(),
                                   .dropped = dropped_.data(),
                                   .stats = group_stats_.data(),
                                   .at = at,
                                   .S = S,
                                   .k = k,
                                   .E = E,
                                   .C = C,
                                   .ntlb = opt_.no_token_left_behind,
                                   .declined_takes_slot = opt_.declined_takes_slot,
                                   .bias = bias(),
                                   .scale = opt_.routed_scale};
  if (buffers_on_device()) {
    const RouterSlotsByScan<T> scan{assign};
    const RouterAssignRest<T> rest{assign};
#ifdef MESHMOE_CUDA
    if (current_device() == Device::Cuda) {
      launch_router_warps(scan, int64_t(G) * E, "RouterSlotsByScan (a warp per group and expert)");
      launch_router_warps(rest, G, "RouterAssignRest (a warp per group)");
    } else
#endif
    {
      for_each_index(int64_t(G) * E, scan, int64_t(S) * k);
      for_each_index(G, rest, int64_t(S) * k * E);
    }
  } else {
    for_each_index(G, assign);
  }

  frac_.resize(size_t(G) * E);
  balance_term_.resize(size_t(G) * E);
  sum_totals(group_stats_.data(), top_.data());
}

// The routing's loss terms and totals over tokens and groups, on the device into totals_
// (RouterGroupTerms, then RouterTotals; the host's copy into take_totals). group_stats and top nullptr: expert
// choice (no load-balancing loss).
template <typename T>
void Router<T>::sum_totals(const int64_t* group_stats, const int* top) {
  const RouterTotalsLayout at{.E = opt_.num_experts, .bins = Routing<T>::kPlacedBins};
  group_terms_.resize(size_t(r_.G) * size_t(at.size()));
  totals_.resize(size_t(at.size()));
  for_each_index(r_.G,
                 RouterGroupTerms<T>{.probs = probs_.data(),
                                     .logits = logits_.data(),
                                     .lse = lse_.data(),
                                     .top = top,
                                     .expert = r_.expert.data(),
                                     .frac = top ? frac_.data() : nullptr,
                                     .balance_term = top ? balance_term_.data() : nullptr,
                                     .terms = group_terms_.data(),
                                     .at = at,
                                     .S = r_.S,
                                     .k = r_.k,
                                     .sigmoid = opt_.sigmoid()},
                 int64_t(r_.S) * at.E);
  for_each_index(1, RouterTotals{.count = count_.data(),
                                 .group_stats = group_stats,
                                 .balance_term = top ? balance_term_.data() : nullptr,
                                 .terms = group_terms_.data(),
                                 .out = totals_.data(),
                                 .at = at,
                                 .G = r_.G});
}

template <typename T>
void Router<T>::read_totals() {
  const std::vector<double> totals = download(totals_);
  take_totals(totals.data());
}

template <typename T>
void Router<T>::take_totals(const double* totals) {
  const int E = opt_.num_experts;
  const RouterTotalsLayout at{.E = E, .bins = Routing<T>::kPlacedBins};
  const auto count = [&](int i) { return int64_t(totals[size_t(i)]); };
  r_.load.resize(size_t(E));
  for (int e = 0; e < E; ++e) r_.load[size_t(e)] = count(at.load() + e);
  r_.wanted = count(at.stat(0));
  r_.declined = count(at.stat(1));
  r_.dropped = count(at.stat(2));
  r_.rerouted = count(at.stat(3));
  for (std::vector<int64_t>* v : {&r_.expert_declined, &r_.expert_dropped, &r_.expert_rerouted}) v->resize(size_t(E));
  for (int e = 0; e < E; ++e) {
    r_.expert_declined[size_t(e)] = count(at.expert_stat(0, e));
    r_.expert_dropped[size_t(e)] = count(at.expert_stat(1, e));
    r_.expert_rerouted[size_t(e)] = count(at.expert_stat(2, e));
  }
  r_.experts_per_token.resize(size_t(at.bins));
  for (int b = 0; b < at.bins; ++b) r_.experts_per_token[size_t(b)] = count(at.placed(b));
  aux_sum = totals[size_t(at.aux())] * balance_loss_form_scale(opt_.aux_loss_form, E);
  z_sum = totals[size_t(at.z())];
  entropy_sum = totals[size_t(at.entropy())];
}

// Expert choice (Zhou et al. 2022, section 3.1): probs [N, E] -> triples [N*E], choice n * E + e
// expert e's take of token n. Each expert takes its top-C tokens of each group (C = ceil(S cf / E),
// MoeOptions::capacity; ties to the lower token index), gate = p[n, e] not renormalised, so a token
// gets 0..E experts; no aux loss (the paper needs none: every expert takes C tokens) and nothing
// dropped, declined or rerouted: the tokens no expert took show in the layer's experts-per-token
// counts. The gate's gradient flows into the router as top-1's (RouterBackwardRow, Z = 1).
template <typename T>
void Router<T>::route_expert_choice(int N, int S, int G, int C) {
  const int E = opt_.num_experts;
  r_.N = N, r_.k = E, r_.S = S, r_.G = G, r_.C = C, r_.E = E;
  r_.expert.resize(size_t(N) * E);
  r_.slot.resize(size_t(N) * E);
  r_.gate.resize(size_t(N) * E);
  count_.resize(size_t(G) * E);
  for_each_index(int64_t(G) * E, RouterExpertChoiceColumn<T>{.probs = probs_.data(),
                                                             .expert = r_.expert.data(),
                                                             .slot = r_.slot.data(),
                                                             .gate = r_.gate.data(),
                                                             .count = count_.data(),
                                                             .S = S,
                                                             .E = E,
                                                             .C = C,
                                                             .scale = opt_.routed_scale});
  // What the backward reads of the top-k path: Z = 1 and f = 0 (no load-balancing loss).
  fill_buffer(norm_, size_t(N), 1.0);
  fill_buffer(frac_, size_t(G) * E, 0.0);
  top_.resize(0);
  sum_totals(nullptr, nullptr);
}

// dgate [N*k] -> dprobs -> dlogits [N, E] -> dwg [M, E] (added), dx [N, M] (added)
template <typename T>
void Router<T>::backward(const StepContext& ctx, const T* dgate, T* dx, int N, double aux_weight, double z_weight) {
  const int M = opt_.d_model, E = opt_.num_experts, S = r_.S, k = opt_.k();  // the forward's groups
  const bool renorm = opt_.renormalised();
  // dlogits and dprobs [N, E] are allocated per call: small, and as members they would make the
  // memory held between steps grow with E (GShard section 5.1 wants it flat as experts grow with ranks).
  Buffer<T> dlogits(size_t(N) * E);
  Buffer<double> dprobs(size_t(N) * E);
  for_each_index(N, RouterBackwardRow<T>{.probs = probs_.data(),
                                         .norm = norm_.data(),
                                         .lse = lse_.data(),
                                         .frac = frac_.data(),
                                         .expert = r_.expert.data(),
                                         .top = top_.data(),
                                         .dgate = dgate,
                                         .dprobs = dprobs.data(),
                                         .dlogits = dlogits.data(),
                                         .E = E,
                                         .k = k,
                                         .S = S,
                                         .renorm = renorm,
                                         .sigmoid = opt_.sigmoid(),
                                         .scale = opt_.routed_scale,
                                         .balance_weight = aux_weight * balance_loss_form_scale(opt_.aux_loss_form, E),
                                         .z_weight = z_weight});
  // logits = xr wg: dwg += xr^T dlogits, dxr = dlogits wg^T, dx += dxr * jitter
  matmul_fp32(true, false, M, E, N, xj_.data(), dlogits.data(), wg.g, true);
  if (!jittered_) {
    matmul_fp32(false, true, N, M, E, dlogits.data(), wg.w, dx, true);
    return;
  }
  dxr_.resize(size_t(N) * M);
  matmul_fp32(false, true, N, M, E, dlogits.data(), wg.w, dxr_.data());
  for_each_index(int64_t(N) * M, RouterJitterBackwardElement<T>{dxr_.data(), jitter_.data(), dx});
}

template <typename T>
Router<T>::Router(const MoeOptions& opt) : opt_(opt) {
  if (opt.balance == BalanceKind::Bias) selection_bias.resize(size_t(opt.num_experts));  // zero
}

void update_selection_bias(float* bias, const double* load, int E, double rate) {
  double total = 0;
  for (int e = 0; e < E; ++e) total += load[e];
  const double mean = total / E;
  for (int e = 0; e < E; ++e) {
    const double sign = load[e] < mean ? 1.0 : load[e] > mean ? -1.0 : 0.0;
    bias[e] = float(double(bias[e]) + rate * sign);
  }
}

template <typename T>
void Router<T>::update_bias(std::span<const double> load) {
  if (selection_bias.empty()) return;
  if (load.size() != selection_bias.size()) throw std::logic_error("Router::update_bias: one load per expert");
  std::vector<float> bias(selection_bias.size());  // transfer points: the host updates the bias
  download(selection_bias, 0, bias.size(), bias.data());
  update_selection_bias(bias.data(), load.data(), opt_.num_experts, opt_.bias_update_rate);
  upload(selection_bias, bias.data(), bias.size());
}

template <typename T>
double Router<T>::bias_max_abs() const {
  double m = 0;
  std::vector<float> host;
  for (const float b : host_view(selection_bias, host)) m = std::max(m, std::abs(double(b)));
  return m;
}

template class Router<float>;
template class Router<double>;
template struct Routing<float>;
template struct Routing<double>;

}  // namespace meshmoe
