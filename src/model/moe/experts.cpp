#include "model/moe/experts.hpp"

#include "core/philox.hpp"
#include "model/activation.hpp"
#include "tensor/blas.hpp"

namespace meshmoe {

template <typename T>
void Experts<T>::declare(ParamStore<T>& store, const std::string& prefix) {
  const int64_t E = opt_.num_experts, El = e_local_, M = opt_.d_model, H = opt_.d_ff;
  const int64_t Hin = activation_in_width(opt_.activation, opt_.d_ff);
  store.add_block(prefix + ".w_in", {E, M, Hin}, {El, M, Hin}, {e0_, 0, 0}, InitKind::TruncNormal, double(M), &w_in);
  store.add_block(prefix + ".w_out", {E, H, M}, {El, H, M}, {e0_, 0, 0}, InitKind::TruncNormal, double(H), &w_out);
}

// x [E_local, R, M] -> pre [E_local, R, H'] -> h [E_local, R, H] -> y [E_local, R, M]
template <typename T>
void Experts<T>::forward(const StepContext& ctx, const T* x, T* y, int R, const int64_t* row_token) {
  const int M = opt_.d_model, H = opt_.d_ff, Hin = activation_in_width(opt_.activation, H);
  const size_t rows = size_t(e_local_) * R;
  x_.assign(x, x + rows * M);
  pre_.resize(rows * Hin);
  h_.resize(rows * H);
  const double p = ctx.training ? opt_.expert_dropout : 0.0;
  if (p > 0) mask_.resize(rows * H);
  else mask_.clear();
  const Rng rng{ctx.seed, ctx.step, opt_.layer_id, RngPurpose::ExpertDropout};
  const T scale = T(1.0 / (1.0 - p));
  for (int el = 0; el < e_local_; ++el) {
    const size_t r0 = size_t(el) * R;
    matmul(false, false, R, Hin, M, &x_[r0 * M], w_in.w + size_t(el) * M * Hin, &pre_[r0 * Hin]);
    activation_forward(opt_.activation, &pre_[r0 * Hin], &h_[r0 * H], R, H);
    if (p > 0) {
      // Keyed by (global token, global expert, hidden unit): a token in two experts draws twice.
      const uint64_t e = uint64_t(e0_ + el);
      for (int row = 0; row < R; ++row) {
        T* m = &mask_[(r0 + row) * H];
        T* h = &h_[(r0 + row) * H];
        const int64_t tok = row_token[r0 + row];
        for (int j = 0; j < H; ++j) {
          const uint64_t index = (uint64_t(tok < 0 ? 0 : tok) * uint64_t(opt_.num_experts) + e) * uint64_t(H) + j;
          m[j] = tok >= 0 && rng.uniform_double(index) < p ? T(0) : scale;
          h[j] *= m[j];
        }
      }
    }
    matmul(false, false, R, M, H, &h_[r0 * H], w_out.w + size_t(el) * H * M, y + r0 * M);
  }
}

// dy [E_local, R, M] -> dh [R, H] -> dpre [R, H'] -> dx [E_local, R, M] (added)
template <typename T>
void Experts<T>::backward(const StepContext& ctx, const T* dy, T* dx, int R) {
  const int M = opt_.d_model, H = opt_.d_ff, Hin = activation_in_width(opt_.activation, H);
  std::vector<T> dh(size_t(R) * H), dpre(size_t(R) * Hin);
  for (int el = 0; el < e_local_; ++el) {
    const size_t r0 = size_t(el) * R;
    const T* win = w_in.w + size_t(el) * M * Hin;
    const T* wout = w_out.w + size_t(el) * H * M;
    // y = h W_out: dW_out += h^T dy, dh = dy W_out^T
    matmul(true, false, H, M, R, &h_[r0 * H], dy + r0 * M, w_out.g + size_t(el) * H * M, true);
    matmul(false, true, R, H, M, dy + r0 * M, wout, dh.data());
    if (!mask_.empty())
      for (size_t i = 0; i < dh.size(); ++i) dh[i] *= mask_[r0 * H + i];
    activation_backward(opt_.activation, &pre_[r0 * Hin], dh.data(), dpre.data(), R, H);
    // pre = x W_in: dW_in += x^T dpre, dx += dpre W_in^T
    matmul(true, false, M, Hin, R, &x_[r0 * M], dpre.data(), w_in.g + size_t(el) * M * Hin, true);
    matmul(false, true, R, M, Hin, dpre.data(), win, dx + r0 * M, true);
  }
}

template class Experts<float>;
template class Experts<double>;

}  // namespace meshmoe
