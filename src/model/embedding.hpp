// Token + learned position embedding (or the token embedding alone with model.position = rope: the
// positions then rotate the attention's queries and keys, rope.hpp), and the output projection
// (tied to the token embedding or its own matrix).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/context.hpp"
#include "model/params.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class Embedding {
 public:
  // vocab V, max_seq_len T (rows of wpe), width M; learned_positions false: no wpe.
  Embedding(int vocab, int max_seq_len, int d_model, bool learned_positions = true)
      : V_(vocab), Tmax_(max_seq_len), M_(d_model), learned_positions_(learned_positions) {}

  // prefix.wte [V, M], prefix.wpe [T, M] (learned positions); truncated normal with fan_in M.
  void declare(ParamStore<T>& store, const std::string& prefix);

  // tokens [N] (B sequences of T tokens, contiguous) -> x [N, M] = wte[token] + wpe[position], the
  // position within the token's packed example (ctx.position; n % T when null). The tokens and
  // ctx.position are host memory (the micro-batch): the host checks them and groups them for backward.
  void forward(const StepContext& ctx, const int32_t* tokens, T* x, int N, int T_seq);
  // dx [N, M] -> adds into wte.g and wpe.g (the grouping of the tokens saved by forward)
  void backward(const StepContext& ctx, const T* dx, int N);

  // What backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(seq_len_);
    for (RowGrouping* g : {&by_token_, &by_position_}) {
      f(g->rows);
      f(g->start);
      f(g->order);
    }
  }

  ParamView<T> wte, wpe;
  bool learned_positions() const { return learned_positions_; }

 private:
  int V_, Tmax_, M_;
  bool learned_positions_ = true;
  int seq_len_ = 0;
  Buffer<int32_t> tokens_, positions_;  // [N]
  std::vector<int32_t> host_positions_;  // [N]: the host's copy, for the grouping
  // backward's grouping of the tokens n by the table row they read, built by forward (a stable counting sort): the
  // distinct rows in use (ascending) [U], where each one's tokens start in `order` [U + 1], the
  // tokens n [N]; `first` [rows + 1] is scratch
  struct RowGrouping {
    Buffer<int32_t> rows, start, order;
    std::vector<int32_t> first, host_rows, host_start, host_order;  // the host's, built first
    void build(const int32_t* row_of, int N, int table_rows);
  };
  RowGrouping by_token_, by_position_;
};

// logits [N, V] = x W^T, W [V, M] = the token embedding (tied) or prefix.wout (untied).
template <typename T>
class OutputHead {
 public:
  OutputHead(int vocab, int d_model) : V_(vocab), M_(d_model) {}

  // Untied: registers prefix.wout [V, M] (fan_in M). Tied: pass the embedding's wte view; its
  // gradient then receives both contributions.
  void declare(ParamStore<T>& store, const std::string& prefix, ParamView<T>* tied = nullptr);

  // x [N, M] -> logits [N, V]. x16 (optional): x's bf16 copy (bf16_bits) written by its producer
  // (the final LayerNorm: LayerNorm::output16), which the bf16 GEMMs read instead of rounding x.
  void forward(const StepContext& ctx, const T* x, T* logits, int N, const uint16_t* x16 = nullptr);
  // dlogits [N, V] -> adds into W.g and dx [N, M]; x16: the forward's
  void backward(const StepContext& ctx, const T* dlogits, T* dx, int N, const uint16_t* x16 = nullptr);

  // What backward reads of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(x_);
  }

  ParamView<T> wout;  // used when untied
  // Tests only: whether the projection reads the token embedding's weights.
  bool tied() const { return W_ != &wout; }

 private:
  int V_, M_;
  ParamView<T>* W_ = &wout;
  Buffer<T> x_;  // [N, M]
};

}  // namespace meshmoe
