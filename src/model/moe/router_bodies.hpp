// The loops of the MoE Router (model/moe/router.cpp) as for_each_index bodies (tensor/launch.hpp).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.hpp"
#include "core/philox.hpp"
#include "model/moe/router_equations.hpp"

namespace meshmoe {

// The router's ranking of experts for one token: a before b when p[a] > p[b], ties to the lower
// index (a strict total order, so top-k and NTLB pick the same experts as a sort would).
template <typename T>
MESHMOE_HD inline bool router_ranks_before(const T* p, int a, int b) {
  return p[a] > p[b] || (p[a] == p[b] && a < b);
}

// The same ranking on the selection scores p[e] + bias[e] (moe.balance = bias: Wang et al. 2024,
// auxiliary-loss-free balancing); bias null: the probabilities alone.
template <typename T>
MESHMOE_HD inline bool router_ranks_before(const T* p, const float* bias, int a, int b) {
  if (!bias) return router_ranks_before(p, a, b);
  const double sa = double(p[a]) + double(bias[a]), sb = double(p[b]) + double(bias[b]);
  return sa > sb || (sa == sb && a < b);
}

// Element i = n * M + m of the router input: jitter multiplier in [1-eps, 1+eps) (Switch appendix C),
// keyed by the global element (token_offset + n) * M + m; xj = x * jitter.
template <typename T>
struct RouterJitterElement {
  Rng rng;
  uint64_t token_offset;
  const T* x;
  T *jitter, *xj;
  int M;
  double eps;
  MESHMOE_HD void operator()(int64_t n, int64_t m) const {
    const int64_t i = n * M + m;
    const uint64_t index = (token_offset + uint64_t(n)) * uint64_t(M) + uint64_t(m);
    jitter[i] = T(1.0 - eps + 2.0 * eps * rng.uniform_double(index));
    xj[i] = x[i] * jitter[i];
  }
};

// Token n: lse = logsumexp of its logits and probs = softmax, both accumulated in double.
template <typename T>
struct RouterSoftmaxRow {
  const T* logits;
  T* probs;
  double* lse;
  int E;
  MESHMOE_HD void operator()(int64_t n) const {
    const T* l = logits + n * E;
    T mxl = l[0];
    for (int e = 1; e < E; ++e) mxl = mxl < l[e] ? l[e] : mxl;
    const double mx = double(mxl);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(double(l[e]) - mx);
    const double s = mx + std::log(sum);
    lse[n] = s;
    for (int e = 0; e < E; ++e) probs[n * E + e] = T(std::exp(double(l[e]) - s));
  }
};

// Token n with moe.gate = sigmoid (DeepSeek-V3 section 2.1.2 eq. 15): scores s_e = sigmoid(logit_e)
// into probs (sigmoid_score, in double) and their sum R (as stored) into row_sum, which normalises
// them for the load-balancing loss (switch_balance_terms).
template <typename T>
struct RouterSigmoidRow {
  const T* logits;
  T* probs;
  double* row_sum;
  int E;
  MESHMOE_HD void operator()(int64_t n) const {
    double sum = 0;
    for (int e = 0; e < E; ++e) {
      const T s = T(sigmoid_score(double(logits[n * E + e])));
      probs[n * E + e] = s;
      sum += double(s);
    }
    row_sum[n] = sum;
  }
};

// Token n: its k best experts, best first (top), the gate normaliser Z (sum of their probabilities;
// 1 when not renormalised) and whether each choice wants dispatch (want). With a selection bias
// the experts are ranked by p + bias; Z and the gates stay the probabilities'. Top-2 second expert
// (GShard section 2.2 "random routing", Algorithm 1 line 18): with random_second (training only)
// dispatched when 2 * g2 > uniform(0, 1), keyed by the global token; with threshold_second when
// g2 > threshold.
template <typename T>
struct RouterTopChoicesRow {
  Rng rng;
  uint64_t token_offset;
  const T* probs;
  int* top;
  double* norm;
  uint8_t* want;
  int E, k;
  bool renorm, random_second, threshold_second;
  double threshold;
  const float* bias;  // [E] selection bias, or null
  MESHMOE_HD void operator()(int64_t n) const {
    const T* p = probs + n * E;
    int* t = top + n * k;
    double z = 0;
    for (int i = 0; i < k; ++i) {
      // the i-th best: the best of the experts ranked after the (i-1)-th
      int best = -1;
      for (int e = 0; e < E; ++e) {
        if (i > 0 && !router_ranks_before(p, bias, t[i - 1], e)) continue;
        if (best < 0 || router_ranks_before(p, bias, e, best)) best = e;
      }
      t[i] = best;
      z += double(p[best]);
    }
    norm[n] = renorm ? z : 1.0;
    for (int i = 0; i < k; ++i) want[n * k + i] = 1;
    if (k == 2 && (random_second || threshold_second)) {
      const double g2 = double(p[t[1]]) / norm[n];
      if (threshold_second) want[n * 2 + 1] = g2 > threshold;
      else want[n * 2 + 1] = 2.0 * g2 > rng.uniform_double(token_offset + uint64_t(n));
    }
  }
};

// The routing's totals are summed in a fixed order on every device: each group's tokens in token
// order (RouterGroupTerms, a body per group), then the groups in group order (RouterTotals, one
// body). Layout of both outputs: RouterTotalsLayout.
struct RouterTotalsLayout {
  int E, bins;
  MESHMOE_HD int load() const { return 0; }
  MESHMOE_HD int stat(int i) const { return E + i; }  // wanted, declined, dropped, rerouted
  MESHMOE_HD int aux() const { return E + 4; }
  MESHMOE_HD int z() const { return E + 5; }
  MESHMOE_HD int entropy() const { return E + 6; }
  MESHMOE_HD int placed(int bin) const { return E + 7 + bin; }
  // per expert e: i = 0 declined, 1 dropped, 2 rerouted (their sums over e are stat(1..3))
  MESHMOE_HD int expert_stat(int i, int e) const { return E + 7 + bins + i * E + e; }
  MESHMOE_HD int size() const { return 4 * E + 7 + bins; }
  // A group's stats (RouterAssignGroup): wanted, declined, dropped, rerouted, then per expert the
  // declined (by the expert chosen), dropped (by the expert chosen) and rerouted (by the expert that
  // took it) choices.
  MESHMOE_HD int group_width() const { return 4 + 3 * E; }
  MESHMOE_HD int group_expert_stat(int i, int e) const { return 4 + i * E + e; }
};

// Group g: the group's loss terms and what the log shows of it, from its routing. The Switch
// load-balancing terms (switch_balance_terms) into frac [g, E] and balance_term [g, E] when top is
// given (not under expert choice, which has no balancing loss); over its tokens, the z-loss terms
// (z_loss_term), the router softmax's entropies lse - sum_e p * logit (nats, for the log), and the
// tokens by how many of their choices have an expert (dispatched or held elsewhere; the last bin
// counts that many or more), into terms [g, at.size()] at z(), entropy() and placed(bin).
template <typename T>
struct RouterGroupTerms {
  const T *probs, *logits;
  const double* lse;        // softmax: [N] logsumexp of the logits; sigmoid: [N] sum of the scores R
  const int *top, *expert;  // top [N, k] the tokens' best experts (null: expert choice)
  double *frac, *balance_term, *terms;
  RouterTotalsLayout at;
  int S, k;
  bool sigmoid;  // moe.gate = sigmoid: no z-loss; balance and entropy over the scores normalised by R
  MESHMOE_HD void operator()(int64_t g) const {
    const int E = at.E;
    if (top)
      switch_balance_terms(probs + g * S * E, top + g * S * k, k, S, E, frac + g * E, balance_term + g * E,
                           sigmoid ? lse + g * S : nullptr);
    double* t = terms + g * at.size();
    double z = 0, entropy = 0;
    for (int b = 0; b < at.bins; ++b) t[at.placed(b)] = 0;
    for (int64_t n = g * S; n < (g + 1) * S; ++n) {
      if (sigmoid) {
        for (int e = 0; e < E; ++e) {
          const double q = double(probs[n * E + e]) / lse[n];
          if (q > 0) entropy -= q * std::log(q);
        }
      } else {
        z += z_loss_term(lse[n]);
        double p_logit = 0;
        for (int e = 0; e < E; ++e) p_logit += double(probs[n * E + e]) * double(logits[n * E + e]);
        entropy += lse[n] - p_logit;
      }
      int got = 0;
      for (int i = 0; i < k; ++i) got += expert[n * k + i] >= 0;
      t[at.placed(got < at.bins - 1 ? got : at.bins - 1)] += 1;
    }
    t[at.z()] = z;
    t[at.entropy()] = entropy;
  }
};

// One body (index 0): out = the sums over the G groups, in group order, of each expert's load
// (count [G, E]), the groups' stats [G, at.group_width()] (nullptr: expert choice, whose wanted is
// the load's sum and the rest 0), the balance terms [G, E] (nullptr: 0) and the group terms
// (RouterGroupTerms).
struct RouterTotals {
  const int* count;
  const int64_t* group_stats;
  const double *balance_term, *terms;
  double* out;
  RouterTotalsLayout at;
  int G;
  MESHMOE_HD void operator()(int64_t) const {
    const int E = at.E;
    for (int i = 0; i < at.size(); ++i) out[i] = 0;
    for (int g = 0; g < G; ++g) {
      for (int e = 0; e < E; ++e) out[at.load() + e] += double(count[g * E + e]);
      if (group_stats) {
        const int64_t* st = group_stats + int64_t(g) * at.group_width();
        for (int i = 0; i < 4; ++i) out[at.stat(i)] += double(st[i]);
        for (int i = 0; i < 3; ++i)
          for (int e = 0; e < E; ++e) out[at.expert_stat(i, e)] += double(st[at.group_expert_stat(i, e)]);
      }
      if (balance_term)
        for (int e = 0; e < E; ++e) out[at.aux()] += balance_term[g * E + e];
      const double* t = terms + int64_t(g) * at.size();
      out[at.z()] += t[at.z()];
      out[at.entropy()] += t[at.entropy()];
      for (int b = 0; b < at.bins; ++b) out[at.placed(b)] += t[at.placed(b)];
    }
    if (!group_stats)
      for (int e = 0; e < E; ++e) out[at.stat(0)] += out[at.load() + e];
  }
};

// Group g (tokens g*S .. g*S+S-1): slot assignment in token order, first choices before second
// choices, ... (router.cpp explains the rule), then No-Token-Left-Behind when ntlb. Writes the
// group's (expert, slot, gate) triples, its expert counts count [g, E] (the filled slots: its load),
// the position counters position [g, E] (the next free slot: count plus the slots left empty by
// declined choices when declined_takes_slot), the flags dropped [g, S, k] and stats
// [g, at.group_width()] = (wanted, declined, dropped, rerouted, then those per expert:
// RouterTotalsLayout::group_expert_stat).
template <typename T>
struct RouterAssignGroup {
  const T* probs;
  const int* top;
  const double* norm;
  const uint8_t* want;
  int *expert, *slot;
  T* gate;
  int *count, *position;
  uint8_t* dropped;
  int64_t* stats;
  RouterTotalsLayout at;
  int S, k, E, C;
  bool ntlb, declined_takes_slot;
  const float* bias;  // [E] selection bias (NTLB ranks by it too), or null
  double scale;       // moe.routed_scale
  static constexpr int kDropped = -1, kDeclined = -2;  // = Routing<T>::kDropped, kDeclined

