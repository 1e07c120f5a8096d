// Expert parallelism over the data axis (GShard section 3 / Algorithm 2, Switch section 5.4): the
// token dispatcher (token_dispatcher.hpp) of rank d of the expert group, which owns experts
// [d*E_local, (d+1)*E_local). Its token side is the local dispatcher of all E experts
// (local_dispatcher.hpp); block j of that expert-major buffer (the rows of rank j's experts:
// contiguous) goes to rank j with one all-to-all, the local experts run on what arrived from every
// rank, and a second all-to-all returns the outputs. Both are permutations of rows, so the
// backward of to_experts is from_experts and vice versa (the backward stages call them in the
// mirrored order).
//
//   local buffer  [rows, M]  rows of expert 0, 1, ..., E-1 (this rank's tokens)
//   expert side   [rows', M] rows of local expert 0 from rank 0, 1, ..., P-1, then local expert 1, ...
//
// Only the filled slots move (the compact layout, dispatcher.hpp): the per-expert row counts are
// exchanged first (the host wait point) and the rows move with all_to_allv. The global token index of every row travels with
// the rows (int64), so the receiving rank keys the expert dropout exactly as the unsharded layer.
// The expert-side buffers live only during a pass (the experts keep their own copy of their input;
// combine's output is on the token side), so that the memory held between forward and backward
// stays that of the single-rank layer (GShard section 5.1).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "mesh/comm.hpp"
#include "model/context.hpp"
#include "model/moe/local_dispatcher.hpp"
#include "model/placement.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class AllToAllDispatcher {
 public:
  // Over the expert group of `place` (P = expert_parallel ranks, this one expert_rank(); the whole
  // data axis without replicas); E experts of width M.
  AllToAllDispatcher(const Placement& place, int E, int M);

  // The stages (token_dispatcher.hpp).
  void dispatch(const StepContext& ctx, const Routing<T>& r, const T* x, const AtDispatchWait& at_wait);
  ExpertRows<T> expert_input();
  void release_expert_input();
  void combine(const StepContext& ctx, const Routing<T>& r, const T* shared, T* y);
  void combine_backward(const StepContext& ctx, const Routing<T>& r, const T* dy);
  ExpertGradRows<T> expert_grads();
  T* shared_input_grad(T* dx) { return local_.shared_input_grad(dx); }
  void dispatch_backward(const StepContext& ctx, const Routing<T>& r, T* dx);
  Buffer<T>& gate_grad() { return local_.gate_grad(); }
  bool folds_shared_partial_sums() const { return false; }

  // The plan of the last forward (activation_stash.hpp); recv_ is scratch.
  template <class F>
  void saved_state(F&& f) {
    local_.saved_state(f);
    f(local_rows_);
    f(expert_total_);
    f(recv_rows_);
    f(recv_off_);
    f(expert_off_);
    f(send_rows_d_);
    f(recv_rows_d_);
    f(expert_rows_);
    f(expert_token_);
    f(expert_from_recv_);
    f(recv_from_expert_);
    f(expert_side_elems_);
  }

  // [E_local] rows of each local expert on the expert side (from all ranks).
  const std::vector<int>& expert_rows() const { return expert_rows_; }
  // [expert rows] global token of each expert-side row.
  const Buffer<int64_t>& expert_row_token() const { return expert_token_; }
  IndexDispatcher<T>& permutation() { return local_.permutation(); }

 private:
  // send_rows [E]: rows of each expert in the local buffer; row_token [sum send_rows]: global token
  // of each row. Exchanges the counts and the row tokens.
  void plan(const StepContext& ctx, std::span<const int> send_rows, const int64_t* row_token);
  // Room for `rows` expert-side rows, so that plan() and the exchanges do not reallocate below it.
  void reserve(size_t rows);
  // local [local_rows, M] -> expert [expert_rows_total, M] (overwritten); expert16 (optional): its
  // bf16 copy, written by the same gather
  void to_experts(const StepContext& ctx, const T* local, T* expert, uint16_t* expert16 = nullptr);
  // expert [expert_rows_total, M] -> local [local_rows, M] (overwritten)
  void from_experts(const StepContext& ctx, const T* expert, T* local);
  template <typename U>
  void exchange(const U* send, U* recv, size_t width, bool back);

  LocalDispatcher<T> local_;  // the token side: all E experts

  Comm* comm_;
  int P_, E_, El_, M_;
  size_t local_rows_ = 0, expert_total_ = 0;
  std::vector<int64_t> recv_rows_;   // [P, El] rows from source j for local expert el
  std::vector<size_t> recv_off_;     // [P, El] first row of (j, el) in recv order
  std::vector<size_t> expert_off_;   // [P, El] first row of (j, el) in expert order
  std::vector<size_t> send_rows_d_;  // [P] rows sent to rank j
  std::vector<size_t> recv_rows_d_;  // [P] rows received from rank j
  std::vector<int> expert_rows_;
  Buffer<int64_t> expert_token_;
  // Rows arrive in recv order (source j, local expert el); the experts want expert order (el, j).
  Buffer<int64_t> expert_from_recv_;  // [expert_rows_total] recv-order row of each expert-order row
  Buffer<int64_t> recv_from_expert_;  // [expert_rows_total] the inverse permutation
  Buffer<T> recv_;                    // [expert_rows_total, M] in recv order
  // plan's and exchange's scratch: this rank's counts [E], the row tokens in recv order, the
  // all_to_allv element counts [P]
  std::vector<int64_t> mine_, recv_tok_;  // the host's: counts sent; the rows' tokens in recv order
  std::vector<int64_t> host_table_;       // the host's copy of a permutation table, uploaded
  std::vector<size_t> sc_, rc_;
  // Expert side, alive only during a pass: input and output [rows', M] of the forward, the output
  // gradient [rows', M] of the backward. dxe [rows', M], the input gradient, is backward scratch.
  Buffer<T> xin_, xout_, dexp_, dxe_;
  // xin's bf16 copy [rows', M], written with it where the experts' GEMMs read copies (tensor/blas.hpp
  // bf16_operand_copies), alive as xin
  Buffer<uint16_t> xin16_;
  size_t expert_side_elems_ = 0;  // rows' * M of the last forward (saved)
  size_t room_ = 0, room_per_expert_ = 0;  // expert-side rows of the full layout, as the token side's
};

}  // namespace meshmoe
