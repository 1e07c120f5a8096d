// The fused attention's tile bodies (model/fused_attention.hpp; FlashAttention-2, Dao 2023,
// Algorithms 1 and 2): one index is one [Br x Bc] block row of one (sequence b, local head h) pair,
// run by for_each_index (tensor/launch.hpp) as a host loop or as a CUDA kernel. The [T, T]
// probabilities are never stored: the forward keeps the running row maximum m and sum l over the
// key tiles in order (the online softmax), rescaling the partial output by exp(m_old - m_new), and
// saves only O and each row's log-sum-exp m + log l; the backward recomputes P = exp(S - lse) per
// tile. Every sum runs in one fixed order (the key tiles in order for a query tile, the query tiles
// in order for a key tile, each tile's products d = 0..D-1 or in row/column order), with no atomics,
// so two runs are bitwise equal.
//
// bf16 (float only): the operands of the products, Q, K, V, dO, and P and dS where they multiply
// V, dO, K or Q, are rounded to bf16 (round_bf16) as a tensor-core kernel reads them; every product
// of two bf16 values is exact in fp32 and summed in fp32 (docs/ARCHITECTURE.md "Precision").
// The softmax itself (S, m, l, P for dS, lse, the row dots) stays in T.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/hd.hpp"
#include "tensor/bf16.hpp"

namespace meshmoe {

constexpr int kFusedTile = 16;  // Br = Bc: the rows of a query tile and of a key tile

// Q, K, V [B*T, A_l] (head h in columns [h*D, (h+1)*D)), the masks and the rounding; shared by the bodies.
template <typename T>
struct FusedAttentionOperands {
  const T* q;
  const T* k;
  const T* v;
  const int32_t* segment;  // [B*T] or null: query i sees key j only in its own packed example
  int B, heads_l, D, Tq;
  bool causal;  // j <= i as well (the decoder's self-attention)
  bool bf16;    // round the products' operands (float only)
  T scale;      // 1 / sqrt(D)

