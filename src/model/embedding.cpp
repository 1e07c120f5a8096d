#include "model/embedding.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "tensor/blas.hpp"

namespace meshmoe {

template <typename T>
void Embedding<T>::declare(ParamStore<T>& store, const std::string& prefix) {
  store.add(prefix + ".wte", {V_, M_}, InitKind::TruncNormal, M_, &wte);
  store.add(prefix + ".wpe", {Tmax_, M_}, InitKind::TruncNormal, M_, &wpe);
}

// tokens [N] -> x [N, M]
template <typename T>
void Embedding<T>::forward(const StepContext& ctx, const int32_t* tokens, T* x, int N, int T_seq) {
  if (T_seq < 1 || T_seq > Tmax_ || N % T_seq != 0)
    throw Error("Embedding: " + std::to_string(N) + " tokens do not form sequences of length " +
                std::to_string(T_seq) + " (at most " + std::to_string(Tmax_) + ")");
  T_ = T_seq;
  tokens_.assign(tokens, tokens + N);
  for (int n = 0; n < N; ++n) {
    const int32_t tok = tokens[n];
    if (tok < 0 || tok >= V_)
      throw Error("token id " + std::to_string(tok) + " outside the vocabulary [0, " + std::to_string(V_) +
                  "): the data file does not match model.vocab_size");
    const T* e = wte.w + size_t(tok) * M_;
    const T* p = wpe.w + size_t(n % T_) * M_;
    T* o = x + size_t(n) * M_;
    for (int m = 0; m < M_; ++m) o[m] = e[m] + p[m];
  }
}

// dx [N, M] -> wte.g, wpe.g
template <typename T>
void Embedding<T>::backward(const StepContext& ctx, const T* dx, int N) {
  for (int n = 0; n < N; ++n) {
    T* ge = wte.g + size_t(tokens_[n]) * M_;
    T* gp = wpe.g + size_t(n % T_) * M_;
    const T* d = dx + size_t(n) * M_;
    for (int m = 0; m < M_; ++m) {
      ge[m] += d[m];
      gp[m] += d[m];
    }
  }
}

template <typename T>
void OutputHead<T>::declare(ParamStore<T>& store, const std::string& prefix, ParamView<T>* tied) {
  if (tied) {
    W_ = tied;
  } else {
    W_ = &wout;
    store.add(prefix + ".wout", {V_, M_}, InitKind::TruncNormal, M_, &wout);
  }
}

// x [N, M] -> logits [N, V]
template <typename T>
void OutputHead<T>::forward(const StepContext& ctx, const T* x, T* logits, int N) {
  x_.assign(x, x + size_t(N) * M_);
  matmul(false, true, N, V_, M_, x, W_->w, logits);
}

// dlogits [N, V] -> dx [N, M] (+=), W.g [V, M] (+=)
template <typename T>
void OutputHead<T>::backward(const StepContext& ctx, const T* dlogits, T* dx, int N) {
  matmul(false, false, N, M_, V_, dlogits, W_->w, dx, true);
  matmul(true, false, V_, M_, N, dlogits, x_.data(), W_->g, true);
}

template class Embedding<float>;
template class Embedding<double>;
template class OutputHead<float>;
template class OutputHead<double>;

}  // namespace meshmoe
