// The token dispatcher of an MoE layer: how the routed tokens reach the experts that hold them
// and come back (Megatron-Core's token dispatcher, Tutel's encode / decode), in the stages the
// layer calls, forward and backward side by side:
//
//   dispatch          routing r, x [N, M] -> the local experts' input rows, their row counts per
//                     local expert and global tokens (expert_input)
//   (the experts)     input rows -> output rows, in the dispatcher's buffers
//   combine           output rows (+ the shared experts' output) -> y [N, M]
//   combine_backward  dy [N, M] -> the output rows' gradient (expert_grads().dy), dgate [N k]
//   (the experts)     -> the input rows' gradient (expert_grads().dx)
//   dispatch_backward input rows' gradient -> dx [N, M] (added); dgate complete (gate_grad)
//
// Three implementations, one per placement (docs/ARCHITECTURE.md "The mesh"), chosen once from the
// Placement by the constructor:
//   LocalDispatcher        every expert on this rank (one rank, or experts not split over their
//                          axis): the local index permutation; no communication.
//   AllToAllDispatcher     expert_axis = data, P > 1 (GShard, Switch): the local permutation of all
//                          E experts, then an all-to-all over the expert group each way.
//   IndexSelectDispatcher  expert_axis = tensor, tensor > 1 (Pipeline-MoE section 3.3, Algorithm
//                          1): the local permutation of this rank's experts, then an all-reduce over
//                          tensor of the partial y (forward) and of the partial dx and dgate
//                          (backward), into which the shared experts' partial sums fold.
// The two that communicate are built on the local one (their token side), so the permutation and
// its buffers are one code; only their communicating stages talk to other ranks.
//
// A closed set (std::variant), not an abstract class: what a dispatcher saves for the backward is
// visited by the activation stash's generic visitor (saved_state, activation_stash.hpp), a template
// that a virtual function cannot take, and the placements are a fixed set.
#pragma once
#include <cstdint>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "model/context.hpp"
#include "model/moe/alltoall_dispatcher.hpp"
#include "model/moe/experts.hpp"
#include "model/moe/index_select_dispatcher.hpp"
#include "model/moe/local_dispatcher.hpp"
#include "model/moe/router.hpp"
#include "model/placement.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class TokenDispatcher {
 public:
  // The dispatcher of `place` for a layer of E experts of width M.
  TokenDispatcher(const Placement& place, int E, int M);

  // Tests only: "local", "all-to-all" or "index-select", the one the placement chose.
  std::string_view name() const;

  // Forward.
  // Routing r of this rank's tokens x [N, M] -> the local experts' input rows (expert_input). The
  // layer's one host wait is inside (docs/ARCHITECTURE.md "Device work and transfer points"): the
  // row counts are read there, and at_wait reads what the layer needs at the same wait.
  void dispatch(const StepContext& ctx, const Routing<T>& r, const T* x, const AtDispatchWait& at_wait) {
    visit([&](auto& d) { d.dispatch(ctx, r, x, at_wait); });
  }
  // The local experts' input rows of the last dispatch, with room for their output rows.
  ExpertRows<T> expert_input() {
    return visit([&](auto& d) { return d.expert_input(); });
  }
  // After each pass of the experts (forward and backward): the all-to-all frees its expert-side
  // copy of what they read (GShard section 5.1: a pass's buffers do not outlive it).
  void release_expert_input() {
    visit([&](auto& d) { d.release_expert_input(); });
  }
  // The experts' output rows -> y [N, M] (overwritten): y[n] = sum over n's dispatched choices of
  // gate * output row, plus shared [N, M] (the shared experts' output; with folds_shared_partial_sums()
  // this rank's partial sum over tensor) when not null.
  void combine(const StepContext& ctx, const Routing<T>& r, const T* shared, T* y) {
    visit([&](auto& d) { d.combine(ctx, r, shared, y); });
  }

  // Backward, in the mirrored order.
  // dy [N, M] -> the output rows' gradient and dgate [N k] (partial until dispatch_backward).
  void combine_backward(const StepContext& ctx, const Routing<T>& r, const T* dy) {
    visit([&](auto& d) { d.combine_backward(ctx, r, dy); });
  }
  // The experts' rows of the backward: their output gradient, and their input gradient zeroed.
  ExpertGradRows<T> expert_grads() {
    return visit([&](auto& d) { return d.expert_grads(); });
  }
  // Where the shared experts add their input gradient: dx itself, or (folds_shared_partial_sums())
  // this rank's partial dx, which dispatch_backward sums over tensor and adds to dx. Call after
  // expert_grads.
  T* shared_input_grad(T* dx) {
    return visit([&](auto& d) { return d.shared_input_grad(dx); });
  }
  // The experts' input rows' gradient -> dx [N, M] (added); gate_grad() complete.
  void dispatch_backward(const StepContext& ctx, const Routing<T>& r, T* dx) {
    visit([&](auto& d) { d.dispatch_backward(ctx, r, dx); });
  }
  // [N k] d loss / d gate of each choice, 0 where not dispatched (the router's backward reads it).
  const T* gate_grad() {
    return visit([&](auto& d) { return d.gate_grad().data(); });
  }

  // True when the shared experts' partial sums over tensor go through this dispatcher's
  // all-reduces (combine's shared, shared_input_grad) instead of their own (index-select).
  bool folds_shared_partial_sums() const {
    return std::visit([](const auto& d) { return d.folds_shared_partial_sums(); }, impl_);
  }

  // What the backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    visit([&](auto& d) { d.saved_state(f); });
  }

  // Tests only: the last forward's plan: rows per local expert, each row's global token, the permutation.
  const std::vector<int>& expert_rows() const {
    return std::visit([](const auto& d) -> const std::vector<int>& { return d.expert_rows(); }, impl_);
  }
  const Buffer<int64_t>& expert_row_token() const {
    return std::visit([](const auto& d) -> const Buffer<int64_t>& { return d.expert_row_token(); }, impl_);
  }
  IndexDispatcher<T>& permutation() {
    return visit([](auto& d) -> IndexDispatcher<T>& { return d.permutation(); });
  }

 private:
  using Impl = std::variant<LocalDispatcher<T>, AllToAllDispatcher<T>, IndexSelectDispatcher<T>>;
  static Impl choose(const Placement& place, int E, int M);
  template <class V>
  decltype(auto) visit(V&& v) {
    return std::visit(std::forward<V>(v), impl_);
  }

  Impl impl_;
};

}  // namespace meshmoe