  MESHMOE_HD int64_t A() const { return int64_t(heads_l) * D; }
  MESHMOE_HD int tiles() const { return (Tq + kFusedTile - 1) / kFusedTile; }
  MESHMOE_HD T op(T x) const {
    if constexpr (std::is_same_v<T, float>) return bf16 ? round_bf16(x) : x;
    else return x;
  }
  // Row n = b*T + i of a [B*T, A_l] operand, head h.
  MESHMOE_HD int64_t at(int64_t b, int i, int h) const { return (b * Tq + i) * A() + int64_t(h) * D; }
  // Index t over (b, h, tile), tile innermost.
  MESHMOE_HD void split(int64_t t, int64_t& b, int& h, int& tile) const {
    tile = int(t % tiles());
    h = int((t / tiles()) % heads_l);
    b = t / (int64_t(tiles()) * heads_l);
  }
  MESHMOE_HD bool sees(int64_t b, int i, int j) const {
    if (i >= Tq || j >= Tq || (causal && j > i)) return false;
    return !segment || segment[b * Tq + j] == segment[b * Tq + i];
  }
  // The key tiles of query tile qt: [0, last_key_tile(qt)]; the query tiles of key tile kt: [first_query_tile(kt), tiles).
  MESHMOE_HD int last_key_tile(int qt) const { return causal ? qt : tiles() - 1; }
  MESHMOE_HD int first_query_tile(int kt) const { return causal ? kt : 0; }
  // s[r][c] = scale q_(i0+r) . k_(j0+c) where query i0 + r sees key j0 + c; vis[r][c] says which.
  MESHMOE_HD void scores(int64_t b, int h, int i0, int j0, T (&s)[kFusedTile][kFusedTile],
                         bool (&vis)[kFusedTile][kFusedTile]) const {
    for (int r = 0; r < kFusedTile; ++r)
      for (int c = 0; c < kFusedTile; ++c) {
        vis[r][c] = sees(b, i0 + r, j0 + c);
        s[r][c] = 0;
        if (!vis[r][c]) continue;
        const T* qr = q + at(b, i0 + r, h);
        const T* kc = k + at(b, j0 + c, h);
        T dot = 0;
        for (int d = 0; d < D; ++d) dot += op(qr[d]) * op(kc[d]);
        s[r][c] = scale * dot;
      }
  }
  // p[r][c] = exp(s - lse of row i0 + r) where visible, else 0 (the backward's recomputed P).
  MESHMOE_HD void probabilities(int64_t b, int h, int i0, const T* lse, const T (&s)[kFusedTile][kFusedTile],
                                const bool (&vis)[kFusedTile][kFusedTile], T (&p)[kFusedTile][kFusedTile]) const {
    for (int r = 0; r < kFusedTile; ++r) {
      const T row_lse = i0 + r < Tq ? lse[(b * heads_l + h) * Tq + i0 + r] : T(0);
      for (int c = 0; c < kFusedTile; ++c) p[r][c] = vis[r][c] ? std::exp(s[r][c] - row_lse) : T(0);
    }
  }
  // ds[r][c] = p (dP - delta_i), dP = dO_i . v_j, in place of ds (the softmax backward of one tile).
  MESHMOE_HD void score_grads(int64_t b, int h, int i0, int j0, const T* dO, const T* delta,
                              const T (&p)[kFusedTile][kFusedTile], T (&ds)[kFusedTile][kFusedTile]) const {
    for (int r = 0; r < kFusedTile; ++r)
      for (int c = 0; c < kFusedTile; ++c) {
        ds[r][c] = 0;
        if (p[r][c] == T(0)) continue;  // masked (or underflowed: dS = P (...) is then 0 as well)
        const T* dor = dO + at(b, i0 + r, h);
        const T* vc = v + at(b, j0 + c, h);
        T dp = 0;
        for (int d = 0; d < D; ++d) dp += op(dor[d]) * op(vc[d]);
        ds[r][c] = p[r][c] * (dp - delta[(b * heads_l + h) * Tq + i0 + r]);
      }
  }
  // Rows o0 + r of out += factor sum_c op(m[r][c]) op(x row x0 + c), m transposed or not, over the
  // tile's rows and columns inside T: dQ from dS and K, dK from dS^T and Q, dV from P^T and dO.
  MESHMOE_HD void add_tile_product(int64_t b, int h, int o0, int x0, const T (&m)[kFusedTile][kFusedTile],
                                   bool transposed, const T* x, T factor, T* out) const {
    for (int r = 0; r < kFusedTile && o0 + r < Tq; ++r) {
      T* g = out + at(b, o0 + r, h);
      for (int d = 0; d < D; ++d) {
        T acc = 0;
        for (int c = 0; c < kFusedTile && x0 + c < Tq; ++c)
          acc += op(transposed ? m[c][r] : m[r][c]) * op(x[at(b, x0 + c, h) + d]);
        g[d] += factor * acc;
      }
    }
  }
};

// Index (b, h, query tile): O rows [B*T, A_l] and lse [B, heads_l, T] of the tile's queries.
template <typename T>
struct FusedAttentionForwardTile {
  FusedAttentionOperands<T> a;
  T* O;
  T* lse;
  MESHMOE_HD void operator()(int64_t t) const {
    int64_t b;
    int h, qt;
    a.split(t, b, h, qt);
    const int i0 = qt * kFusedTile;
    T m[kFusedTile], l[kFusedTile];
    T s[kFusedTile][kFusedTile];
    bool vis[kFusedTile][kFusedTile];
    for (int r = 0; r < kFusedTile; ++r) {
      m[r] = -INFINITY;
      l[r] = 0;
      if (i0 + r < a.Tq)
        for (int d = 0; d < a.D; ++d) O[a.at(b, i0 + r, h) + d] = 0;
    }
    for (int kt = 0; kt <= a.last_key_tile(qt); ++kt) {
      const int j0 = kt * kFusedTile;
      a.scores(b, h, i0, j0, s, vis);
      for (int r = 0; r < kFusedTile && i0 + r < a.Tq; ++r) {
        T mt = m[r];
        for (int c = 0; c < kFusedTile; ++c)
          if (vis[r][c]) mt = s[r][c] > mt ? s[r][c] : mt;
        if (mt == -INFINITY) continue;  // no key of this row's example yet
        // m[r] = -inf (nothing seen yet): alpha = 0, and O and l are still 0
        const T alpha = m[r] == -INFINITY ? T(0) : std::exp(m[r] - mt);
        T sum = 0;
        for (int c = 0; c < kFusedTile; ++c) {
          s[r][c] = vis[r][c] ? std::exp(s[r][c] - mt) : T(0);  // P of the tile, unnormalised
          sum += s[r][c];
        }
        l[r] = l[r] * alpha + sum;
        m[r] = mt;
        T* o = O + a.at(b, i0 + r, h);
        for (int d = 0; d < a.D; ++d) {
          T acc = 0;
          for (int c = 0; c < kFusedTile; ++c)
            if (vis[r][c]) acc += a.op(s[r][c]) * a.op(a.v[a.at(b, j0 + c, h) + d]);
          o[d] = o[d] * alpha + acc;
        }
      }
    }
    // Every row sees at least itself (causal) or its example (bidirectional): l > 0.
    for (int r = 0; r < kFusedTile && i0 + r < a.Tq; ++r) {
      T* o = O + a.at(b, i0 + r, h);
      const T inv = T(1) / l[r];
      for (int d = 0; d < a.D; ++d) o[d] *= inv;
      lse[(b * a.heads_l + h) * a.Tq + i0 + r] = m[r] + std::log(l[r]);
    }
  }
};

// Index r = (b * heads_l + h) * T + i: delta = dO_i . O_i (= sum_j P_ij dP_ij, the softmax
// backward's row dot; FlashAttention-2 Algorithm 2 line 4), dO rounded as the products read it.
template <typename T>
struct FusedAttentionRowDot {
  FusedAttentionOperands<T> a;
  const T* O;
  const T* dO;
  T* delta;  // [B, heads_l, T]
  MESHMOE_HD void operator()(int64_t r) const {
    const int i = int(r % a.Tq);
    const int h = int((r / a.Tq) % a.heads_l);
    const int64_t b = r / (int64_t(a.Tq) * a.heads_l);
    const int64_t n = a.at(b, i, h);
    T dot = 0;
    for (int d = 0; d < a.D; ++d) dot += a.op(dO[n + d]) * O[n + d];
    delta[r] = dot;
  }
};

// Index (b, h, query tile): dQ rows of the tile = scale sum over its key tiles, in order, of dS K.
template <typename T>
struct FusedAttentionBackwardQueryTile {
  FusedAttentionOperands<T> a;
  const T* lse;
  const T* dO;
  const T* delta;
  T* dq;
  MESHMOE_HD void operator()(int64_t t) const {
    int64_t b;
    int h, qt;
    a.split(t, b, h, qt);
    const int i0 = qt * kFusedTile;
    T s[kFusedTile][kFusedTile], p[kFusedTile][kFusedTile];
    bool vis[kFusedTile][kFusedTile];
    for (int r = 0; r < kFusedTile && i0 + r < a.Tq; ++r)
      for (int d = 0; d < a.D; ++d) dq[a.at(b, i0 + r, h) + d] = 0;
    for (int kt = 0; kt <= a.last_key_tile(qt); ++kt) {
      const int j0 = kt * kFusedTile;
      a.scores(b, h, i0, j0, s, vis);
      a.probabilities(b, h, i0, lse, s, vis, p);
      a.score_grads(b, h, i0, j0, dO, delta, p, s);  // s now holds dS
      a.add_tile_product(b, h, i0, j0, s, false, a.k, a.scale, dq);
    }
  }
};

// Index (b, h, key tile): dK, dV rows of the tile = sums over its query tiles, in order, of
// scale dS^T Q and P^T dO.
template <typename T>
struct FusedAttentionBackwardKeyTile {
  FusedAttentionOperands<T> a;
  const T* lse;
  const T* dO;
  const T* delta;
  T* dk;
  T* dv;
  MESHMOE_HD void operator()(int64_t t) const {
    int64_t b;
    int h, kt;
    a.split(t, b, h, kt);
    const int j0 = kt * kFusedTile;
    T s[kFusedTile][kFusedTile], p[kFusedTile][kFusedTile];
    bool vis[kFusedTile][kFusedTile];
    for (int c = 0; c < kFusedTile && j0 + c < a.Tq; ++c)
      for (int d = 0; d < a.D; ++d) dk[a.at(b, j0 + c, h) + d] = dv[a.at(b, j0 + c, h) + d] = 0;
    for (int qt = a.first_query_tile(kt); qt < a.tiles(); ++qt) {
      const int i0 = qt * kFusedTile;
      a.scores(b, h, i0, j0, s, vis);
      a.probabilities(b, h, i0, lse, s, vis, p);
      a.add_tile_product(b, h, j0, i0, p, true, dO, T(1), dv);
      a.score_grads(b, h, i0, j0, dO, delta, p, s);  // s now holds dS
      a.add_tile_product(b, h, j0, i0, s, true, a.q, a.scale, dk);
    }
  }
};

}  // namespace meshmoe
