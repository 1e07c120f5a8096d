// The feed-forward activations (model/activation.hpp) as for_each_index bodies (tensor/launch.hpp),
// one index per hidden unit of one row: i = n * H + j. Rows may be strided (ld_pre, ld_h).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.hpp"

namespace meshmoe {

template <typename T>
MESHMOE_HD inline T gelu(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(M_SQRT1_2)));
}
// d gelu / dx = Phi(x) + x phi(x)
template <typename T>
MESHMOE_HD inline T gelu_grad(T x) {
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(M_SQRT1_2)));
  const T pdf = std::exp(T(-0.5) * x * x) * T(0.5 * M_2_SQRTPI * M_SQRT1_2);  // 1/sqrt(2 pi)
  return cdf + x * pdf;
}

// h[n, j] = relu(pre[n, j])
template <typename T>
struct ReluForward {
  const T* pre;
  T* h;
  int H, ld_pre, ld_h;
  MESHMOE_HD void operator()(int64_t n, int64_t j) const {
    const T p = pre[n * ld_pre + j];
    h[n * ld_h + j] = p > T(0) ? p : T(0);
  }
};

// h[n, j] = gelu(pre[n, j])
template <typename T>
struct GeluForward {
  const T* pre;
  T* h;
  int H, ld_pre, ld_h;
  MESHMOE_HD void operator()(int64_t n, int64_t j) const {
    h[n * ld_h + j] = gelu(pre[n * ld_pre + j]);
  }
};

// h[n, j] = gelu(pre[n, j]) * pre[n, H + j]
template <typename T>
struct GegluForward {
  const T* pre;
  T* h;
  int H, ld_pre, ld_h;
  MESHMOE_HD void operator()(int64_t n, int64_t j) const {
    const T* p = pre + n * ld_pre;
    h[n * ld_h + j] = gelu(p[j]) * p[H + j];
  }
};

// dpre[n, j] = relu'(pre[n, j]) dh[n, j]
template <typename T>
struct ReluBackward {
  const T *pre, *dh;
  T* dpre;
  int H, ld_pre, ld_h;
  MESHMOE_HD void operator()(int64_t n, int64_t j) const {
    dpre[n * ld_pre + j] = pre[n * ld_pre + j] > T(0) ? dh[n * ld_h + j] : T(0);
  }
};

// dpre[n, j] = gelu'(pre[n, j]) dh[n, j]
template <typename T>
struct GeluBackward {
  const T *pre, *dh;
  T* dpre;
  int H, ld_pre, ld_h;
  MESHMOE_HD void operator()(int64_t n, int64_t j) const {
    dpre[n * ld_pre + j] = dh[n * ld_h + j] * gelu_grad(pre[n * ld_pre + j]);
  }
};

// Both halves that hidden unit j reads: dpre[n, j] (gelu side) and dpre[n, H + j] (linear gate).
template <typename T>
struct GegluBackward {
  const T *pre, *dh;
  T* dpre;
  int H, ld_pre, ld_h;
  MESHMOE_HD void operator()(int64_t n, int64_t j) const {
    const T* p = pre + n * ld_pre;
    const T d = dh[n * ld_h + j];
    T* o = dpre + n * ld_pre;
    o[j] = d * gelu_grad(p[j]) * p[H + j];
    o[H + j] = d * gelu(p[j]);
  }
};

}  // namespace meshmoe