  MESHMOE_HD void place(int* cnt, int* pos, int n, int i, int e) const {
    const int64_t c = int64_t(n) * k + i;
    expert[c] = e;
    slot[c] = pos[e]++;
    cnt[e] += 1;
    gate[c] = T(routed_gate(scale, double(probs[int64_t(n) * E + e]), norm[n]));
  }

  MESHMOE_HD void operator()(int64_t g) const {
    int* cnt = count + g * E;
    int* pos = position + g * E;
    uint8_t* drop = dropped + g * S * k;
    int64_t* st = stats + g * at.group_width();
    for (int e = 0; e < E; ++e) cnt[e] = pos[e] = 0;
    for (int64_t j = 0; j < int64_t(S) * k; ++j) drop[j] = 0;
    for (int j = 0; j < at.group_width(); ++j) st[j] = 0;
    const int n0 = int(g) * S;
    for (int64_t c = int64_t(n0) * k; c < int64_t(n0 + S) * k; ++c) {
      expert[c] = kDropped;
      slot[c] = -1;
      gate[c] = T(0);
    }
    for (int i = 0; i < k; ++i)
      for (int s = 0; s < S; ++s) {
        const int n = n0 + s;
        const int64_t c = int64_t(n) * k + i;
        if (!want[c]) {
          expert[c] = kDeclined;
          st[1] += 1;
          st[at.group_expert_stat(0, top[c])] += 1;
          if (declined_takes_slot && pos[top[c]] < C) pos[top[c]] += 1;  // GShard Algorithm 1 line 22
          continue;
        }
        st[0] += 1;
        const int e = top[c];
        if (pos[e] < C) place(cnt, pos, n, i, e);
        else drop[s * k + i] = 1;
      }
    if (ntlb) reroute_dropped(g);
    count_dropped(g);
  }

