// The loops of CrossEntropy (model/cross_entropy.cpp) as for_each_row bodies (tensor/launch_rows.hpp)
// and, for the unfused backward, a for_each_index_2d body (tensor/launch.hpp).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.hpp"

namespace meshmoe {

// logsumexp of row[0..V), shifted by the row maximum: stable for any logit scale. Every lane
// returns it.
template <typename T, class Lanes>
MESHMOE_HD T row_logsumexp(const T* row, int V, const Lanes& lanes) {
  T mx = row[0];
  for (int v = 1 + lanes.first; v < V; v += lanes.step)
    if (mx < row[v]) mx = row[v];
  mx = lanes.max(mx);
  T sum = 0;
  for (int v = lanes.first; v < V; v += lanes.step) sum += std::exp(row[v] - mx);
  return mx + std::log(lanes.sum(sum));
}

// Row n of logits [N, V]: lse[n] = logsumexp(row), loss[n] = lse[n] - row[target[n]] (0 where
// masked; the caller has checked the unmasked targets lie in [0, V)).
template <typename T>
struct CrossEntropyForwardRow {
  const T *logits, *mask;
  const int32_t* targets;
  T* lse;
  double* loss;
  int V;
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t n, const Lanes& lanes) const {
    const T* row = logits + n * V;
    const T l = row_logsumexp(row, V, lanes);
    if (!lanes.leader()) return;
    lse[n] = l;
    loss[n] = mask[n] == T(0) ? 0.0 : double(l - row[targets[n]]);
  }
};

// Element i = n * V + v: dlogits = weight * mask[n] * (softmax(row n)[v] - [v == target[n]]).
// With soft targets (SoftTargetForwardRow's loss; psum its row sums of p):
//   dlogits = weight mask[n] (softmax(row n)[v] ((1 - alpha) + alpha psum[n]) - alpha p_v
//             - (1 - alpha) [v == target[n]]),
// bitwise the plain gradient when alpha = 0. Reads logits[i] before writing dlogits[i], so the
// two may alias.
template <typename T>
struct CrossEntropyBackwardElement {
  const T *logits, *lse, *mask;
  const int32_t* targets;
  T* dlogits;
  T weight;
  int V;
  const T *soft = nullptr, *psum = nullptr;  // [N, V], [N]: distillation's soft targets
  T alpha = 0;
  MESHMOE_HD void operator()(int64_t n, int64_t v) const {
    const int64_t i = n * V + v;
    dlogits[i] = gradient(n, i, v == targets[n], weight * mask[n], lse[n]);
  }
  // Row n at once, its scalars read once (the same value per element as operator()).
  template <class Lanes>
  MESHMOE_HD void row(int64_t n, const Lanes& lanes) const {
    const T scale = weight * mask[n], lse_n = lse[n];
    const int32_t target = targets[n];
    for (int v = lanes.first; v < V; v += lanes.step) {
      const int64_t i = n * V + v;
      dlogits[i] = gradient(n, i, v == target, scale, lse_n);
    }
  }
  MESHMOE_HD T gradient(int64_t n, int64_t i, bool is_target, T scale, T lse_n) const {
    if (scale == T(0)) return T(0);
    if (!soft) {
      T d = scale * std::exp(logits[i] - lse_n);
      if (is_target) d -= scale;
      return d;
    }
    T d = scale * (std::exp(logits[i] - lse_n) * ((T(1) - alpha) + alpha * psum[n]) - alpha * soft[i]);
    if (is_target) d -= scale * (T(1) - alpha);
    return d;
  }
};

// CrossEntropy::forward_with_gradient: row n's forward (CrossEntropyForwardRow or
// SoftTargetForwardRow), then the backward's dlogits of that row while it is in cache (llm.c's
// fused classifier); the same values as the two loops one after the other. The backward reads
// the lse[n] (and psum[n]) that the forward's leader lane wrote, and overwrites logits that the
// leader read (row[target]): hence the sync between the two.
template <class ForwardRow, typename T>
struct CrossEntropyWithGradientRow {
  ForwardRow forward;
  CrossEntropyBackwardElement<T> backward;
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t n, const Lanes& lanes) const {
    forward(n, lanes);
    lanes.sync();
    backward.row(n, lanes);
  }
};

// Distillation (Switch section 4.2, Hinton et al. 2015): row n of logits [N, V] against the ground
// truth and the teacher's probabilities p = soft [N, V]:
//   loss[n] = (1 - alpha) (lse - row[target]) + alpha (lse sum_v p_v - sum_v p_v row[v]),
// the second term being -sum_v p_v log softmax(row)_v, the cross-entropy of the teacher's
// distribution (sum_v p_v = 1 for probabilities; psum[n] keeps the sum so that the backward is
// exact for any p). hard[n] = lse - row[target], soft_loss[n] the second term alone (0 where masked).
template <typename T>
struct SoftTargetForwardRow {
  const T *logits, *mask, *soft;
  const int32_t* targets;
  T *lse, *psum;
  double *loss, *hard, *soft_loss;
  T alpha;
  int V;
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t n, const Lanes& lanes) const {
    const T* row = logits + n * V;
    const T* p = soft + n * V;
    const T l = row_logsumexp(row, V, lanes);
    T ps = 0, pl = 0;
    for (int v = lanes.first; v < V; v += lanes.step) {
      ps += p[v];
      pl += p[v] * row[v];
    }
    ps = lanes.sum(ps);
    pl = lanes.sum(pl);
    if (!lanes.leader()) return;
    lse[n] = l;
    psum[n] = ps;
    if (mask[n] == T(0)) {
      loss[n] = hard[n] = soft_loss[n] = 0.0;
      return;
    }
    const T h = l - row[targets[n]];
    const T s = l * ps - pl;
    hard[n] = double(h);
    soft_loss[n] = double(s);
    loss[n] = double((T(1) - alpha) * h + alpha * s);
  }
};

// Row n of logits [N, V] -> probs [N, V] = softmax(row) (the teacher's distribution).
template <typename T>
struct SoftmaxRow {
  const T* logits;
  T* probs;
  int V;
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t n, const Lanes& lanes) const {
    const T* row = logits + n * V;
    T* out = probs + n * V;
    const T lse = row_logsumexp(row, V, lanes);
    for (int v = lanes.first; v < V; v += lanes.step) out[v] = std::exp(row[v] - lse);
  }
};

}  // namespace meshmoe
