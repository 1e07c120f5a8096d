// Expert parallelism over the data axis (GShard section 3 / Algorithm 2, Switch section 5.4):
// rank d of the expert group owns experts [d*E_local, (d+1)*E_local). After the local dispatch into the
// expert-major buffer, block j of it (the rows of rank j's experts: contiguous) goes to rank j
// with one all-to-all; the local experts run on what arrived from every rank; a second all-to-all
// returns the outputs. Both are permutations of rows, so the backward of to_experts is
// from_experts and vice versa (MoeLayer::backward calls them in the mirrored order).
//
//   local buffer  [rows, M]  rows of expert 0, 1, ..., E-1 (this rank's tokens)
//   expert side   [rows', M] rows of local expert 0 from rank 0, 1, ..., P-1, then local expert 1, ...
//
// Only the filled slots move (the compact layout, dispatcher.hpp): the per-expert row counts are
// exchanged first (the host wait point) and the rows move with all_to_allv. The global token index of every row travels with
// the rows (int64), so the receiving rank keys the expert dropout exactly as the unsharded layer.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "mesh/comm.hpp"
#include "model/context.hpp"
#include "model/placement.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class AllToAllDispatcher {
 public:
  // Over the expert group of `place` (P = expert_parallel ranks, this one expert_rank(); the whole
  // data axis without replicas); E experts of width M.
  AllToAllDispatcher(const Placement& place, int E, int M);

  // send_rows [E]: rows of each expert in the local buffer; row_token [sum send_rows]: global token
  // of each row. Exchanges the counts and the row tokens.
  void plan(const StepContext& ctx, std::span<const int> send_rows, const int64_t* row_token);
  // Room for `rows` expert-side rows, so that plan() and the exchanges do not reallocate below it.
  void reserve(size_t rows);

  // local [local_rows, M] -> expert [expert_rows_total, M] (overwritten)
  void to_experts(const StepContext& ctx, const T* local, T* expert);
  // expert [expert_rows_total, M] -> local [local_rows, M] (overwritten)
  void from_experts(const StepContext& ctx, const T* expert, T* local);

  // The plan of the last forward (activation_stash.hpp); recv_ is scratch.
  template <class F>
  void saved_state(F&& f) {
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
  }

  size_t local_rows() const { return local_rows_; }
  size_t expert_rows_total() const { return expert_total_; }
  // [E_local] rows of each local expert on the expert side (from all ranks).
  const std::vector<int>& expert_rows() const { return expert_rows_; }
  // [expert_rows_total] global token of each expert-side row.
  const Buffer<int64_t>& expert_row_token() const { return expert_token_; }
  int e0() const { return e0_; }
  int e_local() const { return El_; }

 private:
  template <typename U>
  void exchange(const U* send, U* recv, size_t width, bool back);

  Comm* comm_;
  int P_, E_, El_, e0_, M_;
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
};

}  // namespace meshmoe
