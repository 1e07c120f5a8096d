// The experts of one MoE layer: E_local position-wise feed-forward networks without biases,
// FFN_e(x) = act(x W_in[e]) W_out[e] (GShard Algorithm 2 lines 4-6), run as one GEMM per expert over
// its G*C buffer rows. Expert dropout (Switch section 2.4) on the hidden layer.
//
// Holds experts [e0, e0 + E_local) of the layer's E; the weights are registered as that block of
// the logical [E, M, H'] and [E, H, M] tensors (ParamStore::add_block), so a sharded layer
// initialises and checkpoints exactly as the unsharded one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/context.hpp"
#include "model/moe/moe_options.hpp"
#include "model/params.hpp"

namespace meshmoe {

template <typename T>
class Experts {
 public:
  // e_local < 0 means all experts.
  explicit Experts(const MoeOptions& opt, int e0 = 0, int e_local = -1)
      : opt_(opt), e0_(e0), e_local_(e_local < 0 ? opt.num_experts : e_local) {}

  // prefix.w_in [E, M, H'] (H' = 2H for geglu, fan_in M), prefix.w_out [E, H, M] (fan_in H).
  void declare(ParamStore<T>& store, const std::string& prefix);

  // x [E_local, R, M] -> y [E_local, R, M] (overwritten), R rows per expert (= G*C).
  // row_token [E_local * R]: global index of the token in each row, -1 for an empty row (keys the
  // expert dropout, so sharding cannot change it).
  void forward(const StepContext& ctx, const T* x, T* y, int R, const int64_t* row_token);
  // dy [E_local, R, M] -> dx [E_local, R, M] (added), w_in.g, w_out.g (added)
  void backward(const StepContext& ctx, const T* dy, T* dx, int R);

  int e0() const { return e0_; }
  int e_local() const { return e_local_; }
  ParamView<T> w_in, w_out;

 private:
  MoeOptions opt_;
  int e0_, e_local_;
  std::vector<T> x_;     // [E_local, R, M] input
  std::vector<T> pre_;   // [E_local, R, H'] pre-activation
  std::vector<T> h_;     // [E_local, R, H] activation after dropout
  std::vector<T> mask_;  // [E_local, R, H] dropout scale: 0 or 1/(1-p) (empty without dropout)
};

}  // namespace meshmoe
