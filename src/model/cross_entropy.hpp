// Masked softmax cross-entropy with the "sum then scale" pattern: forward returns
//   weight * sum_n mask_n * (logsumexp(logits_n) - logits_n[target_n])
// over this rank's tokens, the trainer passing weight = 1 / (masked tokens of the whole step), so
// sharded runs add up to exactly the single-rank loss.
// With soft targets (distillation, Switch section 4.2) each token's loss is the mixture
//   (1 - alpha) CE(ground truth) + alpha CE(teacher probabilities)   (cross_entropy_bodies.hpp).
#pragma once
#include <cstdint>
#include <span>

#include "model/context.hpp"
#include "model/cross_entropy_bodies.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class CrossEntropy {
 public:
  // logits [N, V], targets [N], mask [N] (0/1; nullptr = all ones) -> weighted loss sum (accumulated
  // in double). The targets and the mask are host memory (the micro-batch): checked and uploaded
  // here. Targets of masked tokens are ignored (may be -1); others must lie in [0, V).
  // With `soft` [N, V] (device-readable, copied), the teacher's probabilities of every token, the
  // loss per token is (1 - alpha) CE(target) + alpha CE(soft); the sum returned is that mixture's.
  double forward(const StepContext& ctx, const T* logits, const int32_t* targets, const T* mask, int N, int V,
                 double weight, const T* soft = nullptr, double alpha = 0);
  // dlogits [N, V] = weight * mask * (softmax(logits) - onehot(target)), OVERWRITTEN; with soft
  // targets the mixture's gradient. `logits` must be what forward saw; dlogits may alias logits
  // (in-place, saves an [N, V] buffer).
  // A no-op after forward_with_gradient (dlogits must then be the logits it overwrote).
  void backward(const StepContext& ctx, const T* logits, T* dlogits, int N);
  // forward, then backward's dlogits written over the logits in the same pass over each row (one
  // read of the [N, V] logits instead of two, one exp per element instead of two): the same
  // return value, state and dlogits, bit for bit, as forward then backward(logits, logits).
  double forward_with_gradient(const StepContext& ctx, T* logits, const int32_t* targets, const T* mask, int N, int V,
                               double weight, const T* soft = nullptr, double alpha = 0);

  // What backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(V_);
    f(weight_);
    f(lse_);
    f(mask_);
    f(targets_);
    f(alpha_);
    f(soft_);
    f(psum_);
    f(gradient_done_);
  }

  // From the last forward: unweighted per-token loss [N] against the ground truth (0 where
  // masked), the masked-token count; with soft targets, the unweighted per-token cross-entropy
  // against them (else empty). While a training step collects its scalars (tensor/step_scalars.hpp)
  // these, and forward's sum, are known from the step's read on: the forward's figures in a
  // callback after it (StepScalars::then), its sum returned NaN.
  std::span<const double> per_token_loss() const { return host_losses(0); }
  std::span<const double> per_token_soft_loss() const {
    return loss_rows_ == 3 ? host_losses(1) : std::span<const double>{};
  }
  double count() const { return count_; }

 private:
  // forward's work; with `dlogits` (= logits), forward_with_gradient's.
  double run_forward(const T* logits, const int32_t* targets, const T* mask, int N, int V, double weight,
                     const T* soft, double alpha, T* dlogits);
  CrossEntropyBackwardElement<T> backward_body(const T* logits, T* dlogits) const;

  int V_ = 0;
  bool gradient_done_ = false;  // the last forward was forward_with_gradient
  double weight_ = 0, count_ = 0, alpha_ = 0;
  // [N] per-token losses; with soft targets [3, N]: the hard loss, the soft loss and the mixed
  // objective, one after the other, so that the host takes them in one copy.
  Buffer<double> losses_;
  Buffer<T> lse_, mask_;  // [N]
  Buffer<T> soft_, psum_;  // soft targets [N, V] (empty without), their row sums [N]
  Buffer<int32_t> targets_;
  std::vector<T> host_mask_;                          // [N] the host's mask (1 where none)
  std::vector<double> host_losses_;                   // the host's copy of losses_
  int loss_rows_ = 1;                                 // its rows: 1, or 3 with soft targets
  double sum_ = 0;                                    // the last forward's weighted sum
  std::span<const double> host_losses(int row) const;  // its row [N]: 0 hard, 1 soft, 2 mixed
};

}  // namespace meshmoe
