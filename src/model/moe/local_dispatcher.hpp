// The token dispatcher of experts that are all on this rank (token_dispatcher.hpp): the routing's
// index permutation (IndexDispatcher, dispatcher.hpp) between token order [N, M] and the
// expert-major rows of the experts held here, and the buffers of those rows. It never communicates.
//
// It is the whole dispatcher on one rank, or when the experts are not split over their axis, and
// the token side of the two that communicate (composition, not a copy of this code):
// AllToAllDispatcher moves its rows to the experts' ranks and back, IndexSelectDispatcher holds only
// this rank's experts (a layout of some of the E) and sums the partial results over tensor.
//
//   forward   x [N, M] -> rows [rows, M] -> (experts) -> out [rows, M] -> y [N, M]
//   backward  dy [N, M] -> dout [rows, M], dgate [N k] -> (experts) -> dxe [rows, M] -> dx [N, M]
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/context.hpp"
#include "model/moe/dispatcher.hpp"
#include "model/moe/experts.hpp"
#include "model/moe/router.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

// What the layer does at its dispatch's one host wait (the router's totals, read with the row counts).
using AtDispatchWait = std::function<void()>;

template <typename T>
class LocalDispatcher {
 public:
  // E experts of width M; this rank holds those of `held` (all of them by default). feeds_experts:
  // the rows are the experts' input (false: the token side of the all-to-all, whose rows travel
  // first), so the gather writes their bf16 copy where the experts' GEMMs read copies.
  LocalDispatcher(int E, int M, DispatchLayout held = {}, bool feeds_experts = true);

  // The stages (token_dispatcher.hpp says what each does).
  void dispatch(const StepContext& ctx, const Routing<T>& r, const T* x, const AtDispatchWait& at_wait);
  ExpertRows<T> expert_input();
  void release_expert_input() {}
  void combine(const StepContext& ctx, const Routing<T>& r, const T* shared, T* y);
  void combine_backward(const StepContext& ctx, const Routing<T>& r, const T* dy);
  ExpertGradRows<T> expert_grads();
  T* shared_input_grad(T* dx) { return dx; }
  void dispatch_backward(const StepContext& ctx, const Routing<T>& r, T* dx);
  Buffer<T>& gate_grad() { return dgate_; }
  bool folds_shared_partial_sums() const { return false; }

  template <class F>
  void saved_state(F&& f) {
    index_.saved_state(f);
    f(rows_);
    f(out_);
  }

  const std::vector<int>& expert_rows() const { return index_.expert_rows(); }
  const Buffer<int64_t>& expert_row_token() const { return index_.slot_token_global(); }
  IndexDispatcher<T>& permutation() { return index_; }

  // The token side, for the dispatchers built on this one.
  const T* rows() const { return rows_.data(); }  // [rows, M] after dispatch
  T* output_rows();                               // [rows, M] the experts' outputs, sized as the rows
  T* output_grads() { return dout_.data(); }      // [rows, M] their gradient, after combine_backward
  // Rows of one held expert in the full layout [E_held, G, C], 0 until a capacity-routed dispatch.
  size_t room_per_expert() const { return room_per_expert_; }

 private:
  void reserve_full_layout(const Routing<T>& r);

  int M_;
  DispatchLayout held_;
  int E_held_;
  IndexDispatcher<T> index_;
  bool feeds_experts_;
  // Saved by the forward for the backward (with the plan): the rows (the backward reads their
  // count) and the experts' outputs (the gate gradient reads them).
  Buffer<T> rows_, out_;
  // The rows' bf16 copy [rows, M], written by the gather with them (feeds_experts and
  // tensor/blas.hpp bf16_operand_copies; empty otherwise); the experts keep their own copy.
  Buffer<uint16_t> rows16_;
  // Backward scratch, not saved state: overwritten by every backward, members so that a step does
  // not allocate them. dout [rows, M], dgate [N k], dxe [rows, M].
  Buffer<T> dout_, dgate_, dxe_;
  size_t room_ = 0, room_per_expert_ = 0;
};

}  // namespace meshmoe