  // NTLB over group g's dropped choices: each to the best-ranked expert outside the token's k
  // choices that holds none of its rerouted choices and has room (the first such expert in the
  // token's sorted order).
  MESHMOE_HD void reroute_dropped(int64_t g) const {
    const int* pos = position + g * E;
    const uint8_t* drop = dropped + g * S * k;
    const int n0 = int(g) * S;
    for (int i = 0; i < k; ++i)
      for (int s = 0; s < S; ++s) {
        if (!drop[s * k + i]) continue;
        const int n = n0 + s;
        const T* p = probs + int64_t(n) * E;
        int best = -1;
        for (int e = 0; e < E; ++e) {
          if (!reroute_free(pos, n, e)) continue;
          if (best < 0 || router_ranks_before(p, bias, e, best)) best = e;
        }
        if (best >= 0) reroute_to(g, s, i, best);
      }
  }

  // Whether expert e (position counters pos of the token's group) can take a dropped choice of
  // token n: it has room and is none of the token's k choices nor holds one of its rerouted ones.
  MESHMOE_HD bool reroute_free(const int* pos, int n, int e) const {
    if (pos[e] >= C) return false;
    for (int i2 = 0; i2 < k; ++i2)
      if (top[int64_t(n) * k + i2] == e || expert[int64_t(n) * k + i2] == e) return false;
    return true;
  }

