// Expert parallelism over the tensor axis (Pipeline-MoE, arXiv 2304.11414 section 3.3 and Algorithm 1):
// the tokens are replicated over the tensor group and every rank runs the same (replicated) router.
// Tensor rank t owns experts [t*E_local, (t+1)*E_local); its dispatch is the index selection of
// the tokens routed to ITS experts (the local dispatcher, local_dispatcher.hpp, with a layout of only
// those experts: no communication), its combine gives a partial y holding only its experts'
// contributions, and one all-reduce over tensor completes y. The shared experts' hidden units are
// split over the same ranks: their partial output joins the routed partial sum before that
// all-reduce, and their partial input gradient the dispatch's (moe_layer.hpp), so they add no
// collective.
//
// Backward: dy is replicated; each rank gets the expert gradients of its experts, and a partial
// input gradient (dispatch path) and a partial gate gradient (only choices on its experts). Both
// partial sums travel in ONE all-reduce of [N*M + N*k] elements, after which every rank runs the
// (replicated) router backward on the full dgate: the router weight gradient comes out complete
// and identical on every tensor rank (what the trainer assumes of a parameter not split over
// tensor), and the router's share of dx needs no communication. The alternative, a router backward
// on partial dgates followed by an all-reduce of the router gradient, would move M*E more elements
// per layer instead of N*k, need a scratch copy of wg.g (it accumulates over micro-batches), and
// count the aux and z terms on one rank only: not cheaper, and easier to get wrong.
#pragma once
#include <vector>

#include "mesh/comm.hpp"
#include "model/context.hpp"
#include "model/layer_shapes.hpp"
#include "model/moe/local_dispatcher.hpp"
#include "model/placement.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class IndexSelectDispatcher {
 public:
  // Over the tensor axis of `place` (tensor_size ranks, this one tensor_rank); E experts of width M.
  IndexSelectDispatcher(const Placement& place, int E, int M);

  // The stages (token_dispatcher.hpp).
  void dispatch(const StepContext& ctx, const Routing<T>& r, const T* x, const AtDispatchWait& at_wait) {
    local_.dispatch(ctx, r, x, at_wait);
  }
  ExpertRows<T> expert_input() { return local_.expert_input(); }
  void release_expert_input() {}
  void combine(const StepContext& ctx, const Routing<T>& r, const T* shared, T* y);
  void combine_backward(const StepContext& ctx, const Routing<T>& r, const T* dy);
  ExpertGradRows<T> expert_grads();
  T* shared_input_grad(T* dx) { return dxp_.data(); }
  void dispatch_backward(const StepContext& ctx, const Routing<T>& r, T* dx);
  Buffer<T>& gate_grad() { return local_.gate_grad(); }
  bool folds_shared_partial_sums() const { return true; }

  template <class F>
  void saved_state(F&& f) {
    local_.saved_state(f);
  }

  const std::vector<int>& expert_rows() const { return local_.expert_rows(); }
  const Buffer<int64_t>& expert_row_token() const { return local_.expert_row_token(); }
  IndexDispatcher<T>& permutation() { return local_.permutation(); }

 private:
  // y [N, M]: partial (this rank's experts) -> full, in place.
  void reduce_output(const StepContext& ctx, T* y, size_t n);
  // dx_partial [N*M], dgate [N*k]: partial -> full, in place, in one all-reduce.
  void reduce_grads(const StepContext& ctx, T* dx_partial, size_t n_dx, T* dgate, size_t n_gate);

  Comm* comm_;
  int tensor_size_;
  Split experts_;  // [e0, e0 + E_l)
  int M_;
  LocalDispatcher<T> local_;  // the token side: this rank's experts
  // Backward scratch: dxp [N, M], this rank's partial dx (the dispatch's and the shared experts'),
  // and the all-reduce's pack [N M + N k].
  Buffer<T> dxp_, pack_;
  size_t dx_elems_ = 0;  // N M of the backward
};

}  // namespace meshmoe
