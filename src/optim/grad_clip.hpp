// Global gradient-norm clipping, split so that sharded gradients work: each rank sums the squares
// of the gradients it is responsible for (EntrySumSquares, in double), GradientSync::global_norm
// all-reduces the partial sums (counting each replicated gradient once) and takes the square root,
// and every rank scales its gradients by clip_scale(norm, optim.grad_clip):
//   scale = min(1, clip / (norm + 1e-6))
// as torch.nn.utils.clip_grad_norm_ (the 1e-6 guards a zero norm); clip = 0 disables clipping.
#pragma once
#include <vector>

#include "model/params.hpp"
#include "tensor/device.hpp"
#include "optim/optimizer_bodies.hpp"

namespace meshmoe {

// The sum of squared gradients of each of a fixed list of entries (indices into store.infos()),
// called each step (the gradient norm): the entries' chunks are listed on the device once, and a
// call is one launch over all of them (not one per entry) and one wait: the read of the step's
// scalars (tensor/step_scalars.hpp), the chunk sums with the rest. An entry's sum is sum_squares's
// of its gradient, the same bits.
class EntrySumSquares {
 public:
  EntrySumSquares() = default;
  EntrySumSquares(const ParamStore<float>& store, const std::vector<size_t>& entries);
  std::vector<double> operator()(const ParamStore<float>& store);  // per entry, in the list's order
  // The launch alone: `sums` (per entry, kept alive by the caller) is filled at the next
  // step_scalars().read(), or at once outside a step's collection.
  void queue(const ParamStore<float>& store, std::vector<double>& sums);

 private:
  std::vector<int64_t> first_;      // entry k's chunks: [first_[k], first_[k + 1]); one more than the entries
  Buffer<SumSquaresPiece> pieces_;  // every chunk, in entry order
  Buffer<double> partials_;
};

// The factor to multiply every gradient by. A non-finite norm gives NaN (never silently 1): the
// caller must check and stop, rather than step on NaN/Inf gradients.
double clip_scale(double global_norm, double max_norm);

// g <- g * scale for the given entries / every entry (no-op when scale == 1).
void scale_grads(ParamStore<float>& store, const std::vector<size_t>& entries, double scale);
void scale_grads(ParamStore<float>& store, double scale);

}  // namespace meshmoe
