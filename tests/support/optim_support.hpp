// Test helpers over src/optim: the gradient norm's sums of squares over a list of entries, as the
// tests take them (the trainer takes them through GradientSync::global_norm).
#pragma once
#include <cstddef>
#include <vector>

#include "model/params.hpp"
#include "optim/grad_clip.hpp"
#include "optim/optimizer.hpp"
#include "tensor/device.hpp"

namespace meshmoe::test {

// Entries holding the whole logical tensor (replicated: count them once) and entries holding a
// proper block (sharded: their partial sums all-reduced over the axes they are split on), so that
// norm^2 = grad_sum_squares(whole) + allreduce(grad_sum_squares(split)).
inline std::vector<size_t> entries_where(const ParamStore<float>& store, bool split) {
  std::vector<size_t> out;
  for (size_t e = 0; e < store.infos().size(); ++e)
    if ((store.infos()[e].local_shape != store.infos()[e].logical_shape) == split) out.push_back(e);
  return out;
}
inline std::vector<size_t> whole_entries(const ParamStore<float>& store) { return entries_where(store, false); }
inline std::vector<size_t> split_entries(const ParamStore<float>& store) { return entries_where(store, true); }

// Sum of squared gradients of the given entries (indices into store.infos()), each entry's sum
// (EntrySumSquares) added in the order of `entries`.
inline double grad_sum_squares(const ParamStore<float>& store, const std::vector<size_t>& entries) {
  double s = 0.0;
  for (double entry : EntrySumSquares(store, entries)(store)) s += entry;
  return s;
}
// Of every element of the store, in one sum_squares.
inline double grad_sum_squares(const ParamStore<float>& store) {
  Buffer<double> partials;
  return sum_squares(store.grads(), store.size(), partials);
}

}  // namespace meshmoe::test
