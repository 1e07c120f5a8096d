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
  if (learned_positions_)
    declare_params(store, embedding_params(prefix, V_, Tmax_, M_), {&wte, &wpe});
  else
    declare_params(store, embedding_params(prefix, V_, Tmax_, M_, false), {&wte});
}

// tokens [N] -> x [N, M]
template <typename T>
void Embedding<T>::forward(const StepContext& ctx, const int32_t* tokens, T* x, int N, int T_seq) {
  if (T_seq < 1 || T_seq > Tmax_ || N % T_seq != 0)
    throw Error("Embedding: " + std::to_string(N) + " tokens do not form sequences of length " +
                std::to_string(T_seq) + " (at most " + std::to_string(Tmax_) + ")");
  seq_len_ = T_seq;
  // A transfer point: the host checks the tokens and positions and uploads them and backward's
  // grouping of them.
  for (int n = 0; n < N; ++n)
    if (tokens[n] < 0 || tokens[n] >= V_)
      throw Error("token id " + std::to_string(tokens[n]) + " outside the vocabulary [0, " + std::to_string(V_) +
                  "): the data file does not match model.vocab_size");
  host_positions_.resize(size_t(N));
  for (int n = 0; n < N; ++n) {
    host_positions_[size_t(n)] = ctx.position ? ctx.position[n] : n % seq_len_;
    if (host_positions_[size_t(n)] < 0 || host_positions_[size_t(n)] >= seq_len_)
      throw Error("Embedding: position " + std::to_string(host_positions_[size_t(n)]) + " of token " +
                  std::to_string(n) + " outside its sequence [0, " + std::to_string(seq_len_) + ")");
  }
  upload(tokens_, tokens, size_t(N));
  upload(positions_, host_positions_.data(), size_t(N));
  by_token_.build(tokens, N, V_);
  if (learned_positions_) by_position_.build(host_positions_.data(), N, Tmax_);
  for_each_index_2d(N, M_,
                    EmbeddingForwardElement<T>{.wte = wte.w,
                                               .wpe = learned_positions_ ? wpe.w : nullptr,
                                               .tokens = tokens_.data(),
                                               .position = positions_.data(),
                                               .x = x,
                                               .M = M_});
}

template <typename T>
void Embedding<T>::RowGrouping::build(const int32_t* row_of, int N, int table_rows) {
  first.assign(size_t(table_rows) + 1, 0);
  for (int n = 0; n < N; ++n) ++first[size_t(row_of[n]) + 1];
  host_rows.clear();
  host_start.assign(1, 0);
  for (int v = 0; v < table_rows; ++v) {
    if (first[size_t(v) + 1] > 0) {
      host_rows.push_back(v);
      host_start.push_back(host_start.back() + first[size_t(v) + 1]);
    }
    first[size_t(v) + 1] += first[v];  // now the first slot of row v + 1
  }
  host_order.assign(size_t(N), 0);
  for (int n = 0; n < N; ++n) host_order[size_t(first[row_of[n]]++)] = n;
  upload(rows, host_rows.data(), host_rows.size());
  upload(start, host_start.data(), host_start.size());
  upload(order, host_order.data(), host_order.size());
}

// dx [N, M] -> wte.g, wpe.g
template <typename T>
void Embedding<T>::backward(const StepContext& ctx, const T* dx, int N) {
  // The tokens grouped by the row they read (forward built the grouping), so that one body owns
  // each used row of a gradient table: no two tokens of one row add into it concurrently.
  for (RowGrouping* g : {&by_token_, &by_position_}) {
    if (g == &by_position_ && !learned_positions_) continue;
    for_each_index_2d(g->rows.size(), M_,
                      EmbeddingRowGradElement<T>{.dx = dx,
                                                 .rows = g->rows.data(),
                                                 .start = g->start.data(),
                                                 .order = g->order.data(),
                                                 .g_table = g == &by_token_ ? wte.g : wpe.g,
                                                 .M = M_});
  }
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
void OutputHead<T>::forward(const StepContext& ctx, const T* x, T* logits, int N, const uint16_t* x16) {
  if (x_.size() < size_t(N) * M_) x_.resize(size_t(N) * M_);
  copy_from(x_.data(), x, size_t(N) * M_);
  matmul(false, true, N, V_, M_, x, W_->w, logits, false, x16, W_->w16);
}

// dlogits [N, V] -> dx [N, M] (+=), W.g [V, M] (+=)
template <typename T>
void OutputHead<T>::backward(const StepContext& ctx, const T* dlogits, T* dx, int N, const uint16_t* x16) {
  matmul(false, false, N, M_, V_, dlogits, W_->w, dx, true, nullptr, W_->w16);
  matmul(true, false, V_, M_, N, dlogits, x_.data(), W_->g, true, nullptr, x16);
}

template class Embedding<float>;
template class Embedding<double>;
template class OutputHead<float>;
template class OutputHead<double>;

}  // namespace meshmoe
