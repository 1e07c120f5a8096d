#include "model/embedding.hpp"

#include <string>

#include "core/error.hpp"
#include "model/embedding_bodies.hpp"
#include "model/layer_shapes.hpp"
#include "tensor/blas.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

template <typename T>
void Embedding<T>::declare(ParamStore<T>& store, const std::string& prefix) {
  declare_params(store, embedding_params(prefix, V_, Tmax_, M_), {&wte, &wpe});
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
    const int32_t tok = tokens_[n];
    if (tok < 0 || tok >= V_)
      throw Error("token id " + std::to_string(tok) + " outside the vocabulary [0, " + std::to_string(V_) +
                  "): the data file does not match model.vocab_size");
  }
  for_each_index_2d(N, M_, EmbeddingForwardElement<T>{wte.w, wpe.w, tokens_.data(), x, M_, T_});
}

// dx [N, M] -> wte.g, wpe.g
template <typename T>
void Embedding<T>::backward(const StepContext& ctx, const T* dx, int N) {
  // Group the positions by token (a stable counting sort, so ascending n within a token), so that
  // one body owns each used row of wte.g: no two positions of one token add into it concurrently.
  token_first_.assign(size_t(V_) + 1, 0);
  for (int n = 0; n < N; ++n) ++token_first_[size_t(tokens_[n]) + 1];
  row_tokens_.clear();
  row_start_.assign(1, 0);
  for (int v = 0; v < V_; ++v) {
    if (token_first_[size_t(v) + 1] > 0) {
      row_tokens_.push_back(v);
      row_start_.push_back(row_start_.back() + token_first_[size_t(v) + 1]);
    }
    token_first_[size_t(v) + 1] += token_first_[v];  // now the first slot of token v + 1
  }
  token_order_.resize(N);
  for (int n = 0; n < N; ++n) token_order_[size_t(token_first_[tokens_[n]]++)] = n;
  for_each_index_2d(row_tokens_.size(), M_,
                 EmbeddingTokenGradElement<T>{dx, row_tokens_.data(), row_start_.data(), token_order_.data(),
                                              wte.g, M_});
  for_each_index_2d(T_, M_, EmbeddingPositionGradElement<T>{dx, wpe.g, M_, T_, N});
}

template <typename T>
void OutputHead<T>::declare(ParamStore<T>& store, const std::string& prefix, ParamView<T>* tied) {
  if (tied) {
    W_ = tied;
  } else {
    W_ = &wout;
    declare_params(store, head_params(prefix, V_, M_), {&wout});
  }
}

// x [N, M] -> logits [N, V]
template <typename T>
void OutputHead<T>::forward(const StepContext& ctx, const T* x, T* logits, int N) {
  if (x_.size() < size_t(N) * M_) x_.resize(size_t(N) * M_);
  copy_from(x_.data(), x, size_t(N) * M_);
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
