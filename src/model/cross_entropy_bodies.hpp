// The loops of CrossEntropy (model/cross_entropy.cpp) as for_each_index bodies (tensor/launch.hpp).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.hpp"

namespace meshmoe {

// Row n of logits [N, V]: lse[n] = logsumexp(row), loss[n] = lse[n] - row[target[n]] (0 where
// masked; the caller has checked the unmasked targets lie in [0, V)).
template <typename T>
struct CrossEntropyForwardRow {
  const T *logits, *mask;
  const int32_t* targets;
  T* lse;
  double* loss;
  int V;
  MESHMOE_HD void operator()(int64_t n) const {
    const T* row = logits + n * V;
    // logsumexp shifted by the row maximum: stable for any logit scale
    T mx = row[0];
    for (int v = 1; v < V; ++v)
      if (mx < row[v]) mx = row[v];
    T sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
    lse[n] = mx + std::log(sum);
    loss[n] = mask[n] == T(0) ? 0.0 : double(lse[n] - row[targets[n]]);
  }
};

// Element i = n * V + v: dlogits = weight * mask[n] * (softmax(row n)[v] - [v == target[n]]).
// Reads logits[i] before writing dlogits[i], so the two may alias.
template <typename T>
struct CrossEntropyBackwardElement {
  const T *logits, *lse, *mask;
  const int32_t* targets;
  T* dlogits;
  T weight;
  int V;
  MESHMOE_HD void operator()(int64_t n, int64_t v_) const {
    const int64_t i = n * V + v_;
    const int v = int(v_);
    const T scale = weight * mask[n];
    if (scale == T(0)) {
      dlogits[i] = T(0);
      return;
    }
    T d = scale * std::exp(logits[i] - lse[n]);
    if (v == targets[n]) d -= scale;
    dlogits[i] = d;
  }
};

}  // namespace meshmoe
