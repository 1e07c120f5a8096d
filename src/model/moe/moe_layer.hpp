// The MoE feed-forward layer as a fixed pipeline of named stages (Megatron-LM style):
//   route -> dispatch -> experts -> combine
// y = sum over a token's dispatched choices of gate * FFN_e(x) (GShard eq. in section 2.2; no residual:
// the block adds it). Single-rank form: all E experts are local and the dispatcher is the local index
// permutation; the sharded dispatchers insert their communication between the stages.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/context.hpp"
#include "model/moe/dispatcher.hpp"
#include "model/moe/experts.hpp"
#include "model/moe/moe_options.hpp"
#include "model/moe/router.hpp"
#include "model/params.hpp"

namespace meshmoe {

// What the trainer logs after a forward (metrics.h5 /moe/<layer>/...).
struct MoeStats {
  double aux_sum = 0;          // sum over local groups of E * sum_e f_e P_e (Switch eq. 4 without alpha)
  double z_sum = 0;            // sum over local tokens of logsumexp(logits)^2
  std::vector<int64_t> load;   // [E] choices dispatched to each expert
  int64_t wanted = 0;          // choices meant to be dispatched (N*k minus declined second choices)
  int64_t dropped = 0;         // of those, choices dropped for capacity: dropped fraction = dropped / wanted
  int64_t rerouted = 0;        // choices placed by No-Token-Left-Behind
  int64_t declined = 0;        // second choices not dispatched by random / threshold routing
};

template <typename T>
class MoeLayer {
 public:
  explicit MoeLayer(const MoeOptions& opt);

  // prefix.router.wg [M, E], prefix.experts.w_in [E, M, H'], prefix.experts.w_out [E, H, M]
  void declare(ParamStore<T>& store, const std::string& prefix);

  // x [N, M] -> y [N, M] (overwritten). N must be a multiple of moe.group_size.
  void forward(const StepContext& ctx, const T* x, T* y, int N);
  // dy [N, M] -> dx [N, M] (added), parameter gradients (added). aux_weight and z_weight multiply
  // stats().aux_sum and stats().z_sum in the trainer's loss.
  void backward(const StepContext& ctx, const T* dy, T* dx, int N, double aux_weight, double z_weight);

  const MoeStats& stats() const { return stats_; }
  const MoeOptions& options() const { return opt_; }

  Router<T> router;
  IndexDispatcher<T> dispatcher;
  Experts<T> experts;

 private:
  // The stages, in order.
  void route(const StepContext& ctx, const T* x, int N);
  void dispatch(const T* x);
  void run_experts(const StepContext& ctx);
  void combine(T* y);

  MoeOptions opt_;
  int rows_ = 0;            // G * C rows per expert
  std::vector<T> buf_;      // [E, G, C, M] expert inputs
  std::vector<T> out_;      // [E, G, C, M] expert outputs
  MoeStats stats_;
};

}  // namespace meshmoe
