#include "model/moe/alltoall_dispatcher.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "model/moe/dispatcher_bodies.hpp"
#include "tensor/blas.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

template <typename T>
AllToAllDispatcher<T>::AllToAllDispatcher(const Placement& place, int E, int M)
    : local_(E, M, {}, false),
      comm_(place.expert_group),
      P_(place.expert_parallel),
      E_(E),
      El_(E / P_),
      M_(M) {
  if (P_ < 1 || E % P_ != 0)
    throw std::logic_error("AllToAllDispatcher: " + std::to_string(E) + " experts over " + std::to_string(P_) + " ranks");
  if (P_ > 1 && (!comm_ || comm_->size() != P_ || comm_->rank() != place.expert_rank()))
    throw std::logic_error("AllToAllDispatcher: the expert group's Comm does not match expert_parallel / expert_rank");
}

// x [N, M] -> the token side's rows [rows, M] (all E experts) -> xin [rows', M] (this rank's experts)
template <typename T>
void AllToAllDispatcher<T>::dispatch(const StepContext& ctx, const Routing<T>& r, const T* x,
                                     const AtDispatchWait& at_wait) {
  local_.dispatch(ctx, r, x, at_wait);
  // every source rank sends at most G*C rows per expert (the token side's full layout)
  room_per_expert_ = size_t(P_) * local_.room_per_expert();
  room_ = size_t(El_) * room_per_expert_;
  if (room_ > 0) reserve(room_);
  plan(ctx, local_.expert_rows(), local_.expert_row_token().data());
  xin_.resize(expert_total_ * size_t(M_));
  to_experts(ctx, local_.rows(), xin_.data(), bf16_copy_room<T>(xin16_, xin_.size()));
}

template <typename T>
ExpertRows<T> AllToAllDispatcher<T>::expert_input() {
  expert_side_elems_ = xin_.size();
  xout_.resize(xin_.size());
  return {xin_.data(), xout_.data(), expert_rows_, expert_token_.data(), room_,
          xin16_.empty() ? nullptr : xin16_.data()};
}

// The experts keep their own copy of their input (forward) and are done with their output
// gradient (backward): the expert side's copy goes.
template <typename T>
void AllToAllDispatcher<T>::release_expert_input() {
  Buffer<T>().swap(xin_);
  Buffer<uint16_t>().swap(xin16_);
  Buffer<T>().swap(dexp_);
}

// xout [rows', M] -> the token side's out [rows, M] -> y [N, M]
template <typename T>
void AllToAllDispatcher<T>::combine(const StepContext& ctx, const Routing<T>& r, const T* shared, T* y) {
  from_experts(ctx, xout_.data(), local_.output_rows());
  Buffer<T>().swap(xout_);
  local_.combine(ctx, r, shared, y);
}

// dy [N, M] -> the token side's dout [rows, M] -> dexp [rows', M]
template <typename T>
void AllToAllDispatcher<T>::combine_backward(const StepContext& ctx, const Routing<T>& r, const T* dy) {
  local_.combine_backward(ctx, r, dy);
  dexp_.resize(expert_side_elems_);
  to_experts(ctx, local_.output_grads(), dexp_.data());
}

template <typename T>
ExpertGradRows<T> AllToAllDispatcher<T>::expert_grads() {
  dxe_.reserve(room_ * size_t(M_));
  fill_buffer(dxe_, expert_side_elems_, T(0));
  return {dexp_.data(), dxe_.data()};
}

// dxe [rows', M] -> the token side's dout [rows, M] (free again) -> dx [N, M] (added)
template <typename T>
void AllToAllDispatcher<T>::dispatch_backward(const StepContext& ctx, const Routing<T>& r, T* dx) {
  from_experts(ctx, dxe_.data(), local_.output_grads());
  local_.permutation().dispatch_backward(r, local_.output_grads(), dx, M_);
}

