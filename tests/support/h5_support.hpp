// Test helpers over src/io/h5.hpp: a block decomposition, and the reads and writes only the tests
// make.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "core/error.hpp"
#include "io/h5.hpp"

namespace meshmoe::test {

// Splits n rows over `parts` as evenly as possible (the first n % parts parts get one extra);
// returns {offset, count} of part `p`.
inline std::pair<int64_t, int64_t> even_split(int64_t n, int parts, int p) {
  int64_t base = n / parts, extra = n % parts;
  int64_t offset = p * base + std::min<int64_t>(p, extra);
  return {offset, base + (p < extra ? 1 : 0)};
}

// A scalar string dataset (Location::write_string's).
inline std::string read_string(const h5::Location& loc, const std::string& name) {
  const h5::Dataset d = loc.dataset(name);
  auto v = d.read_strings();
  if (v.size() != 1) throw Error(d.file_name() + ":" + d.path() + ": not a scalar string");
  return v[0];
}

// Sharded write of a logical array of shape `global_shape`: creates the dataset (collective) and
// writes this rank's block [offset, offset + count) in one collective H5Dwrite.
template <typename T>
h5::Dataset write_sharded(h5::Location& loc, const std::string& name, const h5::Dims& global_shape,
                          const h5::Dims& offset, const h5::Dims& count, const T* data,
                          const h5::CreateOptions& opt = {}) {
  h5::Dataset d = loc.create_dataset<T>(name, global_shape, opt);
  d.write_block(offset, count, data);
  return d;
}

// Reads the block [offset, offset + count) (collective on a parallel file); the decomposition may
// differ from the one written.
template <typename T>
void read_sharded(const h5::Location& loc, const std::string& name, const h5::Dims& offset, const h5::Dims& count,
                  T* data) {
  loc.dataset(name).read_block(offset, count, data);
}

}  // namespace meshmoe::test
