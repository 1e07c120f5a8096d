// Stable hashes: FNV-1a of a string (dataset splits, parameter random streams), SplitMix64 of a key.
#pragma once
#include <cstdint>
#include <string_view>

namespace meshmoe {

inline uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// SplitMix64's finaliser: a stable, well-mixed hash of a 64-bit key (the per-language evaluation
// sample, data/dataset.hpp; postprocess/valid_pairs.py computes the same).
inline uint64_t mix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace meshmoe
