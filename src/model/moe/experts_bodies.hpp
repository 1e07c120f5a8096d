// The loops of the MoE experts (model/moe/experts.cpp) as for_each_index bodies
// (tensor/launch.hpp).
#pragma once
#include <cstdint>

#include "core/hd.hpp"
#include "core/philox.hpp"
#include "tensor/bf16.hpp"

namespace meshmoe {

// keep[i] = x[i], the experts' own copy of their input (the dispatcher's may not outlive the
// forward); keep16 (optional, float): its bf16 copy, taken from x16 (the dispatcher's gather wrote
// it) or rounded here.
template <typename T>
struct KeepExpertInput {
  const T* x;
  const uint16_t* x16;
  T* keep;
  uint16_t* keep16;
  MESHMOE_HD void operator()(int64_t i) const {
    keep[i] = x[i];
    if (keep16) keep16[i] = x16 ? x16[i] : bf16_bits(float(x[i]));
  }
};

// Index i = row * LH + j over the rows of one local expert (global expert e): the dropout scale
// of hidden unit h0 + j of the row, 0 or 1/(1-p), into mask, and h scaled by it in place. Keyed by
// (global token, global expert, global hidden unit): a token in two experts draws twice, and
// splitting the hidden units over tensor (Switch 5.5) draws the same numbers. An empty row
// (token -1) keeps everything. h16 (optional, float): h's bf16 copy of the scaled value.
template <typename T>
struct ExpertDropoutForward {
  Rng rng;
  const int64_t* row_token;  // [R]
  T *mask, *h;               // [R, LH]
  int LH, h0;
  uint64_t E, H, e;
  double p;
  T scale;
  uint16_t* h16 = nullptr;   // [R, LH]
  MESHMOE_HD void operator()(int64_t row, int64_t j_) const {
    const int64_t i = row * LH + j_;
    const int j = int(j_);
    const int64_t tok = row_token[row];
    const uint64_t index = (uint64_t(tok < 0 ? 0 : tok) * E + e) * H + uint64_t(h0 + j);
    mask[i] = tok >= 0 && rng.uniform_double(index) < p ? T(0) : scale;
    h[i] *= mask[i];
    if (h16) h16[i] = bf16_bits(float(h[i]));
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
