// bfloat16 rounding (model.precision = "bf16", Switch Transformer section 2.4: selective
// precision). A bf16 value is the upper 16 bits of an fp32 value (sign, 8 exponent bits, 7 mantissa
// bits), so it is held here as an fp32 whose lower 16 bits are zero: the host emulation of a bf16 GEMM
// rounds copies of its operands with round_bf16 and runs the fp32 sgemm. The product of two bf16
// values is exact in fp32 (8 + 8 significant bits), so that sgemm computes what a bf16 GEMM with fp32
// accumulation computes, up to the order of the sum (docs/ARCHITECTURE.md "Precision").
// Header-only and free of other project headers but core/hd.hpp: the CUDA conversion kernel uses
// the same function, so host and GPU round every value alike.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/hd.hpp"

namespace meshmoe {

MESHMOE_HD inline uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

MESHMOE_HD inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// The upper 16 bits of x rounded to nearest, ties to even (IEEE 754 roundTiesToEven on bf16):
// subnormals round like normal numbers, a value at or above the midpoint between the largest
// finite bf16 (0x7f7f: 3.3895314e38) and 2^128 becomes infinity, infinities stay, and a NaN stays a
// NaN (its quiet bit is set first, so dropping its lower payload bits cannot leave an infinity).
MESHMOE_HD inline uint16_t bf16_bits(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u | 0x00400000u) >> 16);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // adding half an ulp (less one when the kept part is even)
  return uint16_t(u >> 16);
}

MESHMOE_HD inline float bf16_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }

// x rounded to the nearest bf16 value, as an fp32.
MESHMOE_HD inline float round_bf16(float x) { return bf16_to_float(bf16_bits(x)); }

}  // namespace meshmoe
