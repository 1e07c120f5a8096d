// The loops of Dropout (model/dropout.cpp) as for_each_index bodies (tensor/launch.hpp).
#pragma once
#include <cstdint>

#include "core/hd.hpp"
#include "core/philox.hpp"

namespace meshmoe {

// Index i = n * per_token + q: the Philox block of token n (global token_offset + n) that decides
// columns 4q .. 4q+3 (lane = c % 4, model/dropout.hpp); saves keep and scales x in place.
template <typename T>
struct DropoutForwardBlock {
  Rng rng;
  uint64_t token_offset;
  T* x;
  uint8_t* keep;
  int C;
  int per_token;  // ceil(C / 4)
  double rate;
  T scale;  // 1 / (1 - rate)
  MESHMOE_HD void operator()(int64_t n, int64_t q_) const {
    const int q = int(q_);
    const uint64_t g = token_offset + uint64_t(n);
    const auto bits = rng.bits(g * uint64_t(per_token) + uint64_t(q));
    uint8_t* k = keep + n * C;
    T* xr = x + n * C;
    for (int lane = 0; lane < 4 && 4 * q + lane < C; ++lane) {
      const double u = double(bits[lane] >> 8) * (1.0 / 16777216.0);
      const int c = 4 * q + lane;
      k[c] = u >= rate;
      xr[c] = k[c] ? xr[c] * scale : T(0);
    }
  }
};

// d[i] = keep[i] ? d[i] * scale : 0 (in place)
template <typename T>
struct DropoutBackwardElement {
  const uint8_t* keep;
  T* d;
  T scale;
  MESHMOE_HD void operator()(int64_t i) const { d[i] = keep[i] ? d[i] * scale : T(0); }
};

}  // namespace meshmoe
