// Incremental self-attention for decoding: the keys and values of the tokens already seen, kept per
// flat sequence ("stream"), so that a decoding step computes q, k, v of its new tokens only and
// attends over the cache (docs/ARCHITECTURE.md "Decoding").
//
// A stream holds the tokens appended to it in order: a prompt, then what is decoded after it. For
// flat beam search (GShard appendix A.1) a stream holds every hypothesis of one source interleaved,
// and each new token names the keys of its stream it may see (its hypothesis' prompt and
// ancestors): pruning hypotheses reorders those 0/1 masks, never the cached keys and values.
//
// Uses CausalSelfAttention's weights (wq, wk, wv, wo) as they are: with heads split over tensor
// (Megatron) the cache holds this rank's heads [N_cached, KV_l] and the output projection is
// all-reduced over tensor like the full forward's. No dropout: decoding is evaluation. With rotary
// positions (model.position = rope) the cache holds the rotated keys, each at its token's position.
// With grouped-query attention (model.kv_heads) it holds the key/value heads only, KV_l = A_l x
// kv_heads / heads wide (or all kv_heads where the tensor axis replicates them).
#pragma once
#include <cstdint>
#include <vector>

#include "model/attention.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

// Where the n new tokens of one step go, in the order they are appended to their streams.
struct CachedTokens {
  int n = 0;
  const int32_t* stream = nullptr;    // [n] the stream (cache row) each token is appended to
  const int32_t* position = nullptr;  // [n] its position in its own sequence (the embedding's row)
  // [n, capacity] 0/1: the token sees key j of its stream when visible[i * capacity + j] != 0, for j
  // up to and including its own index (later keys never). Null: every key of its stream up to
  // itself (causal). A token always sees itself.
  const uint8_t* visible = nullptr;
};

template <typename T>
class AttentionCache {
 public:
  // Room for `capacity` tokens in each of `streams` streams, for the heads of `attn` (a layer of
  // width d_model); empties every stream.
  void reset(int streams, int capacity, int d_model, const CausalSelfAttention<T>& attn);
  int streams() const { return int(length_.size()); }

  // x [n, M] -> y [n, M]: appends the new tokens' keys and values to their streams, then each
  // token attends over the keys it sees.
  void forward(CausalSelfAttention<T>& attn, const CachedTokens& tok, const T* x, T* y);

 private:
  int capacity_ = 0, M_ = 0, D_ = 0, A_l_ = 0, KV_l_ = 0;  // capacity, M, D, A_l, KV_l
  std::vector<int> length_;   // [streams] tokens held
  Buffer<T> k_, v_;           // [streams, capacity, KV_l]
  Buffer<T> q_, att_;         // of the new tokens [n, A_l]
  Buffer<T> kn_, vn_;         // of the new tokens [n, KV_l]
  std::vector<int32_t> where_;   // [n] index of each new token in its stream
};

}  // namespace meshmoe
