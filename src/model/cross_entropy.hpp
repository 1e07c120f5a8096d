// Masked softmax cross-entropy with the "sum then scale" pattern: forward returns
//   weight * sum_n mask_n * (logsumexp(logits_n) - logits_n[target_n])
// over this rank's tokens, the trainer passing weight = 1 / (masked tokens of the whole step), so
// sharded runs add up to exactly the single-rank loss.
#pragma once
#include <cstdint>

#include "model/context.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class CrossEntropy {
 public:
  // logits [N, V], targets [N], mask [N] (0/1; nullptr = all ones) -> weighted loss sum (accumulated
  // in double). Targets of masked tokens are ignored (may be -1); others must lie in [0, V).
  double forward(const StepContext& ctx, const T* logits, const int32_t* targets, const T* mask, int N, int V,
                 double weight);
  // dlogits [N, V] = weight * mask * (softmax(logits) - onehot(target)), OVERWRITTEN. `logits` must be
  // what forward saw; dlogits may alias logits (in-place, saves an [N, V] buffer).
  void backward(const StepContext& ctx, const T* logits, T* dlogits, int N);

  // What backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(V_);
    f(weight_);
    f(lse_);
    f(mask_);
    f(targets_);
  }

  // From the last forward: unweighted per-token loss [N] (0 where masked), the masked-token count.
  const Buffer<double>& per_token_loss() const { return loss_; }
  double count() const { return count_; }

 private:
  int V_ = 0;
  double weight_ = 0, count_ = 0;
  Buffer<double> loss_;   // [N]
  Buffer<T> lse_, mask_;  // [N]
  Buffer<int32_t> targets_;
};

}  // namespace meshmoe
