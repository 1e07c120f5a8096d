// 64-bit FNV-1a: a stable hash of a string (dataset splits, parameter random streams).
#pragma once
#include <cstdint>
#include <string_view>

namespace meshmoe {

inline uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace meshmoe
