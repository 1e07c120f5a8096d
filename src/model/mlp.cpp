#include "model/mlp.hpp"

#include <algorithm>
#include <stdexcept>

#include "tensor/blas.hpp"
#include "tensor/elementwise.hpp"

namespace meshmoe {

template <typename T>
static void ensure(Buffer<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

template <typename T>
MLP<T>::MLP(int d_model, int d_ff, Activation act, double dropout, uint32_t layer_id, int hidden_offset,
            int local_hidden)
    : MLP(ffn_shape(d_model, d_ff, act, {hidden_offset, local_hidden < 0 ? d_ff : local_hidden}), dropout, layer_id) {}

template <typename T>
MLP<T>::MLP(const FfnShape& s, double dropout, uint32_t layer_id)
    : M_(s.M), H_(s.H), h0_(s.h0), H_l_(s.H_l), W_(s.W_l), act_(s.act), dropout_(dropout, layer_id) {}

template <typename T>
void MLP<T>::declare(ParamStore<T>& store, const std::string& prefix) {
  declare_params(store, mlp_params(prefix, ffn_shape(M_, H_, act_, {h0_, H_l_})), {&w_in, &w_out});
}

// x [N, M] -> y [N, M]
template <typename T>
void MLP<T>::forward(const StepContext& ctx, const T* x, T* y, int N, const uint16_t* x16) {
  ensure(x_, size_t(N) * M_);
  copy_from(x_.data(), x, size_t(N) * M_);
  ensure(pre_, size_t(N) * W_);
  ensure(h_, size_t(N) * H_l_);
  // pre [N, W] = x [N, M] w_in [M, W]; h [N, H_l] = act(pre); y [N, M] = h w_out [H_l, M]
  matmul(false, false, N, W_, M_, x, w_in.w, pre_.data(), false, x16, w_in.w16);
  uint16_t* h16 = bf16_copy_room<T>(h16_, size_t(N) * H_l_);
  activation_forward(act_, pre_.data(), h_.data(), N, H_l_, 0, 0, h16);
  matmul(false, false, N, M_, H_l_, h_.data(), w_out.w, y, false, h16, w_out.w16);
  if (sharded() && tensor_allreduce) tensor_allreduce(y, size_t(N) * M_);
  dropout_.forward(ctx, y, N, M_);
}

// dy [N, M] -> dx [N, M] (+=)
template <typename T>
void MLP<T>::backward(const StepContext& ctx, const T* dy, T* dx, int N, const uint16_t* x16) {
  ensure(dy_, size_t(N) * M_);
  ensure(dh_, size_t(N) * H_l_);
  ensure(dpre_, size_t(N) * W_);
  copy_from(dy_.data(), dy, size_t(N) * M_);
  dropout_.backward(ctx, dy_.data(), N, M_);
  // dy's copy, then dpre's in the same room: the GEMMs that read dy's are queued before.
  uint16_t* room = bf16_copy_room<T>(bf16_, size_t(N) * std::max(M_, W_));
  // w_out.g [H_l, M] += h^T dy; dh [N, H_l] = dy w_out^T
  const uint16_t* dy16 = rounded_once(dy_.data(), size_t(N) * M_, room);
  const uint16_t* h16 = h16_.empty() ? nullptr : h16_.data();  // the forward's choice (saved state)
  matmul(true, false, H_l_, M_, N, h_.data(), dy_.data(), w_out.g, true, h16, dy16);
  matmul(false, true, N, H_l_, M_, dy_.data(), w_out.w, dh_.data(), false, dy16, w_out.w16);
  activation_backward(act_, pre_.data(), dh_.data(), dpre_.data(), N, H_l_);
  // w_in.g [M, W] += x^T dpre; dx [N, M] += dpre w_in^T
  const uint16_t* dpre16 = rounded_once(dpre_.data(), size_t(N) * W_, room);
  matmul(true, false, M_, W_, N, x_.data(), dpre_.data(), w_in.g, true, x16, dpre16);
  if (sharded() && tensor_allreduce) {
    ensure(dxs_, size_t(N) * M_);
    matmul(false, true, N, M_, W_, dpre_.data(), w_in.w, dxs_.data(), false, dpre16, w_in.w16);
    tensor_allreduce(dxs_.data(), size_t(N) * M_);
    add_into(dx, dxs_.data(), size_t(N) * M_);
  } else {
    matmul(false, true, N, M_, W_, dpre_.data(), w_in.w, dx, true, dpre16, w_in.w16);
  }
}

template class MLP<float>;
template class MLP<double>;

}  // namespace meshmoe