  // Token s's dropped choice i of group g, placed by NTLB at expert e.
  MESHMOE_HD void reroute_to(int64_t g, int s, int i, int e) const {
    int64_t* st = stats + g * at.group_width();
    place(count + g * E, position + g * E, int(g) * S + s, i, e);
    dropped[g * S * k + int64_t(s) * k + i] = 0;
    st[3] += 1;
    st[at.group_expert_stat(2, e)] += 1;
  }

  // Group g's dropped choices into its stats: the total and each chosen expert's (both 0 before).
  MESHMOE_HD void count_dropped(int64_t g) const {
    const uint8_t* drop = dropped + g * S * k;
    int64_t* st = stats + g * at.group_width();
    const int n0 = int(g) * S;
    for (int s = 0; s < S; ++s)
      for (int i = 0; i < k; ++i)
        if (drop[s * k + i]) {
          st[2] += 1;
          st[at.group_expert_stat(1, top[int64_t(n0 + s) * k + i])] += 1;
        }
  }
};

// popcount of a 32-bit mask, on either side.
MESHMOE_HD inline int popcount32(uint32_t x) {
#ifdef __CUDA_ARCH__
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}

// The index of the lowest set bit of a non-zero 32-bit mask, on either side.
MESHMOE_HD inline int lowest_bit32(uint32_t x) {
#ifdef __CUDA_ARCH__
  return __ffs(int(x)) - 1;
#else
  return __builtin_ctz(x);
#endif
}

// RouterAssignGroup's plain assignment as a parallel scan (Tutel's fast_dispatch: slots by prefix
// sums, docs/ARCHITECTURE.md "MoE launches"), one body per (group g, expert e), index
// i = g * E + e, then RouterAssignRest per group. In round i (choice i of every token) the group's
// choices for e that advance e's position counter (the wanted ones; the declined ones too when
// declined_takes_slot) meet the counter in token order, and the counter stops at C; so such a
// choice's position is pos0 plus the number of them before it in the round (a prefix sum), clipped
// at C, and a wanted choice is placed at that slot when it is below C, dropped otherwise. The
// tokens go by in chunks of kLanes: the chunk's flags make a mask (a warp's ballot on the GPU,
// router.cu; a loop here) and a lane's count is the popcount of the mask below it. The body owns the
// choices whose first-ranked expert top[c] is e (each choice has one), count and position [g, e] and
// e's declined and dropped stats; the same writes, bit for bit, as RouterAssignGroup before NTLB.
template <typename T>
struct RouterSlotsByScan {
  RouterAssignGroup<T> a;  // the routing's arrays and options (its ntlb is RouterAssignRest's)
  static constexpr int kLanes = 32;
  enum Kind { kNone = 0, kWanted = 1, kDeclinedChoice = 2 };

