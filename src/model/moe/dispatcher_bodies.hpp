// The loops of the MoE dispatchers (model/moe/dispatcher.cpp, alltoall_dispatcher.cpp) as
// for_each_index bodies (tensor/launch.hpp). Every body owns one element of what it writes: the
// gathers and the dout of the combine backward an element of the destination row, the combine and
// the dispatch backward an element of a token row (looping over that token's choices), the gate
// gradient one choice.
#pragma once
#include <cstdint>

#include "core/hd.hpp"

namespace meshmoe {

// Index i = row * M + m: dst[row, m] = src[index[row], m], 0 where index[row] < 0 (an empty slot).
template <typename T, typename I>
struct GatherRows {
  const T* src;
  const I* index;
  T* dst;
  int M;
  MESHMOE_HD void operator()(int64_t row, int64_t m) const {
    const int64_t i = row * M + m;
    const int64_t s = int64_t(index[row]);
    dst[i] = s < 0 ? T(0) : src[s * M + m];
  }
};

// Index i = n * M + m: dx[n, m] += dbuf[row, m] over token n's rows, ascending (token_rows [N, k],
// -1 after the last), the order in which a loop over the rows would add them.
template <typename T>
struct DispatchBackwardElement {
  const T* dbuf;
  const int64_t* token_rows;
  T* dx;
  int M, k;
  MESHMOE_HD void operator()(int64_t n, int64_t m) const {
    const int64_t i = n * M + m;
    T d = dx[i];
    for (int j = 0; j < k; ++j) {
      const int64_t row = token_rows[n * k + j];
      if (row < 0) break;
      d += dbuf[row * M + m];
    }
    dx[i] = d;
  }
};

// Index i = n * M + m: y[n, m] = sum over n's choices c with a row, in choice order, of
// gate[c] * out[row(c), m] (GShard Algorithm 2 line 8 in index form).
template <typename T>
struct CombineElement {
  const T *out, *gate;
  const int64_t* choice_row;
  T* y;
  int M, k;
  MESHMOE_HD void operator()(int64_t n, int64_t m) const {
    const int64_t i = n * M + m;
    T acc = 0;
    for (int j = 0; j < k; ++j) {
      const int64_t c = n * k + j;
      if (choice_row[c] < 0) continue;
      acc += gate[c] * out[choice_row[c] * M + m];
    }
    y[i] = acc;
  }
};

// Index i = row * M + m: dout[row, m] = gate[c] * dy[token(c), m] for the choice c in the row, 0 in
// an empty slot.
template <typename T>
struct CombineBackwardOutElement {
  const T *dy, *gate;
  const int64_t* slot_choice;
  T* dout;
  int M, k;
  MESHMOE_HD void operator()(int64_t row, int64_t m) const {
    const int64_t i = row * M + m;
    const int64_t c = slot_choice[row];
    dout[i] = c < 0 ? T(0) : gate[c] * dy[(c / k) * M + m];
  }
};

// Choice c: dgate[c] = <dy[token(c)], out[row(c)]>, 0 for a choice without a row.
template <typename T>
struct CombineBackwardGateChoice {
  const T *dy, *out;
  const int64_t* choice_row;
  T* dgate;
  int M, k;
  MESHMOE_HD void operator()(int64_t c) const {
    const int64_t row = choice_row[c];
    if (row < 0) {
      dgate[c] = T(0);
      return;
    }
    const T* d = dy + (c / k) * M;
    const T* o = out + row * M;
    T acc = 0;
    for (int m = 0; m < M; ++m) acc += d[m] * o[m];
    dgate[c] = acc;
  }
};

}  // namespace meshmoe
