// The loops of CausalSelfAttention (model/attention.cpp) and of the segment-masked attention core
// (model/attention_core.cpp) as for_each_row bodies (tensor/launch_rows.hpp).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.hpp"
#include "tensor/bf16.hpp"

namespace meshmoe {

// Row r = (b * heads_l + h) * T + i of the scores [B, heads_l, T, T] (already scaled), in place: softmax over
// the keys the query sees, j <= i in its own example (segment[b*T + j] == segment[b*T + i]; every
// j <= i when segment is null), zero elsewhere (docs/ARCHITECTURE.md "Packed sequences"). The query
// always sees itself, so the sum is never empty. P16 (optional): every value written, rounded to
// bf16 (bf16_bits): the operand of the bf16 GEMMs that read P, rounded here once instead of by each
// GEMM (docs/ARCHITECTURE.md "Precision").
template <typename T>
struct AttentionCausalSoftmaxRow {
  T* P;
  const int32_t* segment;  // [B, T] or null
  int Tq, heads_l;
  uint16_t* P16 = nullptr;  // [B, heads_l, T, T] or null
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t r, const Lanes& lanes) const {
    const int i = int(r % Tq);
    const int32_t* seg = segment ? segment + (r / (int64_t(Tq) * heads_l)) * Tq : nullptr;
    T* row = P + r * Tq;
    T mx = row[i];
    for (int j = lanes.first; j < i; j += lanes.step)
      if (!seg || seg[j] == seg[i]) mx = row[j] > mx ? row[j] : mx;
    mx = lanes.max(mx);
    T sum = 0;
    for (int j = lanes.first; j <= i; j += lanes.step) {
      row[j] = (!seg || seg[j] == seg[i]) ? std::exp(row[j] - mx) : T(0);
      sum += row[j];
    }
    const T inv = T(1) / lanes.sum(sum);
    // Each lane writes the copy of exactly the values it writes (no lane reads another's).
    uint16_t* row16 = P16 ? P16 + r * Tq : nullptr;
    for (int j = lanes.first; j <= i; j += lanes.step) {
      row[j] *= inv;
      if (row16) row16[j] = bf16_bits(float(row[j]));
    }
    for (int j = i + 1 + lanes.first; j < Tq; j += lanes.step) {
      row[j] = T(0);
      if (row16) row16[j] = 0;  // bf16_bits(0)
    }
  }
};

// Row r = (b * heads_l + h) * T + i of dP [B, heads_l, T, T], in place: dS = P * (dP - sum_j P dP)
// over j <= i, zero above the diagonal and outside the query's example (P is). dS16 (optional):
// dS rounded to bf16, as P16 above.
template <typename T>
struct AttentionCausalSoftmaxBackwardRow {
  const T* P;
  T* dP;
  int Tq;
  uint16_t* dS16 = nullptr;  // [B, heads_l, T, T] or null
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t r, const Lanes& lanes) const {
    const int64_t i = r % Tq;
    const T* pr = P + r * Tq;
    T* dr = dP + r * Tq;
    T dot = 0;
    for (int64_t j = lanes.first; j <= i; j += lanes.step) dot += pr[j] * dr[j];
    dot = lanes.sum(dot);
    uint16_t* row16 = dS16 ? dS16 + r * Tq : nullptr;
    for (int64_t j = lanes.first; j <= i; j += lanes.step) {
      dr[j] = pr[j] * (dr[j] - dot);
      if (row16) row16[j] = bf16_bits(float(dr[j]));
    }
    for (int64_t j = i + 1 + lanes.first; j < Tq; j += lanes.step) {
      dr[j] = T(0);
      if (row16) row16[j] = 0;
    }
  }
};

// Row r = (b * heads_l + h) * Tq + i of the scores [B, heads_l, Tq, Tk] (already scaled), in place, without a
// causal mask (bidirectional self-attention, cross-attention): softmax over the keys j of the
// query's example (key_segment[b*Tk + j] == query_segment[b*Tq + i]; every key when both are null),
// zero elsewhere. A query whose example has no key gets an all-zero row (so a zero output).
template <typename T>
struct AttentionMaskedSoftmaxRow {
  T* P;
  const int32_t* query_segment;  // [B, Tq] or null
  const int32_t* key_segment;    // [B, Tk] or null
  int Tq, Tk, heads_l;
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t r, const Lanes& lanes) const {
    const int64_t b = r / (int64_t(Tq) * heads_l);
    const int i = int(r % Tq);
    const int32_t* kseg = key_segment ? key_segment + b * Tk : nullptr;
    const int32_t qs = query_segment ? query_segment[b * Tq + i] : 0;
    T* row = P + r * Tk;
    bool any = false;
    T mx = 0;
    for (int j = lanes.first; j < Tk; j += lanes.step)
      if (!kseg || kseg[j] == qs) mx = (!any || row[j] > mx) ? row[j] : mx, any = true;
    // A lane that saw no key of the example takes no part in the maximum.
    mx = lanes.max(any ? mx : -INFINITY);
    any = lanes.max(int(any)) != 0;
    T sum = 0;
    for (int j = lanes.first; j < Tk; j += lanes.step) {
      row[j] = (!kseg || kseg[j] == qs) ? std::exp(row[j] - mx) : T(0);
      sum += row[j];
    }
    sum = lanes.sum(sum);
    const T inv = any ? T(1) / sum : T(0);
    for (int j = lanes.first; j < Tk; j += lanes.step) row[j] *= inv;
  }
};

// Row r of dP [B, heads_l, Tq, Tk], in place: dS = P * (dP - sum_j P dP) over all Tk keys (zero where P is).
template <typename T>
struct AttentionSoftmaxBackwardRow {
  const T* P;
  T* dP;
  int Tk;
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t r, const Lanes& lanes) const {
    const T* pr = P + r * Tk;
    T* dr = dP + r * Tk;
    T dot = 0;
    for (int j = lanes.first; j < Tk; j += lanes.step) dot += pr[j] * dr[j];
    dot = lanes.sum(dot);
    for (int j = lanes.first; j < Tk; j += lanes.step) dr[j] = pr[j] * (dr[j] - dot);
  }
};

}  // namespace meshmoe
