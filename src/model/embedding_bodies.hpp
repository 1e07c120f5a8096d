// The loops of Embedding (model/embedding.cpp) as for_each_index bodies (tensor/launch.hpp).
#pragma once
#include <cstdint>

#include "core/hd.hpp"

namespace meshmoe {

// Element i = n * M + m: x[n, m] = wte[token[n], m] + wpe[position[n], m], position[n] the token's
// place in its packed example; wpe null (model.position = rope): x[n, m] = wte[token[n], m].
template <typename T>
struct EmbeddingForwardElement {
  const T *wte, *wpe;
  const int32_t *tokens, *position;
  T* x;
  int M;
  MESHMOE_HD void operator()(int64_t n, int64_t m) const {
    const T token = wte[int64_t(tokens[n]) * M + m];
    x[n * M + m] = wpe ? token + wpe[int64_t(position[n]) * M + m] : token;
  }
};

// Element i = u * M + m of a table's gradient (tokens: wte, positions: wpe), for the u-th distinct
// row rows[u] in use: adds dx[n, m] over that row's tokens order[start[u] .. start[u+1])
// (ascending n, the order of a plain loop over the tokens), so each gradient element has one writer.
template <typename T>
struct EmbeddingRowGradElement {
  const T* dx;
  const int32_t *rows, *start, *order;
  T* g_table;
  int M;
  MESHMOE_HD void operator()(int64_t u, int64_t m) const {
    T* g = g_table + int64_t(rows[u]) * M + m;
    T acc = *g;
    for (int32_t k = start[u]; k < start[u + 1]; ++k) acc += dx[int64_t(order[k]) * M + m];
    *g = acc;
  }
};

}  // namespace meshmoe
