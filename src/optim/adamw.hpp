// AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Algorithm 2), with the
// exact arithmetic of torch.optim.AdamW (torch 1.13, amsgrad = False). For update t (1-based):
//   x <- x * (1 - lr * wd)                     only params without no_weight_decay
//   m <- beta1 * m + (1 - beta1) * g
//   v <- beta2 * v + (1 - beta2) * g^2
//   x <- x - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Element-wise: any subset of entries, any block of a sharded param, no communication. A step is
// one launch over every owned parameter (AdamWUpdatePieces). With run.cuda_graphs that launch is
// captured once as a device graph (tensor/device_graph.hpp) and the graph launched every step; it
// then reads the step's values (of lr, t and the clipping factor) from a device Buffer written
// before the launch, not from its arguments, which the graph keeps as they were at the capture.
#pragma once
#include <array>

#include "tensor/device.hpp"
#include "tensor/device_graph.hpp"
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
  bool set_update_graph(bool on) override;

 private:
  void launch_update(ParamStore<float>& store, const AdamWStepValues& now, const AdamWStepValues* step);
  AdamWOptions opt_;
  std::vector<ParamInfo> infos_;                 // copies of the owned entries
  std::vector<Buffer<float>> m_, v_;        // per owned entry, param's local shape; never resized
  Buffer<AdamWPiece> pieces_;               // every owned element, in pieces (one launch a step)
  Buffer<AdamWStepValues> step_values_;     // this step's, written before the update reads them
  bool graphs_ = false;                     // set_update_graph
  DeviceGraph graph_;                       // the update, captured at the first step with graphs_
  std::array<const void*, 3> graph_store_{};  // the store's weights, gradients and bf16 copy it was captured for
};

}  // namespace meshmoe
