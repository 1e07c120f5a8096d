#include "model/moe/experts.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/philox.hpp"
#include "model/activation.hpp"
#include "model/moe/experts_bodies.hpp"
#include "tensor/blas.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

namespace {
// p + n, or null where p is (an operand without a bf16 copy).
template <typename U>
U* offset(U* p, size_t n) {
  return p ? p + n : nullptr;
}
}  // namespace

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
  if (rows.room > 0) reserve(rows.room);
  forward(ctx, rows.x, rows.y, rows.count, rows.token, rows.x16);
}

template <typename T>
void Experts<T>::reserve(size_t rows) {
  const size_t M = size_t(opt_.d_model), H_l = size_t(H_l_), W = size_t(W_);
  x_.reserve(rows * M);
  pre_.reserve(rows * W);
  h_.reserve(rows * H_l);
  if (opt_.expert_dropout > 0) mask_.reserve(rows * H_l);
  if (bf16_operand_copies<T>()) {
    x16_.reserve(rows * M);
    h16_.reserve(rows * H_l);
  }
  reserve_rows_ = rows;
}

// x [rows, M] -> pre [rows, W] -> h [rows, H_l] -> y [rows, M] (all-reduced over tensor when split).
// Each GEMM role is one grouped call over the local experts (gemm_grouped), the activation one
// launch over all rows; expert dropout, keyed by the expert, a launch per expert. Where the GEMMs
// read bf16 copies, every operand has one and no GEMM rounds (docs/ARCHITECTURE.md "Precision"):
// x's from the dispatcher's gather, h's from the kernel that writes h, the weights' from the store.
template <typename T>
void Experts<T>::forward(const StepContext& ctx, const T* x, T* y, std::span<const int> rows,
                         const int64_t* row_token, const uint16_t* x16) {
  const int M = opt_.d_model, H = opt_.d_ff, H_l = H_l_, W = W_;
  if (rows.size() != size_t(e_local_)) throw std::logic_error("Experts::forward: one row count per local expert");
  start_.assign(size_t(e_local_) + 1, 0);
  for (int el = 0; el < e_local_; ++el) start_[el + 1] = start_[el] + size_t(rows[el]);
  const size_t total = start_.back();
  x_.resize(total * M);
  uint16_t* kept16 = bf16_copy_room<T>(x16_, total * M);
  if (total > 0) for_each_index(int64_t(total * M), KeepExpertInput<T>{x, x16, x_.data(), kept16});
  const uint16_t* up16 = x16 ? x16 : kept16;
  pre_.resize(total * W);
  h_.resize(total * H_l);
  uint16_t* h16 = bf16_copy_room<T>(h16_, total * H_l);
  const double p = ctx.training ? opt_.expert_dropout : 0.0;
  if (p > 0) mask_.resize(total * H_l);
  else mask_.clear();
  std::vector<GemmGroup<T>> up, down;
  for (int el = 0; el < e_local_; ++el) {
    const size_t r0 = start_[el], w_in0 = size_t(el) * M * W, w_out0 = size_t(el) * H_l * M;
    const int R = rows[el];
    up.push_back({R, W, M, x_.data() + r0 * M, M, w_in.w + w_in0, W, pre_.data() + r0 * W, W, offset(up16, r0 * M),
                  offset(w_in.w16, w_in0)});
    down.push_back({R, M, H_l, h_.data() + r0 * H_l, H_l, w_out.w + w_out0, M, y + r0 * M, M, offset(h16, r0 * H_l),
                    offset(w_out.w16, w_out0)});
  }
  gemm_grouped<T>(false, false, T(1), T(0), up);
  // h's copy: the activation's kernel writes it, or with dropout the scale's after it
  if (total > 0) activation_forward(opt_.activation, pre_.data(), h_.data(), int(total), H_l, 0, 0, p > 0 ? nullptr : h16);
  const Rng rng{ctx.seed, ctx.step, opt_.layer_id, RngPurpose::ExpertDropout};
  const T scale = T(1.0 / (1.0 - p));
  if (p > 0)
    for (int el = 0; el < e_local_; ++el) {
      const size_t r0 = start_[el];
      if (rows[el] > 0)
        for_each_index_2d(rows[el], H_l,
                          ExpertDropoutForward<T>{rng, row_token + r0, &mask_[r0 * H_l], &h_[r0 * H_l], H_l, h0_,
                                                  uint64_t(opt_.num_experts), uint64_t(H), uint64_t(e0_ + el), p,
                                                  scale, offset(h16, r0 * H_l)});
    }
  gemm_grouped<T>(false, false, T(1), T(0), down);
  if (hidden_split() && total > 0) {
    ScopedPhase t(ctx.timers, "moe_allreduce");
    tensor_->all_reduce(y, total * M, Op::Sum);
  }
}

