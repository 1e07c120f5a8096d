#include "model/moe/experts.hpp"

#include <stdexcept>

#include "core/philox.hpp"
#include "model/activation.hpp"
#include "model/moe/experts_bodies.hpp"
#include "tensor/blas.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

template <typename T>
Experts<T>::Experts(const MoeOptions& opt, const ExpertShape& shape, Comm* tensor)
    : opt_(opt), shape_(shape.E > 0 ? shape : all_experts(opt)), e0_(shape_.e0), e_local_(shape_.E_l),
      h0_(shape_.ffn.h0), H_l_(shape_.ffn.H_l), W_(shape_.ffn.W_l), tensor_(tensor) {
  const FfnShape& f = shape_.ffn;
  if (shape_.E != opt.num_experts || e0_ < 0 || e_local_ < 1 || e0_ + e_local_ > opt.num_experts || f.M != opt.d_model ||
      f.H != opt.d_ff || f.act != opt.activation)
    throw std::logic_error("Experts: expert block out of range or not of this layer");
  if (hidden_split() && !tensor_) throw std::logic_error("Experts: hidden units split without a tensor Comm");
}

template <typename T>
void Experts<T>::declare(ParamStore<T>& store, const std::string& prefix) {
  declare_params(store, expert_params(prefix, shape_), {&w_in, &w_out});
}

template <typename T>
void Experts<T>::forward(const StepContext& ctx, const T* x, T* y, int R, const int64_t* row_token) {
  const std::vector<int> rows(size_t(e_local_), R);
  forward(ctx, x, y, rows, row_token);
}

template <typename T>
void Experts<T>::forward(const StepContext& ctx, const ExpertRows<T>& rows) {
  if (rows.room > 0) reserve(rows.room, rows.room_per_expert);
  forward(ctx, rows.x, rows.y, rows.count, rows.token);
}

template <typename T>
void Experts<T>::reserve(size_t rows, size_t expert_rows) {
  const size_t M = size_t(opt_.d_model), H_l = size_t(H_l_), W = size_t(W_);
  x_.reserve(rows * M);
  pre_.reserve(rows * W);
  h_.reserve(rows * H_l);
  if (opt_.expert_dropout > 0) mask_.reserve(rows * H_l);
  reserve_rows_ = rows;
  reserve_expert_rows_ = expert_rows;
}

// x [rows, M] -> pre [rows, W] -> h [rows, H_l] -> y [rows, M] (all-reduced over tensor when split)
template <typename T>
void Experts<T>::forward(const StepContext& ctx, const T* x, T* y, std::span<const int> rows,
                         const int64_t* row_token) {
  const int M = opt_.d_model, H = opt_.d_ff, H_l = H_l_, W = W_;
  if (rows.size() != size_t(e_local_)) throw std::logic_error("Experts::forward: one row count per local expert");
  start_.assign(size_t(e_local_) + 1, 0);
  for (int el = 0; el < e_local_; ++el) start_[el + 1] = start_[el] + size_t(rows[el]);
  const size_t total = start_.back();
  x_.resize(total * M);
  copy_from(x_.data(), x, total * M);
  pre_.resize(total * W);
  h_.resize(total * H_l);
  const double p = ctx.training ? opt_.expert_dropout : 0.0;
  if (p > 0) mask_.resize(total * H_l);
  else mask_.clear();
  const Rng rng{ctx.seed, ctx.step, opt_.layer_id, RngPurpose::ExpertDropout};
  const T scale = T(1.0 / (1.0 - p));
  for (int el = 0; el < e_local_; ++el) {
    const size_t r0 = start_[el];
    const int R = rows[el];
    if (R == 0) continue;
    matmul(false, false, R, W, M, &x_[r0 * M], w_in.w + size_t(el) * M * W, &pre_[r0 * W]);
    activation_forward(opt_.activation, &pre_[r0 * W], &h_[r0 * H_l], R, H_l);
    if (p > 0)
      for_each_index_2d(R, H_l,
                     ExpertDropoutForward<T>{rng, row_token + r0, &mask_[r0 * H_l], &h_[r0 * H_l], H_l, h0_,
                                             uint64_t(opt_.num_experts), uint64_t(H), uint64_t(e0_ + el), p, scale});
    matmul(false, false, R, M, H_l, &h_[r0 * H_l], w_out.w + size_t(el) * H_l * M, y + r0 * M);
  }
  if (hidden_split() && total > 0) {
    ScopedPhase t(ctx.timers, "moe_allreduce");
    tensor_->all_reduce(y, total * M, Op::Sum);
  }
}

// dy [rows, M] -> dh [R, H_l] -> dpre [R, W] -> dx [rows, M] (added; all-reduced over tensor when split)
template <typename T>
void Experts<T>::backward(const StepContext& ctx, const T* dy, T* dx) {
  const int M = opt_.d_model, H_l = H_l_, W = W_;
  const size_t total = start_.back();
  if (hidden_split()) dxs_.reserve(reserve_rows_ * M);
  dh_.reserve(reserve_expert_rows_ * H_l);
  dpre_.reserve(reserve_expert_rows_ * W);
  T* dxo = dx;  // where dpre W_in^T goes
  if (hidden_split()) {
    dxs_.resize(total * M);
    fill_with(dxs_.data(), total * M, T(0));
    dxo = dxs_.data();
  }
  for (int el = 0; el < e_local_; ++el) {
    const size_t r0 = start_[el];
    const int R = int(start_[el + 1] - r0);
    if (R == 0) continue;
    dh_.resize(size_t(R) * H_l);
    dpre_.resize(size_t(R) * W);
    T *dh = dh_.data(), *dpre = dpre_.data();
    const T* win = w_in.w + size_t(el) * M * W;
    const T* wout = w_out.w + size_t(el) * H_l * M;
    // y = h W_out: dW_out += h^T dy, dh = dy W_out^T
    matmul(true, false, H_l, M, R, &h_[r0 * H_l], dy + r0 * M, w_out.g + size_t(el) * H_l * M, true);
    matmul(false, true, R, H_l, M, dy + r0 * M, wout, dh);
    if (!mask_.empty()) for_each_index(int64_t(R) * H_l, ExpertDropoutBackward<T>{&mask_[r0 * H_l], dh});
    activation_backward(opt_.activation, &pre_[r0 * W], dh, dpre, R, H_l);
    // pre = x W_in: dW_in += x^T dpre, dx += dpre W_in^T
    matmul(true, false, M, W, R, &x_[r0 * M], dpre, w_in.g + size_t(el) * M * W, true);
    matmul(false, true, R, M, W, dpre, win, dxo + r0 * M, true);
  }
  if (hidden_split()) {
    if (total > 0) {
      ScopedPhase t(ctx.timers, "moe_allreduce");
      tensor_->all_reduce(dxs_.data(), total * M, Op::Sum);
    }
    add_into(dx, dxs_.data(), total * M);
  }
}

template class Experts<float>;
template class Experts<double>;

}  // namespace meshmoe
