// The loops of CausalSelfAttention (model/attention.cpp) and of the segment-masked attention core
// (model/attention_core.cpp) as for_each_index bodies (tensor/launch.hpp).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.hpp"

namespace meshmoe {

// Row r = (b * heads_l + h) * T + i of the scores [B, heads_l, T, T] (already scaled), in place: softmax over
// the keys the query sees, j <= i in its own example (segment[b*T + j] == segment[b*T + i]; every
// j <= i when segment is null), zero elsewhere (docs/ARCHITECTURE.md "Packed sequences"). The query
// always sees itself, so the sum is never empty.
template <typename T>
struct AttentionCausalSoftmaxRow {
  T* P;
  const int32_t* segment;  // [B, T] or null
  int Tq, heads_l;
  MESHMOE_HD void operator()(int64_t r) const {
    const int i = int(r % Tq);
    const int32_t* seg = segment ? segment + (r / (int64_t(Tq) * heads_l)) * Tq : nullptr;
    T* row = P + r * Tq;
    T mx = row[i];
    for (int j = 0; j < i; ++j)
      if (!seg || seg[j] == seg[i]) mx = row[j] > mx ? row[j] : mx;
    T sum = 0;
    for (int j = 0; j <= i; ++j) {
      row[j] = (!seg || seg[j] == seg[i]) ? std::exp(row[j] - mx) : T(0);
      sum += row[j];
    }
    const T inv = T(1) / sum;
    for (int j = 0; j <= i; ++j) row[j] *= inv;
    for (int j = i + 1; j < Tq; ++j) row[j] = T(0);
  }
};

// Row r = (b * heads_l + h) * T + i of dP [B, heads_l, T, T], in place: dS = P * (dP - sum_j P dP)
// over j <= i, zero above the diagonal and outside the query's example (P is).
template <typename T>
struct AttentionCausalSoftmaxBackwardRow {
  const T* P;
  T* dP;
  int Tq;
  MESHMOE_HD void operator()(int64_t r) const {
    const int64_t i = r % Tq;
    const T* pr = P + r * Tq;
    T* dr = dP + r * Tq;
    T dot = 0;
    for (int64_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
    for (int64_t j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dot);
    for (int64_t j = i + 1; j < Tq; ++j) dr[j] = T(0);
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
  MESHMOE_HD void operator()(int64_t r) const {
    const int64_t b = r / (int64_t(Tq) * heads_l);
    const int i = int(r % Tq);
    const int32_t* kseg = key_segment ? key_segment + b * Tk : nullptr;
    const int32_t qs = query_segment ? query_segment[b * Tq + i] : 0;
    T* row = P + r * Tk;
    bool any = false;
    T mx = 0;
    for (int j = 0; j < Tk; ++j)
      if (!kseg || kseg[j] == qs) mx = (!any || row[j] > mx) ? row[j] : mx, any = true;
    T sum = 0;
    for (int j = 0; j < Tk; ++j) {
      row[j] = (!kseg || kseg[j] == qs) ? std::exp(row[j] - mx) : T(0);
      sum += row[j];
    }
    const T inv = any ? T(1) / sum : T(0);
    for (int j = 0; j < Tk; ++j) row[j] *= inv;
  }
};

// Row r of dP [B, heads_l, Tq, Tk], in place: dS = P * (dP - sum_j P dP) over all Tk keys (zero where P is).
template <typename T>
struct AttentionSoftmaxBackwardRow {
  const T* P;
  T* dP;
  int Tk;
  MESHMOE_HD void operator()(int64_t r) const {
    const T* pr = P + r * Tk;
    T* dr = dP + r * Tk;
    T dot = 0;
    for (int j = 0; j < Tk; ++j) dot += pr[j] * dr[j];
    for (int j = 0; j < Tk; ++j) dr[j] = pr[j] * (dr[j] - dot);
  }
};

}  // namespace meshmoe
