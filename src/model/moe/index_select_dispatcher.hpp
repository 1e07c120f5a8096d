// Expert parallelism over the tensor axis (Pipeline-MoE, arXiv 2304.11414 section 3.3 and Algorithm 1):
// the tokens are replicated over the tensor group and every rank runs the same (replicated) router.
// Tensor rank t owns experts [t*E_local, (t+1)*E_local); its dispatch is the index selection of
// the tokens routed to ITS experts (IndexDispatcher with a layout of only those experts: no
// communication), its combine gives a partial y holding only its experts' contributions, and one
// all-reduce over tensor completes y.
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
#include "model/moe/dispatcher.hpp"
#include "model/placement.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class IndexSelectDispatcher {
 public:
  // Over the tensor axis of `place` (tensor_size ranks, this one tensor_rank); E experts.
  IndexSelectDispatcher(const Placement& place, int E);

  // The local layout: this rank's experts.
  DispatchLayout layout() const { return {experts_.offset, experts_.local}; }
  int e0() const { return experts_.offset; }
  int e_local() const { return experts_.local; }

  // y [N, M]: partial (this rank's experts) -> full, in place.
  void reduce_output(const StepContext& ctx, T* y, size_t n);
  // dx_partial [N*M], dgate [N*k]: partial -> full, in place, in one all-reduce.
  void reduce_grads(const StepContext& ctx, T* dx_partial, size_t n_dx, T* dgate, size_t n_gate);

 private:
  Comm* comm_;
  int tensor_size_;
  Split experts_;  // [e0, e0 + E_l)
  Buffer<T> pack_;
};

}  // namespace meshmoe