// dy [rows, M] -> dh [rows, H_l] -> dpre [rows, W] -> dx [rows, M] (added; all-reduced over tensor
// when split): a grouped call per GEMM role, as forward. dh overwrites h, which nothing reads after
// dW_out: the grouped calls need every expert's rows at once, and this keeps their scratch to dpre.
// With bf16 copies: x's and h's of the forward, the weights', and dy's then dpre's, each rounded
// once for its two GEMMs (a weight gradient and an input gradient) into one room, as the dense
// feed-forward's (model/mlp.cpp).
template <typename T>
void Experts<T>::backward(const StepContext& ctx, const T* dy, T* dx) {
  const int M = opt_.d_model, H_l = H_l_, W = W_;
  const size_t total = start_.back();
  if (hidden_split()) dxs_.reserve(reserve_rows_ * M);
  dpre_.reserve(reserve_rows_ * W);
  if (bf16_operand_copies<T>()) bf16_.reserve(reserve_rows_ * size_t(std::max(M, W)));
  T* dxo = dx;  // where dpre W_in^T goes
  if (hidden_split()) {
    dxs_.resize(total * M);
    fill_with(dxs_.data(), total * M, T(0));
    dxo = dxs_.data();
  }
  dpre_.resize(total * W);
  T *dh = h_.data(), *dpre = dpre_.data();
  // dy's copy, then dpre's in the same room: the GEMMs that read dy's are queued before.
  uint16_t* room = bf16_copy_room<T>(bf16_, total * size_t(std::max(M, W)));
  const uint16_t* dy16 = total > 0 ? rounded_once(dy, total * M, room) : nullptr;
  const uint16_t *x16 = x16_.empty() ? nullptr : x16_.data(), *h16 = h16_.empty() ? nullptr : h16_.data();
  std::vector<GemmGroup<T>> dw_out, dh_rows, dw_in, dx_rows;
  for (int el = 0; el < e_local_; ++el) {
    const size_t r0 = start_[el], w_in0 = size_t(el) * M * W, w_out0 = size_t(el) * H_l * M;
    const int R = int(start_[el + 1] - r0);
    if (R == 0) continue;  // no rows: nothing added to the weight gradients either
    // y = h W_out: dW_out += h^T dy, dh = dy W_out^T
    dw_out.push_back({H_l, M, R, h_.data() + r0 * H_l, H_l, dy + r0 * M, M, w_out.g + w_out0, M, offset(h16, r0 * H_l),
                      offset(dy16, r0 * M)});
    dh_rows.push_back({R, H_l, M, dy + r0 * M, M, w_out.w + w_out0, M, dh + r0 * H_l, H_l, offset(dy16, r0 * M),
                       offset(w_out.w16, w_out0)});
    // pre = x W_in: dW_in += x^T dpre, dx += dpre W_in^T (the copy of dpre, rounded below, at the same rows)
    dw_in.push_back({M, W, R, x_.data() + r0 * M, M, dpre + r0 * W, W, w_in.g + w_in0, W, offset(x16, r0 * M),
                     offset<const uint16_t>(room, r0 * W)});
    dx_rows.push_back({R, M, W, dpre + r0 * W, W, w_in.w + w_in0, W, dxo + r0 * M, M,
                       offset<const uint16_t>(room, r0 * W), offset(w_in.w16, w_in0)});
  }
  gemm_grouped<T>(true, false, T(1), T(1), dw_out);
  gemm_grouped<T>(false, true, T(1), T(0), dh_rows);
  if (total > 0) {
    if (!mask_.empty()) for_each_index(int64_t(total) * H_l, ExpertDropoutBackward<T>{mask_.data(), dh});
    activation_backward(opt_.activation, pre_.data(), dh, dpre, int(total), H_l);
    rounded_once(dpre, total * W, room);
  }
  gemm_grouped<T>(true, false, T(1), T(1), dw_in);
  gemm_grouped<T>(false, true, T(1), T(1), dx_rows);
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
