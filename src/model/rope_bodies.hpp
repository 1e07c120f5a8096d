// Rotary position embedding's loop body (model/rope.hpp) for for_each_index_2d (tensor/launch.hpp):
// one index (n, j) per rotated pair of row n, j = head * D/2 + i.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.hpp"

namespace meshmoe {

// Rotates dimensions (i, i + D/2) of head `head` of row n (the rotate-half pairing of the Hugging
// Face Llama and Mixtral code) by the angle position * base^(-2i/D):
//   forward:  (a, b) -> (a cos - b sin, b cos + a sin)
//   inverse:  (a, b) -> (a cos + b sin, b cos - a sin)   (the transpose: the backward's)
// The angle, its cosine and sine are computed in double (the same values for float and double
// rows, and a position's rotation does not depend on the rows around it).
template <typename T>
struct RopeRotatePair {
  T* x;                     // [N, ld], heads of D columns from column 0
  const int32_t* position;  // [N] the token's position in its packed example; null: n % T_seq
  int ld, D, T_seq;
  double base;
  bool inverse;
  MESHMOE_HD void operator()(int64_t n, int64_t j) const {
    const int half = D / 2;
    const int64_t head = j / half, i = j % half;
    const int p = position ? position[n] : int(n % T_seq);
    const double angle = double(p) * std::pow(base, -2.0 * double(i) / double(D));
    const T c = T(std::cos(angle)), s = inverse ? T(-std::sin(angle)) : T(std::sin(angle));
    T* row = x + n * ld + head * D;
    const T a = row[i], b = row[i + half];
    row[i] = a * c - b * s;
    row[i + half] = b * c + a * s;
  }
};

// out[n] = position[n], or n % T_seq without positions: the positions a layer keeps for its backward.
struct RopePositions {
  const int32_t* position;
  int32_t* out;
  int T_seq;
  MESHMOE_HD void operator()(int64_t n) const { out[n] = position ? position[n] : int32_t(n % T_seq); }
};

}  // namespace meshmoe
