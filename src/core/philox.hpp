// Counter-based random numbers (Philox 4x32-10, Salmon et al. 2011). Every random number in
// meshmoe is a pure function of (seed, step, layer, purpose, global index), so no stream depends
// on the rank layout (docs/ARCHITECTURE.md "Principles" 1).
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

#include "core/hd.hpp"

namespace meshmoe {

enum class RngPurpose : uint32_t {
  Init = 1,
  Jitter = 2,
  SecondExpert = 3,
  Dropout = 4,
  ExpertDropout = 5,
  DataShuffle = 6,
  LanguageSample = 7,
  Sampling = 8,  // decoding's sampled tokens (src/decode/sampling.cpp)
  UpcycleNoise = 9,  // `train --upcycle-noise` (src/checkpoint/checkpoint_init.cpp)
  Test = 255
};

MESHMOE_HD inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(M0) * ctr[0];
    const uint64_t p1 = uint64_t(M1) * ctr[2];
    ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1), uint32_t(p0 >> 32) ^ ctr[3] ^ key[1], uint32_t(p0)};
    key[0] += W0;
    key[1] += W1;
  }
  return ctr;
}

// The stream of one purpose in one layer at one step. `index` is a global (logical) index: a token's
// position in the global batch, an element's position in the logical (unsharded) parameter.
struct Rng {
  uint64_t seed = 0;
  uint32_t step = 0;
  uint32_t layer = 0;  // layer or parameter ordinal, < 2^24
  RngPurpose purpose = RngPurpose::Test;

  // Four independent 32-bit words for (index, draw). `draw` (< 256) selects further blocks for
  // the same index (e.g. resampling).
  MESHMOE_HD std::array<uint32_t, 4> bits(uint64_t index, uint32_t draw = 0) const {
    return philox4x32({uint32_t(index), uint32_t(index >> 32), step, (layer << 8) | uint32_t(purpose)},
                      {uint32_t(seed) ^ (draw << 24), uint32_t(seed >> 32)});
  }
  // Uniform in [0, 1): 24 random bits of word `lane` (0..3).
  MESHMOE_HD double uniform_double(uint64_t index, int lane = 0, uint32_t draw = 0) const {
    return double(bits(index, draw)[lane] >> 8) * (1.0 / 16777216.0);
  }
  // Standard normal truncated to [-2, 2] by resampling (Switch section 2.4 init): Box-Muller on
  // fresh blocks until a value falls inside.
  MESHMOE_HD double truncated_normal(uint64_t index) const {
    for (uint32_t draw = 0;; ++draw) {
      const auto b = bits(index, draw);
      for (int pair = 0; pair < 2; ++pair) {
        const double u1 = (double(b[2 * pair]) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
        const double u2 = double(b[2 * pair + 1]) * (1.0 / 4294967296.0);
        const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
        if (std::abs(z) <= 2.0) return z;
      }
    }
  }
};

}  // namespace meshmoe
