// Fused attention (model.attention_kernel = "fused"; FlashAttention-2, Dao 2023): softmax(q k^T /
// sqrt(D)) v for every (sequence b, local head h) pair without the [B, heads_l, T, T] probabilities
// in memory, by [Br x Bc] tiles with an online softmax (model/fused_attention_bodies.hpp; the
// algorithm: docs/ARCHITECTURE.md "Fused attention"). The forward keeps O and each query row's
// log-sum-exp; the backward recomputes the probabilities tile by tile from them. On the host the
// tiles run as host loops, on the GPU as a CUDA kernel of the same bodies (model/fused_attention.cu)
// or, in bf16 at head width 64 or 128, on tensor cores (model/fused_attention_tc.cu).
#pragma once
#include <cstdint>

namespace meshmoe {

// B sequences of T tokens, q, k, v [B*T, A_l], A_l = heads_l * D. A query sees the keys j <= i
// (causal) or all keys, of its own packed example (segment [B*T], or the whole sequence when null).
// bf16: the products' operands rounded to bf16 (float only, model.precision = "bf16").
struct FusedAttentionShape {
  int B = 0, heads_l = 0, D = 0, Tq = 0;
  bool causal = true;
  const int32_t* segment = nullptr;
  bool bf16 = false;
};

// O [B*T, A_l] = attention output, lse [B, heads_l, T] = each row's log sum_j exp(s_ij) (overwritten).
template <typename T>
void fused_attention_forward(const FusedAttentionShape& s, const T* q, const T* k, const T* v, T* O, T* lse);

// Whether the calls below run the tensor-core kernels (model/fused_attention_tc.cu): on the GPU
// (run.device = "cuda"), bf16 operands, D = 64 or 128, B and heads_l below 65536 (the grid's dimensions),
// and the GPU runs them (fused_attention_tc_ready: sm_80 or later, their shared memory granted).
// Otherwise the tile kernel (or the host's tile loops) runs: fp32, double, other widths, older GPUs.
bool fused_attention_uses_tensor_cores(const FusedAttentionShape& s);

// From the forward's O and lse and dO [B*T, A_l]: dq, dk, dv [B*T, A_l] (overwritten); delta
// [B, heads_l, T] scratch (the rows' dO . O).
template <typename T>
void fused_attention_backward(const FusedAttentionShape& s, const T* q, const T* k, const T* v, const T* O,
                              const T* lse, const T* dO, T* delta, T* dq, T* dk, T* dv);

}  // namespace meshmoe
