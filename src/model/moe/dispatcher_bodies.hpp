// The loops of the MoE dispatchers (model/moe/dispatcher.cpp, alltoall_dispatcher.cpp) as
// for_each_index bodies (tensor/launch.hpp). Every body owns one element of what it writes: the
// gathers and the dout of the combine backward an element of the destination row, the combine and
// the dispatch backward an element of a token row (looping over that token's choices), the gate
// gradient one choice.
#pragma once
#include <cstdint>

#include "core/hd.hpp"
#include "tensor/bf16.hpp"

namespace meshmoe {

// The dispatch plan (IndexDispatcher::plan) is made on the device in three bodies, with one wait
// between the second and the third for the host to size the rows.
//
// Group g: fill [El, G] = each held expert's highest filled slot of the group + 1 (its rows), and
// bad [g] = the group's first choice whose expert or slot lies outside [0, E) x [0, C), or -1.
struct PlanFillGroup {
  const int *expert, *slot;
  int64_t *fill, *bad;
  int S, k, E, C, e0, El, G;
  MESHMOE_HD void operator()(int64_t g) const {
    for (int el = 0; el < El; ++el) fill[el * G + g] = 0;
    bad[g] = -1;
    for (int64_t c = g * S * k; c < (g + 1) * S * k; ++c) {
      const int e = expert[c];
      if (e < 0) continue;
      if (e >= E || slot[c] < 0 || slot[c] >= C) {
        if (bad[g] < 0) bad[g] = c;
        continue;
      }
      const int el = e - e0;
      if (el < 0 || el >= El) continue;
      int64_t& f = fill[int64_t(el) * G + g];
      if (f < slot[c] + 1) f = slot[c] + 1;
    }
  }
};

// One body (index 0): start [El, G] = the first row of (expert, group), rows in (expert, group)
// order; sizes [El + 2] = each held expert's rows, all rows, and the first bad choice (in choice
// order: groups are consecutive tokens) or -1.
struct PlanStarts {
  const int64_t *fill, *bad;
  int64_t *start, *sizes;
  int El, G;
  MESHMOE_HD void operator()(int64_t) const {
    int64_t total = 0;
    for (int el = 0; el < El; ++el) {
      int64_t rows = 0;
      for (int g = 0; g < G; ++g) {
        start[el * G + g] = total;
        total += fill[el * G + g];
        rows += fill[el * G + g];
      }
      sizes[el] = rows;
    }
    sizes[El] = total;
    int64_t first_bad = -1;
    for (int g = 0; g < G && first_bad < 0; ++g) first_bad = bad[g];
    sizes[El + 1] = first_bad;
  }
};

// Row r: empty (-1 in slot_token, slot_global, slot_choice) until a choice takes it.
struct PlanClearRow {
  int* slot_token;
  int64_t *slot_global, *slot_choice;
  MESHMOE_HD void operator()(int64_t row) const {
    slot_token[row] = -1;
    slot_global[row] = -1;
    slot_choice[row] = -1;
  }
};

// Token n: the row of each of its choices held here (choice_row [N*k], -1 otherwise), and in that
// row its token, global token and choice; token_rows [n, k] = its rows ascending, -1 after the last.
struct PlanScatterToken {
  const int *expert, *slot;
  const int64_t* start;
  int* slot_token;
  int64_t *slot_global, *slot_choice, *choice_row, *token_rows;
  uint64_t token_offset;
  int S, k, e0, El, G;
  MESHMOE_HD void operator()(int64_t n) const {
    int64_t* rows_of_n = token_rows + n * k;
    int held = 0;
    for (int i = 0; i < k; ++i) {
      const int64_t c = n * k + i;
      const int el = expert[c] - e0;
      choice_row[c] = -1;
      if (expert[c] < 0 || el < 0 || el >= El) continue;
      const int64_t row = start[int64_t(el) * G + n / S] + slot[c];
      choice_row[c] = row;
      slot_token[row] = int(n);
      slot_global[row] = int64_t(token_offset + uint64_t(n));
      slot_choice[row] = c;
      int j = held++;  // insertion into the ascending rows
      for (; j > 0 && rows_of_n[j - 1] > row; --j) rows_of_n[j] = rows_of_n[j - 1];
      rows_of_n[j] = row;
    }
    for (int j = held; j < k; ++j) rows_of_n[j] = -1;
  }
};

// Index i = row * M + m: dst[row, m] = src[index[row], m], 0 where index[row] < 0 (an empty slot).
// dst16 (optional, float): the gathered value's bf16 copy (bf16_bits), for the experts' GEMMs.
template <typename T, typename I>
struct GatherRows {
  const T* src;
  const I* index;
  T* dst;
  int M;
  uint16_t* dst16 = nullptr;
  MESHMOE_HD void operator()(int64_t row, int64_t m) const {
    const int64_t i = row * M + m;
    const int64_t s = int64_t(index[row]);
    dst[i] = s < 0 ? T(0) : src[s * M + m];
    if (dst16) dst16[i] = bf16_bits(float(dst[i]));
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
