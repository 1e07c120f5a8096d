#include "model/fused_attention.hpp"

#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "model/fused_attention_bodies.hpp"
#include "model/fused_attention_tc.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

namespace {
template <typename T>
FusedAttentionOperands<T> operands(const FusedAttentionShape& s, const T* q, const T* k, const T* v) {
  if (s.bf16 && !std::is_same_v<T, float>) throw std::logic_error("fused attention: bf16 operands need float");
  return {.q = q, .k = k, .v = v, .segment = s.segment, .B = s.B, .heads_l = s.heads_l, .D = s.D, .Tq = s.Tq,
          .causal = s.causal, .bf16 = s.bf16, .scale = T(1) / std::sqrt(T(s.D))};
}
}  // namespace

bool fused_attention_uses_tensor_cores(const FusedAttentionShape& s) {
#ifdef MESHMOE_CUDA
  return current_device() == Device::Cuda && s.bf16 && fused_attention_tc_width(s.D) && s.B < 65536 &&
         s.heads_l < 65536 && fused_attention_tc_ready(s.D);
#else
  (void)s;
  return false;
#endif
}

// One index per (b, h, tile); its work: the tile's rows times the keys and the head width.
template <typename T>
void fused_attention_forward(const FusedAttentionShape& s, const T* q, const T* k, const T* v, T* O, T* lse) {
  const FusedAttentionOperands<T> a = operands(s, q, k, v);
#ifdef MESHMOE_CUDA
  if constexpr (std::is_same_v<T, float>)
    if (fused_attention_uses_tensor_cores(s)) return fused_attention_tc_forward(a, O, lse);
#endif
  const int64_t tiles = int64_t(s.B) * s.heads_l * a.tiles();
  for_each_index(tiles, FusedAttentionForwardTile<T>{.a = a, .O = O, .lse = lse},
                 int64_t(kFusedTile) * s.Tq * s.D);
}

// delta first (every row), then dQ by query tiles and dK, dV by key tiles: each tile writes only its own rows.
template <typename T>
void fused_attention_backward(const FusedAttentionShape& s, const T* q, const T* k, const T* v, const T* O,
                              const T* lse, const T* dO, T* delta, T* dq, T* dk, T* dv) {
  const FusedAttentionOperands<T> a = operands(s, q, k, v);
  const int64_t rows = int64_t(s.B) * s.heads_l * s.Tq, tiles = int64_t(s.B) * s.heads_l * a.tiles();
  const int64_t tile_work = int64_t(kFusedTile) * s.Tq * s.D;
  for_each_index(rows, FusedAttentionRowDot<T>{.a = a, .O = O, .dO = dO, .delta = delta}, s.D);
#ifdef MESHMOE_CUDA
  if constexpr (std::is_same_v<T, float>)
    if (fused_attention_uses_tensor_cores(s)) return fused_attention_tc_backward(a, lse, dO, delta, dq, dk, dv);
#endif
  for_each_index(tiles, FusedAttentionBackwardQueryTile<T>{.a = a, .lse = lse, .dO = dO, .delta = delta, .dq = dq},
                 tile_work);
  for_each_index(tiles,
                 FusedAttentionBackwardKeyTile<T>{.a = a, .lse = lse, .dO = dO, .delta = delta, .dk = dk, .dv = dv},
                 tile_work);
}

#define MESHMOE_FUSED_ATTENTION(T)                                                                              \
  template void fused_attention_forward<T>(const FusedAttentionShape&, const T*, const T*, const T*, T*, T*); \
  template void fused_attention_backward<T>(const FusedAttentionShape&, const T*, const T*, const T*, const T*, \
                                            const T*, const T*, T*, T*, T*, T*);
MESHMOE_FUSED_ATTENTION(float)
MESHMOE_FUSED_ATTENTION(double)
#undef MESHMOE_FUSED_ATTENTION

}  // namespace meshmoe
