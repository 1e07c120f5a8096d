// The cross-attention of a decoder block during decoding (docs/ARCHITECTURE.md "Decoding"): the
// keys and values of every source's encoder output, computed once from the block's CrossAttention
// weights, and each new decoder token's attention over its own source's keys.
//
// Sources are packed one after the other (source s holds rows [begin(s), begin(s + 1)) of the
// encoder output); a token names its source, and every hypothesis of a source reads the same keys
// and values (nothing is copied per hypothesis). With heads split over tensor the cache holds this
// rank's heads [rows, A_l] and the output projection is all-reduced as in the full forward. No
// dropout: decoding is evaluation.
#pragma once
#include <cstdint>
#include <vector>

#include "model/cross_attention.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class CrossAttentionCache {
 public:
  // enc [rows, M], rows = source_begin.back(): the encoder output (after ln_enc) of the sources,
  // source s at rows [source_begin[s], source_begin[s + 1]), none empty -> k, v [rows, A_l].
  void reset(const CrossAttention<T>& cross, int d_model, const T* enc, const std::vector<int>& source_begin);
  int sources() const { return int(begin_.size()) - 1; }

  // x [n, M] -> y [n, M]: token i attends to every key of source[i] (the full forward's masked
  // attention core, one query at a time).
  void forward(CrossAttention<T>& cross, int n, const int32_t* source, const T* x, T* y);

 private:
  int M_ = 0, D_ = 0, heads_l_ = 0, A_l_ = 0;  // M, D, heads_l, A_l
  std::vector<int> begin_{0};           // [sources + 1]
  Buffer<T> k_, v_;                     // [rows, A_l]
  Buffer<T> q_, p_, att_;               // [n, A_l], scores [heads_l, longest source], [n, A_l]
};

}  // namespace meshmoe
