// The papers' routing equations, each in one place beside its gradient: the router's scores and
// gates (softmax, softmax over the chosen k, sigmoid), the expert capacity, the Switch and GShard
// load-balancing losses, the router z-loss, and the weights a step gives the two losses. The router's loops (router_bodies.hpp) call the MESHMOE_HD functions, so the host and the
// CUDA code evaluate the same expressions; the router sums their terms in a fixed order
// (RouterGroupTerms, RouterTotals).
//
// The losses are per routing group: the papers' batch (Switch's B of T tokens) is a group of S
// tokens here (GShard section 2.2, "Local group dispatching"), so that no loss depends on the mesh
// (docs/ARCHITECTURE.md "Principles" 1).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/hd.hpp"
#include "deck/options.hpp"

namespace meshmoe {

// ---- Scores and gates (moe.gate) ---------------------------------------------------------------

// A token's router scores over the E experts from its logits x (router input times wg, in float32):
//   softmax (GShard Algorithm 2 line 1, Switch eq. 1): p_e = exp(x_e - lse), lse = logsumexp(x)
//     (RouterSoftmaxRow, accumulated in double);
//   sigmoid (DeepSeek-V3, arXiv 2412.19437, section 2.1.2 eq. 15): s_e = sigmoid(x_e), each expert
//     scored on its own; R = sum_e s_e normalises them for the load-balancing loss only (eq. 19).
MESHMOE_HD inline double sigmoid_score(double logit) { return 1.0 / (1.0 + std::exp(-logit)); }

// d s / d x = s (1 - s): the sigmoid score's gradient into its logit.
MESHMOE_HD inline double sigmoid_dlogit(double dscore, double s) { return dscore * s * (1.0 - s); }

// The combine weight of a token's chosen expert e with score p_e: g = scale * p_e / Z, scale =
// moe.routed_scale (DeepSeek-V3's released configuration: 2.5), and Z:
//   the sum of the token's k chosen scores when the gates are renormalised: GShard's top-2 (Algorithm
//     1 line 6, g1 / (g1 + g2)) and top-k with moe.gate = softmax; Mixtral (arXiv 2401.04088,
//     section 2.1, G(x) = Softmax(TopK(x W_g)): a softmax over the chosen logits is p_e / sum of the
//     chosen p) with moe.gate = softmax_topk for any k; DeepSeek-V3 eq. 13 (g = g' / sum g') with
//     moe.gate = sigmoid;
//   1 for Switch's top-1 (eq. 2: the gate is p itself), expert choice (Zhou et al. section 3.1) and
//     moe.gate = softmax_unnormalised (DeepSeekMoE, arXiv 2401.06066, section 3.1 eq. 4-5: g = s
//     among the top-K, the chosen probabilities as they are; OLMoE likewise).
// Z is taken over the k choices before capacity, so a dropped choice leaves its partners' gates.
MESHMOE_HD inline double routed_gate(double scale, double p_e, double Z) { return scale * p_e / Z; }

// Its gradient, dg = d loss / d g: d g / d p_e = scale / Z ...
MESHMOE_HD inline double routed_gate_dscore(double scale, double dg, double Z) { return scale * dg / Z; }
// ... and, renormalised, d g / d p_j = -scale p_e / Z^2 for each chosen j (e included).
MESHMOE_HD inline double routed_gate_dnorm(double scale, double dg, double p_e, double Z) {
  return scale * dg * p_e / (Z * Z);
}

// ---- Expert capacity -------------------------------------------------------------------------

// Slots of each expert per routing group. GShard section 2.2 gives each group "a fractional
// capacity of each expert, 2N/(G E)": k S / E with k = 2 choices per token; Switch section 2.2
// eq. 3 scales the even share by a capacity factor f. So C = ceil(k S f / E) for k choices per
// token; expert choice (Zhou et al. 2022, section 3.1) passes k = 1: ceil(S f / E), the tokens each
// expert takes. C is at least 1 and at most S: a token visits an expert at most once, so a larger C
// changes no routing decision, only the buffer size (it is clamped in double first: a huge factor,
// 1e300, would overflow the integer conversion). The ceil forgives 1e-9 relative rounding (0.7 * 10
// must give 7, not 8). Host only: C sizes the buffers before any launch.
inline int expert_capacity(int k, int S, int E, double factor) {
  const double v = double(k) * S * factor / E;
  if (!(v < double(S))) return S;
  const double r = std::round(v);
  const int64_t c = std::abs(v - r) <= 1e-9 * std::max(1.0, v) ? int64_t(r) : int64_t(std::ceil(v));
  return int(std::clamp<int64_t>(c, 1, S));
}

// ---- Switch load-balancing loss ----------------------------------------------------------------

// Switch section 2.2, eq. 4-6, on one group of S tokens, without alpha (balance_loss_weight's):
//   loss = E sum_e f_e P_e,  f_e = (1/S) #{tokens whose top-1 expert is e}  (eq. 5, before capacity),
//                            P_e = (1/S) sum_tokens p_e(x)                  (eq. 6).
// probs [S, E] and top [S, k] are the group's rows (top's column 0: each token's best expert).
// Writes f [E] and term [E] = E f_e P_e, the terms whose sum is the group's loss. row_sum [S]: with
// moe.gate = sigmoid, each token's R = sum_e s_e, and p_e(x) = s_e / R (DeepSeek-V3 eq. 19-20, the P_i
// of its complementary sequence-wise balance loss; f stays Switch's top-1 fraction); null: softmax.
template <typename T>
MESHMOE_HD inline void switch_balance_terms(const T* probs, const int* top, int k, int S, int E, double* f,
                                            double* term, const double* row_sum = nullptr) {
  for (int e = 0; e < E; ++e) f[e] = 0.0;
  for (int s = 0; s < S; ++s) f[top[int64_t(s) * k]] += 1.0 / S;
  for (int e = 0; e < E; ++e) {
    double P = 0;
    for (int s = 0; s < S; ++s) {
      const double p = double(probs[int64_t(s) * E + e]);
      P += row_sum ? p / row_sum[s] : p;
    }
    term[e] = E * f[e] * (P / S);
  }
}

// Its gradient, times `weight`: f is a count, not differentiable (Switch section 2.2), so
// d loss / d p_e(x) = E f_e / S for every token x of the group.
MESHMOE_HD inline double switch_balance_dprob(double weight, int E, double f_e, int S) { return weight * E * f_e / S; }

// With moe.gate = sigmoid, p_e = s_e / R: given w_e = d loss / d p_e for the token's E experts and
// sum_ws = sum_e w_e s_e, d loss / d s_j = (w_j - sum_ws / R) / R.
MESHMOE_HD inline double normalised_score_dscore(double w_j, double sum_ws, double R) { return (w_j - sum_ws / R) / R; }

// ---- GShard auxiliary loss ---------------------------------------------------------------------

// GShard Algorithm 1 line 13: l_aux = (1/E) sum_e (c_e / S) m_e, c_e the group's tokens whose first
// choice is e (line 11 counts past C too: before capacity), m_e their mean gate over the group (line
// 3). c_e / S is Switch's f_e and m_e its P_e, so l_aux = (E sum_e f_e P_e) / E^2, and so is its
// gradient: d l_aux / d p_e(x) = (1/E) (c_e / S) / S = switch_balance_dprob / E^2. The router sums
// the Switch terms and scales the sum and the gradient's weight by this factor.
MESHMOE_HD inline double gshard_per_switch_balance(int E) { return 1.0 / (double(E) * E); }

// The factor that turns the Switch form into the loss of moe.aux_loss_form.
inline double balance_loss_form_scale(AuxLossForm form, int E) {
  return form == AuxLossForm::Gshard ? gshard_per_switch_balance(E) : 1.0;
}

// ---- Router z-loss -----------------------------------------------------------------------------

// ST-MoE (Zoph et al. 2022, arXiv 2202.08906) section 3.3, eq. 5: L_z = (1/B) sum_i (log sum_j
// exp x_j^(i))^2 over B tokens, x^(i) a token's router logits. The router sums each token's term,
// lse^2 (lse its logsumexp); z_loss_weight holds the 1/B.
MESHMOE_HD inline double z_loss_term(double lse) { return lse * lse; }

// Its gradient, times `weight`: d lse^2 / d x_e = 2 lse softmax(x)_e = 2 lse p_e.
MESHMOE_HD inline double z_loss_dlogit(double weight, double lse, double p_e) { return weight * 2.0 * lse * p_e; }

// ---- The losses' weights in a step -------------------------------------------------------------

// The load-balancing loss enters a step's loss with alpha = moe.aux_loss_coef (Switch eq. 4;
// GShard section 2.2's k of L = l_nll + k l_aux) per MoE layer, averaged over the step's routing
// groups (the router returns the sum of the groups' losses): coef / (tokens / S). With moe.balance =
// "bias" the selection bias balances instead (Wang et al. 2024) and the loss has weight 0 (its
// value is still logged).
inline double balance_loss_weight(BalanceKind balance, double coef, double tokens, int64_t group_size) {
  const double groups = tokens / double(group_size);
  return balance == BalanceKind::Bias ? 0.0 : coef / groups;
}

// The z-loss enters with moe.z_loss_coef per MoE layer over the step's tokens (eq. 5's 1/B; the
// router returns the sum of the tokens' terms).
inline double z_loss_weight(double coef, double tokens) { return coef / tokens; }

}  // namespace meshmoe
