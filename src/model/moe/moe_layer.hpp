// The MoE feed-forward layer as a fixed pipeline of named stages (Megatron-LM style):
//   route -> dispatch -> experts -> combine
// y = sum over a token's dispatched choices of gate * FFN_e(x) (GShard eq. in section 2.2; no residual:
// the block adds it). The placement (model/placement.hpp) decides where the experts live, and so
// the token dispatcher (token_dispatcher.hpp), chosen once, and the communication the stages carry:
//   single rank            dispatch/combine are the local index permutation (LocalDispatcher);
//   expert_axis = data     + two all-to-alls over data (AllToAllDispatcher), and with tensor > 1
//                          an all-reduce over tensor inside each expert (Switch 5.5);
//   expert_axis = tensor   index selection of this rank's experts + all-reduce over tensor of the
//                          combined output (IndexSelectDispatcher, Pipeline-MoE).
// The forward and backward are the same four stages whatever the dispatcher.
// Shared experts (moe.shared_experts = n; DeepSpeed-MoE's residual MoE, DeepSeekMoE eq. 3): every
// token also goes through n dense feed-forwards of width H, their sum added to y. Since the
// activation is element-wise, sum_i act(x W_in_i) W_out_i = act(x [W_in_1 .. W_in_n]) [W_out_1; ..;
// W_out_n]: the n experts are one MLP of hidden width n H (one GEMM pair; for geglu the [M, 2, nH]
// layout pairs unit i H + j's gelu and gate columns as expert i's [M, 2, H] does). Its hidden units
// are split over tensor like the dense feed-forward's (Megatron): with experts over data its own
// all-reduce over tensor; with experts over tensor its partial output joins the routed partial sums
// before the combine's all-reduce (and its partial input gradient the dispatch's), so no collective
// is added. Timed inside "expert", its own all-reduce included. No dropout.
//
// Each stage is timed as a phase ("gate", "dispatch", "expert", "combine"; backward adds into the
// phase of the forward stage it mirrors); the communication inside is also timed on its own as
// "moe_alltoall" (inside dispatch and combine) and "moe_allreduce" (inside expert or combine, and
// the index-select dispatch's backward).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/context.hpp"
#include "model/mlp.hpp"
#include "model/moe/experts.hpp"
#include "model/moe/moe_options.hpp"
#include "model/moe/router.hpp"
#include "model/moe/token_dispatcher.hpp"
#include "model/params.hpp"
#include "model/placement.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

// What the trainer logs after a forward (metrics.h5 /moe/<layer>/...). Always counts of THIS rank's
// tokens over all E experts, whatever the placement (with expert_axis = tensor every tensor rank
// reports the same full counts); the trainer sums them over data.
struct MoeStats {
  double aux_sum = 0;          // sum over local groups of the load-balancing loss (moe.aux_loss_form)
  double z_sum = 0;            // sum over local tokens of logsumexp(logits)^2
  std::vector<int64_t> load;   // [E] choices dispatched to each expert
  int64_t wanted = 0;          // choices meant to be dispatched (N*k minus declined second choices)
  int64_t dropped = 0;         // of those, choices dropped for capacity: dropped fraction = dropped / wanted
  int64_t rerouted = 0;        // choices placed by No-Token-Left-Behind
  int64_t declined = 0;        // second choices not dispatched by random / threshold routing
  std::vector<int64_t> expert_dropped, expert_rerouted, expert_declined;  // [E] the three above per expert (Routing)
  int64_t tokens = 0;          // N routed tokens
  int64_t second_choices = 0;  // N * (k - 1): the choices random / threshold routing may decline
  int64_t capacity = 0;        // C, slots per expert and group
  double entropy_sum = 0;      // sum over tokens of the router softmax's entropy (nats)
  double bias_max_abs = 0;     // moe.balance = bias: max |selection bias| the forward ranked with
  // [kExpertCountBins] tokens dispatched to 0, 1, 2, >= 3 experts (expert choice: 0..E per token)
  std::vector<int64_t> experts_per_token;
  static constexpr int kExpertCountBins = Routing<float>::kPlacedBins;
};

template <typename T>
class MoeLayer {
 public:
  explicit MoeLayer(const MoeOptions& opt, const Placement& placement = {});

  // prefix.router.wg [M, E], prefix.experts.w_in [E, M, H] or [E, M, 2, H] (geglu),
  // prefix.experts.w_out [E, H, M]; the experts as this rank's block; with shared experts
  // prefix.shared.w_in [M, nH] or [M, 2, nH], prefix.shared.w_out [nH, M] (shared_expert_params).
  void declare(ParamStore<T>& store, const std::string& prefix);

  // x [N, M] -> y [N, M] (overwritten). N must be a multiple of moe.group_size.
  void forward(const StepContext& ctx, const T* x, T* y, int N);
  // dy [N, M] -> dx [N, M] (added), parameter gradients (added). aux_weight and z_weight multiply
  // stats().aux_sum and stats().z_sum in the trainer's loss.
  void backward(const StepContext& ctx, const T* dy, T* dx, int N, double aux_weight, double z_weight);

  // What backward reads of the last forward, the stages' included (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    router.saved_state(f);
    dispatcher.saved_state(f);
    experts.saved_state(f);
    if (shared) shared->saved_state(f);
  }

  const MoeStats& stats() const { return stats_; }

  Router<T> router;
  Experts<T> experts;                 // this rank's experts (and hidden units)
  TokenDispatcher<T> dispatcher;      // chosen by the placement
  std::unique_ptr<MLP<T>> shared;     // moe.shared_experts > 0: this rank's hidden units

 private:
  void record_stats();  // in dispatch: the router's totals, read at the layer's one wait
  void run_shared(const StepContext& ctx, const T* x, int N);

  MoeOptions opt_;
  Placement place_;
  Buffer<T> shared_out_;  // [N, M] the shared experts' output (a partial sum over tensor when folded), forward only
  MoeStats stats_;
};

}  // namespace meshmoe
