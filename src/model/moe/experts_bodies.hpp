// The loops of the MoE experts (model/moe/experts.cpp) as for_each_index bodies
// (tensor/launch.hpp).
#pragma once
#include <cstdint>

#include "core/hd.hpp"
#include "core/philox.hpp"

namespace meshmoe {

// Index i = row * LH + j over the rows of one local expert (global expert e): the dropout scale
// of hidden unit h0 + j of the row, 0 or 1/(1-p), into mask, and h scaled by it in place. Keyed by
// (global token, global expert, global hidden unit): a token in two experts draws twice, and
// splitting the hidden units over tensor (Switch 5.5) draws the same numbers. An empty row
// (token -1) keeps everything.
template <typename T>
struct ExpertDropoutForward {
  Rng rng;
  const int64_t* row_token;  // [R]
  T *mask, *h;               // [R, LH]
  int LH, h0;
  uint64_t E, H, e;
  double p;
  T scale;
  MESHMOE_HD void operator()(int64_t row, int64_t j_) const {
    const int64_t i = row * LH + j_;
    const int j = int(j_);
    const int64_t tok = row_token[row];
    const uint64_t index = (uint64_t(tok < 0 ? 0 : tok) * E + e) * H + uint64_t(h0 + j);
    mask[i] = tok >= 0 && rng.uniform_double(index) < p ? T(0) : scale;
    h[i] *= mask[i];
  }
};

// dh[i] *= mask[i]
template <typename T>
struct ExpertDropoutBackward {
  const T* mask;
  T* dh;
  MESHMOE_HD void operator()(int64_t i) const { dh[i] *= mask[i]; }
};

}  // namespace meshmoe
