// The loops of Embedding (model/embedding.cpp) as for_each_index bodies (tensor/launch.hpp).
#pragma once
#include <cstdint>

#include "core/hd.hpp"

namespace meshmoe {

// Element i = n * M + m: x[n, m] = wte[token[n], m] + wpe[n % T, m].
template <typename T>
struct EmbeddingForwardElement {
  const T *wte, *wpe;
  const int32_t* tokens;
  T* x;
  int M, T_seq;
  MESHMOE_HD void operator()(int64_t n, int64_t m) const {
    const int64_t i = n * M + m;
    x[i] = wte[int64_t(tokens[n]) * M + m] + wpe[(n % T_seq) * M + m];
  }
};

// Element i = u * M + m of the token table's gradient, for the u-th distinct token row rows[u]:
// adds dx[n, m] over that token's positions order[start[u] .. start[u+1]) (ascending n, the order
// of a plain loop over the tokens), so each gradient element has one writer.
template <typename T>
struct EmbeddingTokenGradElement {
  const T* dx;
  const int32_t *rows, *start, *order;
  T* gwte;
  int M;
  MESHMOE_HD void operator()(int64_t u, int64_t m) const {
    T* g = gwte + int64_t(rows[u]) * M + m;
    T acc = *g;
    for (int32_t k = start[u]; k < start[u + 1]; ++k) acc += dx[int64_t(order[k]) * M + m];
    *g = acc;
  }
};

// Element i = t * M + m of the position table's gradient: adds dx[n, m] over n = t, t + T, ... < N.
template <typename T>
struct EmbeddingPositionGradElement {
  const T* dx;
  T* gwpe;
  int M, T_seq, N;
  MESHMOE_HD void operator()(int64_t t, int64_t m) const {
    const int64_t i = t * M + m;
    T acc = gwpe[i];
    for (int64_t n = t; n < N; n += T_seq) acc += dx[n * M + m];
    gwpe[i] = acc;
  }
};

}  // namespace meshmoe
