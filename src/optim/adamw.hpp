// AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Algorithm 2), with the
// exact arithmetic of torch.optim.AdamW (torch 1.13, amsgrad = False). For update t (1-based):
//   x <- x * (1 - lr * wd)                     only params without no_weight_decay
//   m <- beta1 * m + (1 - beta1) * g
//   v <- beta2 * v + (1 - beta2) * g^2
//   x <- x - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Element-wise: any subset of entries, any block of a sharded param, no communication. A step is
// one launch over every owned parameter (AdamWUpdatePieces).
#pragma once
#include "tensor/device.hpp"
#include "optim/optimizer.hpp"
#include "optim/optimizer_bodies.hpp"

namespace meshmoe {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
  static AdamWOptions from_config(const Config& cfg);
};

class AdamW final : public Optimizer {
 public:
  AdamW(const ParamStore<float>& store, std::vector<size_t> owned, AdamWOptions opt);
  AdamW(const AdamW&) = delete;  // pieces_ points into m_ and v_
  AdamW& operator=(const AdamW&) = delete;
  void step(ParamStore<float>& store, double lr, int64_t t, double grad_scale = 1.0) override;
  std::vector<StateTensor> state() override;

 private:
  AdamWOptions opt_;
  std::vector<ParamInfo> infos_;                 // copies of the owned entries
  std::vector<Buffer<float>> m_, v_;        // per owned entry, param's local shape; never resized
  Buffer<AdamWPiece> pieces_;               // every owned element, in pieces (one launch a step)
};

}  // namespace meshmoe
