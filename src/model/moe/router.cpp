#include "model/moe/router.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.hpp"
#include "core/philox.hpp"
#include "tensor/blas.hpp"

namespace meshmoe {

template <typename T>
void Router<T>::declare(ParamStore<T>& store, const std::string& prefix) {
  store.add(prefix + ".wg", {opt_.d_model, opt_.num_experts}, InitKind::TruncNormal, opt_.d_model, &wg);
}

// x [N, M] -> logits [N, E] -> probs [N, E] -> triples (expert, slot, gate) [N*k]
template <typename T>
void Router<T>::forward(const StepContext& ctx, const T* x, int N) {
  const int M = opt_.d_model, E = opt_.num_experts, S = opt_.group_size, k = opt_.k();
  if (N % S != 0)
    throw InputError("MoE layer got " + std::to_string(N) + " tokens, not a multiple of moe.group_size = " +
                     std::to_string(S));
  const int G = N / S, C = opt_.capacity(ctx.training);

  // Switch appendix C: multiplicative jitter on the router input, training only. Keyed by global
  // token index * M + m so that sharding does not change it.
  const T* xr = x;
  jittered_ = ctx.training && opt_.jitter_eps > 0;
  if (jittered_) {
    jitter_.resize(size_t(N) * M);
    xj_.resize(size_t(N) * M);
    const Rng rng{ctx.seed, ctx.step, opt_.layer_id, RngPurpose::Jitter};
    const double eps = opt_.jitter_eps;
    for (int n = 0; n < N; ++n)
      for (int m = 0; m < M; ++m) {
        const size_t i = size_t(n) * M + m;
        const uint64_t index = (ctx.token_offset + uint64_t(n)) * uint64_t(M) + uint64_t(m);
        jitter_[i] = T(1.0 - eps + 2.0 * eps * rng.uniform_double(index));
        xj_[i] = x[i] * jitter_[i];
      }
    xr = xj_.data();
  } else {
    xj_.assign(x, x + size_t(N) * M);  // backward needs the router input for dwg
  }

  // GShard Algorithm 2 line 1: gates = softmax(einsum(GSM,ME->GSE)). Softmax accumulated in double
  // (Switch section 2.4: the router in float32 at least).
  logits_.resize(size_t(N) * E);
  probs_.resize(size_t(N) * E);
  lse_.resize(N);
  matmul(false, false, N, E, M, xr, wg.w, logits_.data());
  z_sum = 0;
  for (int n = 0; n < N; ++n) {
    const T* l = &logits_[size_t(n) * E];
    const double mx = *std::max_element(l, l + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(double(l[e]) - mx);
    lse_[n] = mx + std::log(sum);
    for (int e = 0; e < E; ++e) probs_[size_t(n) * E + e] = T(std::exp(double(l[e]) - lse_[n]));
    z_sum += lse_[n] * lse_[n];  // router z-loss term (ST-MoE), summed over tokens
  }

  // Top-k experts per token, best first; ties go to the lower expert index.
  top_.resize(size_t(N) * k);
  norm_.resize(N);
  std::vector<int> order(E);
  for (int n = 0; n < N; ++n) {
    const T* p = &probs_[size_t(n) * E];
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [p](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    double z = 0;
    for (int i = 0; i < k; ++i) {
      top_[size_t(n) * k + i] = order[i];
      z += double(p[order[i]]);
    }
    // Top-1 (Switch eq. 2): gate = p_top1, not renormalised. Top-2 (GShard Algorithm 1 lines 6, 16)
    // and top-k: gates renormalised over the k chosen experts.
    norm_[n] = opt_.router == RouterKind::Top1 ? 1.0 : z;
  }

  // Which choices want dispatch. Top-2 second expert (GShard section 2.2 "random routing",
  // Algorithm 1 line 18): dispatched when 2 * g2 > uniform(0, 1), i.e. with probability
  // min(1, 2 g2), keyed by global token index. Random routing only in training: evaluation
  // dispatches the second expert always. Threshold: dispatched when g2 > threshold (train and eval).
  std::vector<char> want(size_t(N) * k, 1);
  if (opt_.router == RouterKind::Top2 && opt_.second_expert != SecondExpertPolicy::Always) {
    const Rng rng{ctx.seed, ctx.step, opt_.layer_id, RngPurpose::SecondExpert};
    for (int n = 0; n < N; ++n) {
      const double g2 = double(probs_[size_t(n) * E + top_[size_t(n) * 2 + 1]]) / norm_[n];
      if (opt_.second_expert == SecondExpertPolicy::Threshold)
        want[size_t(n) * 2 + 1] = g2 > opt_.second_expert_threshold;
      else if (ctx.training)
        want[size_t(n) * 2 + 1] = 2.0 * g2 > rng.uniform_double(ctx.token_offset + uint64_t(n));
    }
  }

  // Slot assignment per group (GShard "local group dispatching"): first choices fill capacity in token
  // order, then second choices, ... So a 2nd-choice token's position is the count of 1st-choice tokens
  // kept by that expert plus its rank among the 2nd choices (Algorithm 1 lines 8 and 18; as in
  // mesh-tensorflow, declined random-routing choices take no position). Choices over capacity are
  // dropped: output 0, the residual carries the token.
  r_.N = N, r_.k = k, r_.S = S, r_.G = G, r_.C = C, r_.E = E;
  r_.expert.assign(size_t(N) * k, -1);
  r_.slot.assign(size_t(N) * k, -1);
  r_.gate.assign(size_t(N) * k, T(0));
  r_.load.assign(E, 0);
  r_.wanted = r_.dropped = r_.rerouted = r_.declined = 0;
  frac_.assign(size_t(G) * E, 0.0);
  std::vector<int> count(E);
  std::vector<char> dropped(size_t(S) * k);
  auto place = [&](int n, int i, int e) {
    const size_t c = size_t(n) * k + i;
    r_.expert[c] = e;
    r_.slot[c] = count[e]++;
    r_.gate[c] = T(double(probs_[size_t(n) * E + e]) / norm_[n]);
    r_.load[e] += 1;
  };
  for (int g = 0; g < G; ++g) {
    std::fill(count.begin(), count.end(), 0);
    std::fill(dropped.begin(), dropped.end(), 0);
    for (int i = 0; i < k; ++i)
      for (int s = 0; s < S; ++s) {
        const int n = g * S + s;
        const size_t c = size_t(n) * k + i;
        if (!want[c]) {
          r_.expert[c] = Routing<T>::kDeclined;
          r_.declined += 1;
          continue;
        }
        r_.wanted += 1;
        const int e = top_[c];
        if (count[e] < C) place(n, i, e);
        else dropped[size_t(s) * k + i] = 1;
      }
    // No-Token-Left-Behind (Switch appendix B, Figure 11). Rule: after the plain assignment, the
    // dropped choices of the group are visited in choice order, then token order (all dropped first
    // choices first, as the stages above); each goes to the best-ranked expert (by router probability)
    // that is not among the token's k original choices, does not already hold one of its rerouted
    // choices, and still has room. Gate = p(new expert) / Z, Z the token's usual normaliser (1 for
    // top1, so the gate is the router probability of the expert that actually processes it). Since
    // experts only fill up, this single pass equals iterating Switch's "route the overflowed tokens to
    // their next-highest expert" stages until nothing moves, with full experts skipped at once. It only
    // adds placements: it never drops more than plain routing.
    if (opt_.no_token_left_behind) {
      for (int i = 0; i < k; ++i)
        for (int s = 0; s < S; ++s) {
          if (!dropped[size_t(s) * k + i]) continue;
          const int n = g * S + s;
          const T* p = &probs_[size_t(n) * E];
          std::iota(order.begin(), order.end(), 0);
          std::sort(order.begin(), order.end(), [p](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
          for (int j = k; j < E; ++j) {
            const int e = order[j];
            bool used = false;
            for (int i2 = 0; i2 < k; ++i2) used = used || r_.expert[size_t(n) * k + i2] == e;
            if (used || count[e] >= C) continue;
            place(n, i, e);
            dropped[size_t(s) * k + i] = 0;
            r_.rerouted += 1;
            break;
          }
        }
    }
    for (char d : dropped) r_.dropped += d;

    // Switch eq. 4-6 per group: f_e = fraction of the group's tokens whose top-1 expert is e (before
    // capacity), P_e = mean router probability of e; aux_g = E * sum_e f_e P_e.
    for (int s = 0; s < S; ++s) frac_[size_t(g) * E + top_[size_t(g * S + s) * k]] += 1.0 / S;
  }
  aux_sum = 0;
  for (int g = 0; g < G; ++g)
    for (int e = 0; e < E; ++e) {
      double P = 0;
      for (int s = 0; s < S; ++s) P += double(probs_[size_t(g * S + s) * E + e]);
      aux_sum += E * frac_[size_t(g) * E + e] * (P / S);
    }
}

// dgate [N*k] -> dprobs -> dlogits [N, E] -> dwg [M, E] (added), dx [N, M] (added)
template <typename T>
void Router<T>::backward(const StepContext& ctx, const T* dgate, T* dx, int N, double aux_weight, double z_weight) {
  const int M = opt_.d_model, E = opt_.num_experts, S = opt_.group_size, k = opt_.k();
  const bool renorm = opt_.router != RouterKind::Top1;
  std::vector<T> dlogits(size_t(N) * E);
  std::vector<double> dp(E);
  for (int n = 0; n < N; ++n) {
    const T* p = &probs_[size_t(n) * E];
    const double Z = norm_[n];
    std::fill(dp.begin(), dp.end(), 0.0);
    // gate = p_e / Z with Z = sum of the top-k probabilities (top1: Z = 1, constant).
    for (int i = 0; i < k; ++i) {
      const size_t c = size_t(n) * k + i;
      const int e = r_.expert[c];
      if (e < 0) continue;
      const double d = double(dgate[c]);
      dp[e] += d / Z;
      if (renorm)
        for (int j = 0; j < k; ++j) dp[top_[size_t(n) * k + j]] -= d * double(p[e]) / (Z * Z);
    }
    // d aux_g / d p_{s,e} = E f_e / S (f is constant: argmax)
    if (aux_weight != 0)
      for (int e = 0; e < E; ++e) dp[e] += aux_weight * E * frac_[size_t(n / S) * E + e] / S;
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += dp[e] * double(p[e]);
    for (int e = 0; e < E; ++e) {
      // softmax backward, plus d(lse^2)/dlogit_e = 2 lse p_e
      double dl = double(p[e]) * (dp[e] - dot);
      if (z_weight != 0) dl += z_weight * 2.0 * lse_[n] * double(p[e]);
      dlogits[size_t(n) * E + e] = T(dl);
    }
  }
  // logits = xr wg: dwg += xr^T dlogits, dxr = dlogits wg^T, dx += dxr * jitter
  matmul(true, false, M, E, N, xj_.data(), dlogits.data(), wg.g, true);
  if (!jittered_) {
    matmul(false, true, N, M, E, dlogits.data(), wg.w, dx, true);
    return;
  }
  std::vector<T> dxr(size_t(N) * M);
  matmul(false, true, N, M, E, dlogits.data(), wg.w, dxr.data());
  for (size_t i = 0; i < dxr.size(); ++i) dx[i] += dxr[i] * jitter_[i];
}

template class Router<float>;
template class Router<double>;
template struct Routing<float>;
template struct Routing<double>;

}  // namespace meshmoe