  // Choice i of token s of group g, as seen by expert e's column.
  MESHMOE_HD int kind(int g, int e, int i, int s) const {
    if (s >= a.S) return kNone;
    const int64_t c = (int64_t(g) * a.S + s) * a.k + i;
    if (a.top[c] != e) return kNone;
    return a.want[c] ? kWanted : kDeclinedChoice;
  }
  MESHMOE_HD bool advances(int kd) const { return kd == kWanted || (kd == kDeclinedChoice && a.declined_takes_slot); }

  // Choice i of token s for e, of kind kd, meeting e's counter at `at` (unclipped): its triple and
  // its drop flag.
  MESHMOE_HD void settle(int g, int e, int i, int s, int kd, int at) const {
    const int n = g * a.S + s;
    const int64_t c = int64_t(n) * a.k + i;
    a.dropped[int64_t(g) * a.S * a.k + int64_t(s) * a.k + i] = kd == kWanted && at >= a.C;
    a.slot[c] = -1;
    a.gate[c] = T(0);
    if (kd == kDeclinedChoice) {
      a.expert[c] = RouterAssignGroup<T>::kDeclined;
    } else if (at < a.C) {
      a.expert[c] = e;
      a.slot[c] = at;
      a.gate[c] = T(routed_gate(a.scale, double(a.probs[int64_t(n) * a.E + e]), a.norm[n]));
    } else {
      a.expert[c] = RouterAssignGroup<T>::kDropped;
    }
  }

  // The column's totals after the last round.
  MESHMOE_HD void finish(int g, int e, int placed, int pos, int64_t declined, int64_t dropped) const {
    a.count[int64_t(g) * a.E + e] = placed;
    a.position[int64_t(g) * a.E + e] = pos;
    int64_t* st = a.stats + int64_t(g) * a.at.group_width();
    st[a.at.group_expert_stat(0, e)] = declined;
    st[a.at.group_expert_stat(1, e)] = dropped;
    st[a.at.group_expert_stat(2, e)] = 0;
  }