template <typename T>
void AllToAllDispatcher<T>::plan(const StepContext& ctx, std::span<const int> send_rows, const int64_t* row_token) {
  if (send_rows.size() != size_t(E_)) throw std::logic_error("AllToAllDispatcher::plan: one row count per expert");
  local_rows_ = 0;
  for (int r : send_rows) local_rows_ += size_t(r);
  send_rows_d_.assign(P_, 0);
  for (int e = 0; e < E_; ++e) send_rows_d_[e / El_] += size_t(send_rows[e]);

  // Rows arriving from rank j for local expert el.
  recv_rows_.assign(size_t(P_) * El_, 0);
  {
    // THE HOST WAIT POINT of the dispatch: the data exchange cannot be sized before every peer's
    // per-expert counts have arrived.
    mine_.assign(send_rows.begin(), send_rows.end());
    ScopedPhase t(ctx.timers, "moe_alltoall");
    if (P_ > 1) comm_->all_to_all(mine_.data(), recv_rows_.data(), size_t(El_));
    else recv_rows_ = mine_;
  }
  recv_rows_d_.assign(P_, 0);
  recv_off_.assign(size_t(P_) * El_, 0);
  expert_off_.assign(size_t(P_) * El_, 0);
  expert_rows_.assign(El_, 0);
  size_t off = 0;
  for (int j = 0; j < P_; ++j)
    for (int el = 0; el < El_; ++el) {
      recv_off_[size_t(j) * El_ + el] = off;
      off += size_t(recv_rows_[size_t(j) * El_ + el]);
      recv_rows_d_[j] += size_t(recv_rows_[size_t(j) * El_ + el]);
      expert_rows_[el] += int(recv_rows_[size_t(j) * El_ + el]);
    }
  expert_total_ = off;
  off = 0;
  for (int el = 0; el < El_; ++el)
    for (int j = 0; j < P_; ++j) {
      expert_off_[size_t(j) * El_ + el] = off;
      off += size_t(recv_rows_[size_t(j) * El_ + el]);
    }
  // The permutation tables, built on the host and uploaded (transfer points).
  host_table_.resize(expert_total_);
  for (size_t b = 0; b < recv_rows_.size(); ++b)
    for (int64_t q = 0; q < recv_rows_[b]; ++q) host_table_[expert_off_[b] + size_t(q)] = int64_t(recv_off_[b]) + q;
  upload(expert_from_recv_, host_table_.data(), expert_total_);
  // The global token of every row travels with it (keys the expert dropout on the receiving rank).
  recv_tok_.resize(expert_total_);
  exchange(row_token, recv_tok_.data(), 1, false);
  std::vector<int64_t> token(expert_total_);
  for (size_t row = 0; row < expert_total_; ++row) token[row] = recv_tok_[size_t(host_table_[row])];
  upload(expert_token_, token.data(), expert_total_);
  for (size_t b = 0; b < recv_rows_.size(); ++b)
    for (int64_t q = 0; q < recv_rows_[b]; ++q) host_table_[recv_off_[b] + size_t(q)] = int64_t(expert_off_[b]) + q;
  upload(recv_from_expert_, host_table_.data(), expert_total_);
}

template <typename T>
void AllToAllDispatcher<T>::reserve(size_t rows) {
  recv_.reserve(rows * size_t(M_));
  expert_token_.reserve(rows);
  expert_from_recv_.reserve(rows);
  recv_from_expert_.reserve(rows);
  recv_tok_.reserve(rows);
}

// One all-to-all of rows of `width` elements: forward (local -> recv order) or back.
template <typename T>
template <typename U>
void AllToAllDispatcher<T>::exchange(const U* send, U* recv, size_t width, bool back) {
  const std::vector<size_t>& s = back ? recv_rows_d_ : send_rows_d_;
  const std::vector<size_t>& r = back ? send_rows_d_ : recv_rows_d_;
  if (P_ == 1) {
    if constexpr (std::is_same_v<U, T>) {
      copy_from(recv, send, s[0] * width);
    } else if (device_memory(send)) {
      copy_to_host(recv, send, s[0] * width * sizeof(U));  // the row tokens, to the host (a transfer point)
    } else {
      std::copy(send, send + s[0] * width, recv);
    }
    return;
  }
  sc_.resize(P_);
  rc_.resize(P_);
  for (int j = 0; j < P_; ++j) {
    sc_[j] = s[j] * width;
    rc_[j] = r[j] * width;
  }
  comm_->all_to_allv(send, std::span<const size_t>(sc_), recv, std::span<const size_t>(rc_));
}

// local [local_rows, M] -> recv [P, El, rows, M] -> expert [El, P, rows, M] (+ its bf16 copy)
template <typename T>
void AllToAllDispatcher<T>::to_experts(const StepContext& ctx, const T* local, T* expert, uint16_t* expert16) {
  recv_.resize(expert_total_ * M_);
  {
    ScopedPhase t(ctx.timers, "moe_alltoall");
    exchange(local, recv_.data(), size_t(M_), false);
  }
  for_each_index_2d(expert_total_, M_,
                 GatherRows<T, int64_t>{recv_.data(), expert_from_recv_.data(), expert, M_, expert16});
}

// expert [El, P, rows, M] -> recv order [P, El, rows, M] -> local [local_rows, M]
template <typename T>
void AllToAllDispatcher<T>::from_experts(const StepContext& ctx, const T* expert, T* local) {
  recv_.resize(expert_total_ * M_);
  for_each_index_2d(expert_total_, M_,
                 GatherRows<T, int64_t>{expert, recv_from_expert_.data(), recv_.data(), M_});
  ScopedPhase t(ctx.timers, "moe_alltoall");
  exchange(recv_.data(), local, size_t(M_), true);
}

template class AllToAllDispatcher<float>;
template class AllToAllDispatcher<double>;

}  // namespace meshmoe
