#include "optim/grad_clip.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/elementwise.hpp"
#include "tensor/launch_rows.hpp"
#include "tensor/step_scalars.hpp"
#include "optim/optimizer.hpp"

namespace meshmoe {

EntrySumSquares::EntrySumSquares(const ParamStore<float>& store, const std::vector<size_t>& entries)
    : first_(entries.size() + 1, 0) {
  constexpr int64_t kChunk = SumSquaresChunk<float>::kChunk;
  std::vector<SumSquaresPiece> pieces;
  for (size_t k = 0; k < entries.size(); ++k) {
    const ParamInfo& p = store.infos()[entries[k]];
    const int64_t n = int64_t(p.size);
    for (int64_t c = 0; c < sum_squares_chunks<float>(p.size); ++c)
      pieces.push_back({int64_t(p.flat_offset) + c * kChunk, std::min(kChunk, n - c * kChunk)});
    first_[k + 1] = int64_t(pieces.size());
  }
  pieces_.assign(pieces.begin(), pieces.end());
  partials_.resize(pieces.size());
}

// The chunk sums on the device, then each entry's chunks added in order (the sums of sum_squares)
// on the host, from the step's read of its scalars (a transfer point).
void EntrySumSquares::queue(const ParamStore<float>& store, std::vector<double>& sums) {
  for_each_row(int64_t(pieces_.size()), SumSquaresPieces<float>{pieces_.data(), store.grads(), partials_.data()},
               SumSquaresChunk<float>::kChunk);
  sums.assign(first_.size() - 1, 0.0);
  step_scalars().defer(partials_.data(), partials_.size() * sizeof(double), [this, &sums](const void* host) {
    const double* chunks = static_cast<const double*>(host);
    for (size_t k = 0; k < sums.size(); ++k)
      for (int64_t c = first_[k]; c < first_[k + 1]; ++c) sums[k] += chunks[size_t(c)];
  });
}

std::vector<double> EntrySumSquares::operator()(const ParamStore<float>& store) {
  std::vector<double> sums;
  queue(store, sums);
  step_scalars().read();
  return sums;
}

double clip_scale(double global_norm, double max_norm) {
  if (!std::isfinite(global_norm)) return std::numeric_limits<double>::quiet_NaN();
  if (max_norm <= 0) return 1.0;
  const double c = max_norm / (global_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

void scale_grads(ParamStore<float>& store, const std::vector<size_t>& entries, double scale) {
  if (scale == 1.0) return;
  // Entries adjacent in the flat buffer make one range, one launch (every entry, often).
  size_t begin = 0, end = 0;
  for (size_t e : entries) {
    const ParamInfo& p = store.infos()[e];
    if (p.flat_offset != end) {
      if (end > begin) scale_by(store.grads() + begin, end - begin, float(scale));
      begin = p.flat_offset;
    }
    end = p.flat_offset + p.size;
  }
  if (end > begin) scale_by(store.grads() + begin, end - begin, float(scale));
}

void scale_grads(ParamStore<float>& store, double scale) {
  if (scale == 1.0) return;
  scale_by(store.grads(), store.size(), float(scale));
}

}  // namespace meshmoe
