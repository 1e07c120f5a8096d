// Rotary position embedding (RoFormer, Su et al. 2021; model.position = "rope"), as the Hugging
// Face Llama and Mixtral code applies it to the queries and keys: dimension i of a head is paired
// with dimension i + D/2 and the pair is rotated by position * rope_base^(-2i/D), position the
// token's place in its packed example (the batcher's positions, as the learned table reads them).
// Rotation is linear and orthogonal, so the backward rotates the gradients by the opposite angle.
// The body is in model/rope_bodies.hpp, its GPU instantiation in model/rope.cu.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "model/rope_bodies.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

// Rotates, in place, the `heads` heads of D columns of each of the N rows of x (row stride ld).
// position [N] device-readable, or null: n % T_seq. inverse: the backward's rotation.
template <typename T>
void rope_rotate(T* x, int N, int heads, int D, int ld, const int32_t* position, int T_seq, double base,
                 bool inverse) {
  if (D % 2 != 0) throw std::logic_error("rope_rotate: an odd head width");
  if (N == 0 || heads == 0) return;
  for_each_index_2d(N, int64_t(heads) * (D / 2),
                    RopeRotatePair<T>{.x = x, .position = position, .ld = ld, .D = D, .T_seq = T_seq, .base = base,
                                      .inverse = inverse});
}

// out [N] = position [N] (device-readable), or n % T_seq when null.
inline void rope_positions(const int32_t* position, int32_t* out, int N, int T_seq) {
  for_each_index(N, RopePositions{.position = position, .out = out, .T_seq = T_seq});
}

}  // namespace meshmoe