  // The host's body: a warp's lanes one after another.
  MESHMOE_HD void operator()(int64_t ge) const {
    const int g = int(ge / a.E), e = int(ge % a.E);
    int pos = 0, placed = 0;
    int64_t declined = 0, dropped = 0;
    for (int i = 0; i < a.k; ++i)
      for (int s0 = 0; s0 < a.S; s0 += kLanes) {
        uint32_t mask = 0;
        for (int lane = 0; lane < kLanes; ++lane) mask |= uint32_t(advances(kind(g, e, i, s0 + lane))) << lane;
        for (int lane = 0; lane < kLanes; ++lane) {
          const int kd = kind(g, e, i, s0 + lane);
          if (kd == kNone) continue;
          const int at = pos + popcount32(mask & ((1u << lane) - 1u));
          settle(g, e, i, s0 + lane, kd, at);
          placed += kd == kWanted && at < a.C;
          dropped += kd == kWanted && at >= a.C;
          declined += kd == kDeclinedChoice;
        }
        pos = pos + popcount32(mask) < a.C ? pos + popcount32(mask) : a.C;
      }
    finish(g, e, placed, pos, declined, dropped);
  }

#ifdef __CUDACC__
  // The GPU's body: lane `lane` of the warp that owns column ge (router.cu).
  __device__ void warp(int64_t ge, int lane) const {
    const int g = int(ge / a.E), e = int(ge % a.E);
    const uint32_t all = 0xffffffffu;
    int pos = 0, placed = 0;
    int64_t declined = 0, dropped = 0;
    for (int i = 0; i < a.k; ++i)
      for (int s0 = 0; s0 < a.S; s0 += kLanes) {
        const int kd = kind(g, e, i, s0 + lane);
        const uint32_t mask = __ballot_sync(all, advances(kd));
        const int at = pos + popcount32(mask & ((1u << lane) - 1u));
        if (kd != kNone) settle(g, e, i, s0 + lane, kd, at);
        placed += popcount32(__ballot_sync(all, kd == kWanted && at < a.C));
        dropped += popcount32(__ballot_sync(all, kd == kWanted && at >= a.C));
        declined += popcount32(__ballot_sync(all, kd == kDeclinedChoice));
        pos = pos + popcount32(mask) < a.C ? pos + popcount32(mask) : a.C;
      }
    if (lane == 0) finish(g, e, placed, pos, declined, dropped);
  }
#endif
};

// Group g after RouterSlotsByScan: its wanted and declined totals, NTLB when asked and its
// dropped totals, a warp per group on the GPU (router.cu; operator() is the host's, the lanes one
// after another). NTLB's dropped choices still go one at a time in RouterAssignGroup's order (each
// takes room that a later one may want), but they are found 32 tokens at a time (a ballot of the
// drop flags), and a choice's expert is a reduction over the lanes, lane l ranking the experts
// e = l (mod 32): the best-ranked free expert under router_ranks_before, a strict total order, is
// the same whatever order the reduction takes, so the slots are RouterAssignGroup's, bit for bit.
// (With a NaN probability the order is not total; such a step is not finite and skips its update.)
template <typename T>
struct RouterAssignRest {
  RouterAssignGroup<T> a;
  static constexpr int kLanes = 32;

  MESHMOE_HD int64_t* stats(int64_t g) const { return a.stats + g * a.at.group_width(); }
  // The per-expert counts `which` (RouterTotalsLayout::group_expert_stat) of lane's experts, summed.
  MESHMOE_HD int64_t lane_expert_sum(int64_t g, int lane, int which) const {
    int64_t sum = 0;
    for (int e = lane; e < a.E; e += kLanes) sum += stats(g)[a.at.group_expert_stat(which, e)];
    return sum;
  }
  MESHMOE_HD bool dropped_choice(int64_t g, int s, int i) const {
    return s < a.S && a.dropped[g * a.S * a.k + int64_t(s) * a.k + i];
  }
  // Lane's candidate for a dropped choice of token n: its best-ranked free expert, or -1.
  MESHMOE_HD int lane_best(int64_t g, int n, int lane) const {
    const int* pos = a.position + g * a.E;
    const T* p = a.probs + int64_t(n) * a.E;
    int best = -1;
    for (int e = lane; e < a.E; e += kLanes)
      if (a.reroute_free(pos, n, e) && (best < 0 || router_ranks_before(p, a.bias, e, best))) best = e;
    return best;
  }
  // The better-ranked of two candidates for token n (-1: none).
  MESHMOE_HD int better(int n, int x, int y) const {
    if (x < 0 || y < 0) return x < 0 ? y : x;
    return router_ranks_before(a.probs + int64_t(n) * a.E, a.bias, y, x) ? y : x;
  }
  // Lane's share of the dropped choices after NTLB, c = lane, lane + 32, ...: each into its chosen
  // expert's count (integers: the same in any order); returns how many.
  MESHMOE_HD int64_t count_lane_dropped(int64_t g, int lane) const {
    int64_t* st = stats(g);
    int64_t n = 0;
    for (int64_t c = lane; c < int64_t(a.S) * a.k; c += kLanes) {
      if (!a.dropped[g * a.S * a.k + c]) continue;
      int64_t* to = st + a.at.group_expert_stat(1, a.top[g * a.S * a.k + c]);
#ifdef __CUDA_ARCH__
      atomicAdd(reinterpret_cast<unsigned long long*>(to), 1ull);
#else
      *to += 1;
#endif
      ++n;
    }
    return n;
  }
  MESHMOE_HD void begin(int64_t g, int64_t declined) const {
    int64_t* st = stats(g);
    st[1] = declined;
    st[0] = int64_t(a.S) * a.k - declined;  // every choice is wanted or declined
    st[2] = st[3] = 0;
  }

