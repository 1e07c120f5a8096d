// The loops of LayerNorm (model/layernorm.cpp) as for_each_index bodies (tensor/launch.hpp).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.hpp"

namespace meshmoe {

// Row n of x [N, M]: xhat, rstd and y.
template <typename T>
struct LayerNormForwardRow {
  const T *x, *gain, *bias;
  T *xhat, *rstd, *y;
  int M;
  T eps;
  MESHMOE_HD void operator()(int64_t n) const {
    const T* xr = x + n * M;
    // Two passes (mean, then centred variance) avoid the cancellation of E[x^2] - E[x]^2.
    T mean = 0;
    for (int m = 0; m < M; ++m) mean += xr[m];
    mean /= T(M);
    T var = 0;
    for (int m = 0; m < M; ++m) var += (xr[m] - mean) * (xr[m] - mean);
    var /= T(M);
    const T r = T(1) / std::sqrt(var + eps);
    rstd[n] = r;
    T* xh = xhat + n * M;
    T* yr = y + n * M;
    for (int m = 0; m < M; ++m) {
      xh[m] = (xr[m] - mean) * r;
      yr[m] = xh[m] * gain[m] + bias[m];
    }
  }
};

// Row n of dx (+=); with g = dy * gain: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
template <typename T>
struct LayerNormBackwardRow {
  const T *dy, *xhat, *rstd, *gain;
  T* dx;
  int M;
  MESHMOE_HD void operator()(int64_t n) const {
    const T* d = dy + n * M;
    const T* xh = xhat + n * M;
    T* o = dx + n * M;
    T mean_g = 0, mean_gx = 0;
    for (int m = 0; m < M; ++m) {
      const T g = d[m] * gain[m];
      mean_g += g;
      mean_gx += g * xh[m];
    }
    mean_g /= T(M);
    mean_gx /= T(M);
    for (int m = 0; m < M; ++m) o[m] += rstd[n] * (d[m] * gain[m] - mean_g - xh[m] * mean_gx);
  }
};

// Columns [kColumns * b, kColumns * (b + 1)) of the parameter gradients (+=), each summed over the
// N rows in order. A block of adjacent columns per index reads whole cache lines of dy and xhat on
// the host; the parameter gradients are small, so few GPU threads suffice.
template <typename T>
struct LayerNormParamGradColumns {
  static constexpr int kColumns = 16;
  const T *dy, *xhat;
  T *dgain, *dbias;
  int N, M;
  MESHMOE_HD void operator()(int64_t b) const {
    const int m0 = int(b) * kColumns, m1 = m0 + kColumns < M ? m0 + kColumns : M;
    T dg[kColumns], db[kColumns];
    for (int m = m0; m < m1; ++m) dg[m - m0] = dgain[m], db[m - m0] = dbias[m];
    for (int n = 0; n < N; ++n) {
      const T* d = dy + int64_t(n) * M;
      const T* xh = xhat + int64_t(n) * M;
      for (int m = m0; m < m1; ++m) {
        dg[m - m0] += d[m] * xh[m];
        db[m - m0] += d[m];
      }
    }
    for (int m = m0; m < m1; ++m) dgain[m] = dg[m - m0], dbias[m] = db[m - m0];
  }
};

}  // namespace meshmoe
