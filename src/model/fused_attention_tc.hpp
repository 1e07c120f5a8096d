// The fused attention on tensor cores (model/fused_attention_tc.cu; CUDA builds only): the same
// tiles, masks and roundings as the bf16 tile bodies (model/fused_attention_bodies.hpp), with the
// products on WMMA bf16 fragments. Which kernel runs: fused_attention_uses_tensor_cores
// (model/fused_attention.hpp, docs/ARCHITECTURE.md "Fused attention").
#pragma once
#include "model/fused_attention_bodies.hpp"

namespace meshmoe {

// The head widths the tensor-core kernels are built for (others run the tile kernel).
constexpr bool fused_attention_tc_width(int D) { return D == 64 || D == 128; }

#ifdef MESHMOE_CUDA
// Whether the bound GPU runs the tensor-core kernels of width D: compiled for sm_80 or later (their
// PTX version) and the device grants their shared memory. Asked once per width.
bool fused_attention_tc_ready(int D);
// O [B*T, A_l] and lse [B, heads_l, T], as FusedAttentionForwardTile writes them (a.bf16, float).
void fused_attention_tc_forward(const FusedAttentionOperands<float>& a, float* O, float* lse);
// dq, dk, dv [B*T, A_l] (overwritten) from lse, dO and delta (FusedAttentionRowDot's, already queued).
void fused_attention_tc_backward(const FusedAttentionOperands<float>& a, const float* lse, const float* dO,
                                 const float* delta, float* dq, float* dk, float* dv);
#endif

}  // namespace meshmoe