  MESHMOE_HD void operator()(int64_t g) const {
    int64_t declined = 0, dropped = 0;
    for (int lane = 0; lane < kLanes; ++lane) declined += lane_expert_sum(g, lane, 0);
    begin(g, declined);
    if (a.ntlb) {
      for (int i = 0; i < a.k; ++i)
        for (int s0 = 0; s0 < a.S; s0 += kLanes) {
          uint32_t mask = 0;
          for (int lane = 0; lane < kLanes; ++lane) mask |= uint32_t(dropped_choice(g, s0 + lane, i)) << lane;
          for (; mask; mask &= mask - 1) {
            const int s = s0 + lowest_bit32(mask), n = int(g) * a.S + s;
            int best = -1;
            for (int lane = 0; lane < kLanes; ++lane) best = better(n, best, lane_best(g, n, lane));
            if (best >= 0) a.reroute_to(g, s, i, best);
          }
        }
      for (int e = 0; e < a.E; ++e) stats(g)[a.at.group_expert_stat(1, e)] = 0;
      for (int lane = 0; lane < kLanes; ++lane) dropped += count_lane_dropped(g, lane);
    } else {
      for (int lane = 0; lane < kLanes; ++lane) dropped += lane_expert_sum(g, lane, 1);
    }
    stats(g)[2] = dropped;
  }

#ifdef __CUDACC__
  __device__ static int64_t warp_sum(int64_t v) {
    for (int d = kLanes / 2; d > 0; d /= 2) v += __shfl_xor_sync(0xffffffffu, v, d);
    return v;
  }
  // The GPU's body: lane `lane` of the warp that owns group g (router.cu).
  __device__ void warp(int64_t g, int lane) const {
    const uint32_t all = 0xffffffffu;
    const int64_t declined = warp_sum(lane_expert_sum(g, lane, 0));
    if (lane == 0) begin(g, declined);
    if (!a.ntlb) {
      const int64_t dropped = warp_sum(lane_expert_sum(g, lane, 1));
      if (lane == 0) stats(g)[2] = dropped;
      return;
    }
    __syncwarp();  // begin's writes before the reroutes' counts
    for (int i = 0; i < a.k; ++i)
      for (int s0 = 0; s0 < a.S; s0 += kLanes)
        for (uint32_t mask = __ballot_sync(all, dropped_choice(g, s0 + lane, i)); mask; mask &= mask - 1) {
          const int s = s0 + lowest_bit32(mask), n = int(g) * a.S + s;
          int best = lane_best(g, n, lane);
          for (int d = kLanes / 2; d > 0; d /= 2) best = better(n, best, __shfl_xor_sync(all, best, d));
          if (lane == 0 && best >= 0) a.reroute_to(g, s, i, best);
          __syncwarp();  // the placement's counters before the next choice's ranking
        }
    for (int e = lane; e < a.E; e += kLanes) stats(g)[a.at.group_expert_stat(1, e)] = 0;
    __syncwarp();
    const int64_t dropped = warp_sum(count_lane_dropped(g, lane));
    if (lane == 0) stats(g)[2] = dropped;
  }
#endif
};

#ifdef MESHMOE_CUDA
// RouterSlotsByScan (a warp per group and expert) and RouterAssignRest (a warp per group) on the
// GPU: `body.warp(i, lane)` for i < count, a warp per i (router.cu).
template <class Body>
void launch_router_warps(const Body& body, int64_t count, const char* what);
#endif

// Expert-choice routing (Zhou et al. 2022, section 3.1), one body per (group g, expert e), index
// i = g * E + e: expert e takes the C tokens of group g with the highest probability p[n, e], ties to
// the lower token index; slot j holds its j-th best (the paper's I[e, j]), gate = p[n, e]. Choice
// c = n * E + e of every token n of the group is written: e when taken, kDropped when not. count
// [g, E] = C (at most S). The body owns column e of the group's choices, so the bodies never share
// a write.
template <typename T>
struct RouterExpertChoiceColumn {
  const T* probs;
  int *expert, *slot;
  T* gate;
  int* count;
  int S, E, C;
  double scale;  // moe.routed_scale
  static constexpr int kDropped = -1;  // = Routing<T>::kDropped

