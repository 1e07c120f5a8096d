// The loops of LayerNorm (model/layernorm.cpp): the rows as for_each_row bodies
// (tensor/launch_rows.hpp), the parameter gradients as for_each_index bodies (tensor/launch.hpp).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.hpp"
#include "tensor/bf16.hpp"

namespace meshmoe {

// Row n of x [N, M]: xhat, rstd and y. y16 (optional, float): y's bf16 copy (bf16_bits, y's
// layout), written with it for the bf16 GEMMs that read y (tensor/blas.hpp bf16_operand_copies).
template <typename T>
struct LayerNormForwardRow {
  const T *x, *gain, *bias;
  T *xhat, *rstd, *y;
  int M;
  T eps;
  uint16_t* y16 = nullptr;
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t n, const Lanes& lanes) const {
    const T* xr = x + n * M;
    // Two passes (mean, then centred variance) avoid the cancellation of E[x^2] - E[x]^2.
    T mean = 0;
    for (int m = lanes.first; m < M; m += lanes.step) mean += xr[m];
    mean = lanes.sum(mean) / T(M);
    T var = 0;
    for (int m = lanes.first; m < M; m += lanes.step) var += (xr[m] - mean) * (xr[m] - mean);
    var = lanes.sum(var) / T(M);
    const T r = T(1) / std::sqrt(var + eps);
    if (lanes.leader()) rstd[n] = r;
    T* xh = xhat + n * M;
    T* yr = y + n * M;
    for (int m = lanes.first; m < M; m += lanes.step) {
      xh[m] = (xr[m] - mean) * r;
      yr[m] = xh[m] * gain[m] + bias[m];
      if (y16) y16[n * M + m] = bf16_bits(float(yr[m]));
    }
  }
};

// Row n of dx (+=); with g = dy * gain: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
template <typename T>
struct LayerNormBackwardRow {
  const T *dy, *xhat, *rstd, *gain;
  T* dx;
  int M;
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t n, const Lanes& lanes) const {
    const T* d = dy + n * M;
    const T* xh = xhat + n * M;
    T* o = dx + n * M;
    T mean_g = 0, mean_gx = 0;
    for (int m = lanes.first; m < M; m += lanes.step) {
      const T g = d[m] * gain[m];
      mean_g += g;
      mean_gx += g * xh[m];
    }
    mean_g = lanes.sum(mean_g) / T(M);
    mean_gx = lanes.sum(mean_gx) / T(M);
    for (int m = lanes.first; m < M; m += lanes.step) o[m] += rstd[n] * (d[m] * gain[m] - mean_g - xh[m] * mean_gx);
  }
};

// RMSNorm (Zhang and Sennrich 2019; model.norm = rmsnorm) row n: rstd = 1 / sqrt(mean(x^2) + eps),
// xhat = x rstd, y = xhat gain (no bias); y16 as LayerNormForwardRow's.
template <typename T>
struct RmsNormForwardRow {
  const T *x, *gain;
  T *xhat, *rstd, *y;
  int M;
  T eps;
  uint16_t* y16 = nullptr;
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t n, const Lanes& lanes) const {
    const T* xr = x + n * M;
    T ms = 0;
    for (int m = lanes.first; m < M; m += lanes.step) ms += xr[m] * xr[m];
    ms = lanes.sum(ms) / T(M);
    const T r = T(1) / std::sqrt(ms + eps);
    if (lanes.leader()) rstd[n] = r;
    T* xh = xhat + n * M;
    T* yr = y + n * M;
    for (int m = lanes.first; m < M; m += lanes.step) {
      xh[m] = xr[m] * r;
      yr[m] = xh[m] * gain[m];
      if (y16) y16[n * M + m] = bf16_bits(float(yr[m]));
    }
  }
};

// RMSNorm row n of dx (+=); with g = dy * gain: dx = rstd * (g - xhat * mean(g * xhat)).
template <typename T>
struct RmsNormBackwardRow {
  const T *dy, *xhat, *rstd, *gain;
  T* dx;
  int M;
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t n, const Lanes& lanes) const {
    const T* d = dy + n * M;
    const T* xh = xhat + n * M;
    T* o = dx + n * M;
    T mean_gx = 0;
    for (int m = lanes.first; m < M; m += lanes.step) mean_gx += d[m] * gain[m] * xh[m];
    mean_gx = lanes.sum(mean_gx) / T(M);
    for (int m = lanes.first; m < M; m += lanes.step) o[m] += rstd[n] * (d[m] * gain[m] - xh[m] * mean_gx);
  }
};

// The parameter gradients in two passes with a fixed summation order (no atomics): first the
// partial sums of column m over the rows of chunk c (kRows rows each), one index per (c, m), so
// that adjacent GPU threads read adjacent columns of a row; then each column's partials added in
// chunk order into gain.g and bias.g. RMSNorm has no bias: partial_bias and dbias are null.
template <typename T>
struct LayerNormParamGradPartials {
  static constexpr int kRows = 64;
  const T *dy, *xhat;
  T *partial_gain, *partial_bias;  // [chunks, M]
  int N, M;
  MESHMOE_HD void operator()(int64_t c, int64_t m) const {
    const int64_t n1 = (c + 1) * kRows < N ? (c + 1) * kRows : N;
    T g = 0, b = 0;
    for (int64_t n = c * kRows; n < n1; ++n) {
      g += dy[n * M + m] * xhat[n * M + m];
      b += dy[n * M + m];
    }
    partial_gain[c * M + m] = g;
    if (partial_bias) partial_bias[c * M + m] = b;
  }
};

template <typename T>
struct LayerNormParamGradSum {
  const T *partial_gain, *partial_bias;
  T *dgain, *dbias;
  int chunks, M;
  MESHMOE_HD void operator()(int64_t m) const {
    T g = dgain[m];
    for (int c = 0; c < chunks; ++c) g += partial_gain[int64_t(c) * M + m];
    dgain[m] = g;
    if (!dbias) return;
    T b = dbias[m];
    for (int c = 0; c < chunks; ++c) b += partial_bias[int64_t(c) * M + m];
    dbias[m] = b;
  }
};

}  // namespace meshmoe