  // token a before token b for expert e: the strict total order of the choice
  MESHMOE_HD bool before(int e, int a, int b) const {
    const T pa = probs[int64_t(a) * E + e], pb = probs[int64_t(b) * E + e];
    return pa > pb || (pa == pb && a < b);
  }

  MESHMOE_HD void operator()(int64_t i) const {
    const int g = int(i / E), e = int(i % E), n0 = g * S;
    for (int s = 0; s < S; ++s) {
      const int64_t c = int64_t(n0 + s) * E + e;
      expert[c] = kDropped;
      slot[c] = -1;
      gate[c] = T(0);
    }
    int prev = -1;
    for (int j = 0; j < C && j < S; ++j) {
      // the j-th best: the best of the tokens ranked after the (j-1)-th
      int best = -1;
      for (int n = n0; n < n0 + S; ++n) {
        if (prev >= 0 && !before(e, prev, n)) continue;
        if (best < 0 || before(e, n, best)) best = n;
      }
      const int64_t c = int64_t(best) * E + e;
      expert[c] = e;
      slot[c] = j;
      gate[c] = T(routed_gate(scale, double(probs[int64_t(best) * E + e]), 1.0));
      prev = best;
    }
    count[i] = C < S ? C : S;
  }
};

// Token n: d loss / d logits [E] from dgate (through gate = scale p_e / Z: routed_gate), the
// load-balancing loss (switch_balance_dprob, balance_weight holding the form's scale) and the z-loss
// (z_loss_dlogit); dprobs [n, E] is its scratch row. With sigmoid scores (moe.gate = sigmoid) the
// balance loss reads s / R (normalised_score_dscore), the scores' gradient goes through
// sigmoid_dlogit, and there is no z-loss.
template <typename T>
struct RouterBackwardRow {
  const T* probs;
  const double *norm, *lse, *frac;  // lse: the row sum R with sigmoid scores
  const int *expert, *top;
  const T* dgate;
  double* dprobs;
  T* dlogits;
  int E, k, S;
  bool renorm, sigmoid;
  double scale, balance_weight, z_weight;
  MESHMOE_HD void operator()(int64_t n) const {
    const T* p = probs + n * E;
    const double Z = norm[n];
    double* dp = dprobs + n * E;
    for (int e = 0; e < E; ++e) dp[e] = 0.0;
    for (int i = 0; i < k; ++i) {
      const int64_t c = n * k + i;
      const int e = expert[c];
      if (e < 0) continue;
      const double d = double(dgate[c]);
      dp[e] += routed_gate_dscore(scale, d, Z);
      if (renorm)
        for (int j = 0; j < k; ++j) dp[top[n * k + j]] -= routed_gate_dnorm(scale, d, double(p[e]), Z);
    }
    if (balance_weight != 0 && sigmoid) {
      const double R = lse[n];
      double sum_ws = 0;
      for (int e = 0; e < E; ++e)
        sum_ws += switch_balance_dprob(balance_weight, E, frac[(n / S) * E + e], S) * double(p[e]);
      for (int e = 0; e < E; ++e)
        dp[e] += normalised_score_dscore(switch_balance_dprob(balance_weight, E, frac[(n / S) * E + e], S), sum_ws, R);
    } else if (balance_weight != 0) {
      for (int e = 0; e < E; ++e) dp[e] += switch_balance_dprob(balance_weight, E, frac[(n / S) * E + e], S);
    }
    if (sigmoid) {
      for (int e = 0; e < E; ++e) dlogits[n * E + e] = T(sigmoid_dlogit(dp[e], double(p[e])));
      return;
    }
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += dp[e] * double(p[e]);
    for (int e = 0; e < E; ++e) {
      double dl = double(p[e]) * (dp[e] - dot);
      if (z_weight != 0) dl += z_loss_dlogit(z_weight, lse[n], double(p[e]));
      dlogits[n * E + e] = T(dl);
    }
  }
};

// dx[i] += dxr[i] * jitter[i]
template <typename T>
struct RouterJitterBackwardElement {
  const T *dxr, *jitter;
  T* dx;
  MESHMOE_HD void operator()(int64_t i) const { dx[i] += dxr[i] * jitter[i]; }
};

}  // namespace meshmoe
