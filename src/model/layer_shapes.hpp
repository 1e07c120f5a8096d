// The shapes of each layer's parameters, stated once (docs/ARCHITECTURE.md "The shape table"): a
// layer's `declare` registers exactly these entries, and the shape table (model/shape_table.hpp)
// lists them for the memory plan, so the two cannot disagree. Letters follow the legend
// (docs/ARCHITECTURE.md); a trailing _l is this rank's share of a letter.
//
// Each layer's local sizes come in one struct (AttentionShape, FfnShape, ExpertShape) made from the
// global sizes and this rank's block of the split axis (Split); the deck's divisibility rules
// (shape_table.hpp) guarantee the blocks are equal.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/sizes.hpp"
#include "model/activation.hpp"
#include "model/params.hpp"

namespace meshmoe {

// Units [offset, offset + local) of a dimension of n units split evenly over `ranks` ranks.
struct Split {
  int offset = 0, local = 0;
};
inline Split split_evenly(int n, int rank, int ranks) {
  if (ranks < 1 || n % ranks != 0 || rank < 0 || rank >= ranks)
    throw std::logic_error("split_evenly: " + std::to_string(n) + " units over " + std::to_string(ranks) + " ranks");
  return {rank * (n / ranks), n / ranks};
}
inline Split whole(int n) { return {0, n}; }

// Causal self-attention (attention.hpp): heads [head0, head0 + heads_l) of `heads`, each D = M / heads
// wide; A_l = heads_l x D columns of q. Grouped-query attention (model.kv_heads): query head h reads
// key/value head h / (heads / kv_heads); this rank's k and v projections hold key/value heads
// [kv0, kv0 + kv_heads_l), KV_l = kv_heads_l x D columns: the key/value heads of its query heads when
// the tensor axis splits them (kv_heads_l = heads_l / group), all kv_heads when it does not (fewer
// key/value heads than tensor ranks: replicated, their gradients summed over tensor; Megatron-Core's
// choice). With kv_heads = heads, k and v are q's shape.
struct AttentionShape {
  int M = 0, heads = 0, D = 0, head0 = 0, heads_l = 0, A_l = 0;
  int kv_heads = 0, kv0 = 0, kv_heads_l = 0, KV_l = 0;
  bool sharded() const { return heads_l != heads; }
  bool grouped() const { return kv_heads != heads; }                // query heads share key/value heads
  bool kv_sharded() const { return kv_heads_l != kv_heads; }        // key/value heads split over tensor
  bool kv_replicated() const { return sharded() && !kv_sharded(); }  // the whole k, v on each tensor rank
  int group() const { return heads / kv_heads; }                   // query heads per key/value head
};
// kv_heads 0: heads (multi-head attention).
inline AttentionShape attention_shape(int M, int heads, Split h, int kv_heads = 0) {
  if (heads < 1 || M % heads != 0)
    throw InputError("model.d_model = " + std::to_string(M) + " must be divisible by model.num_heads = " +
                     std::to_string(heads));
  if (kv_heads == 0) kv_heads = heads;
  if (kv_heads < 1 || kv_heads > heads || heads % kv_heads != 0)
    throw InputError("model.kv_heads = " + std::to_string(kv_heads) + " must divide model.num_heads = " +
                     std::to_string(heads));
  if (h.offset < 0 || h.local < 1 || h.offset + h.local > heads)
    throw std::logic_error("CausalSelfAttention: head block out of range");
  AttentionShape s;
  s.M = M, s.heads = heads, s.D = M / heads, s.head0 = h.offset, s.heads_l = h.local, s.A_l = h.local * s.D;
  s.kv_heads = kv_heads;
  const int group = heads / kv_heads;
  if (h.local % group == 0 && h.offset % group == 0) s.kv0 = h.offset / group, s.kv_heads_l = h.local / group;
  else s.kv0 = 0, s.kv_heads_l = kv_heads;
  s.KV_l = s.kv_heads_l * s.D;
  return s;
}

// Feed-forward (dense mlp.hpp, or one expert of experts.hpp): hidden units [h0, h0 + H_l) of H;
// W_l = the width of its input projection's output (H_l, or 2 H_l for geglu and swiglu).
struct FfnShape {
  int M = 0, H = 0, h0 = 0, H_l = 0, W_l = 0;
  Activation act = Activation::Relu;
  bool sharded() const { return H_l != H; }
};
inline FfnShape ffn_shape(int M, int H, Activation act, Split h) {
  if (h.offset < 0 || h.local < 1 || h.offset + h.local > H) throw std::logic_error("feed-forward: hidden block out of range");
  FfnShape s;
  s.M = M, s.H = H, s.h0 = h.offset, s.H_l = h.local, s.W_l = activation_in_width(act, h.local), s.act = act;
  return s;
}

// The experts of an MoE layer (experts.hpp): experts [e0, e0 + E_l) of E, each a feed-forward
// `ffn`; sharded_over: the ShardAxes bits of their weights.
struct ExpertShape {
  int E = 0, e0 = 0, E_l = 0;
  FfnShape ffn;
  uint8_t sharded_over = kShardNone;
};

// An unsharded entry: local block = logical shape.
inline ParamInfo param_entry(std::string name, std::vector<int64_t> shape, InitKind init, double fan_in) {
  const std::vector<int64_t> zeros(shape.size(), 0);
  return param_entry(std::move(name), shape, shape, zeros, init, fan_in);
}

// prefix.wte [V, M], and with learned positions prefix.wpe [T, M] (truncated normal, fan_in M);
// model.position = rope has no position table (rope.hpp).
inline std::vector<ParamInfo> embedding_params(const std::string& prefix, int64_t V, int64_t T, int64_t M,
                                               bool learned_positions = true) {
  std::vector<ParamInfo> out = {param_entry(prefix + ".wte", {V, M}, InitKind::TruncNormal, double(M))};
  if (learned_positions) out.push_back(param_entry(prefix + ".wpe", {T, M}, InitKind::TruncNormal, double(M)));
  return out;
}

// The untied output projection prefix.wout [V, M] (fan_in M).
inline std::vector<ParamInfo> head_params(const std::string& prefix, int64_t V, int64_t M) {
  return {param_entry(prefix + ".wout", {V, M}, InitKind::TruncNormal, double(M))};
}

// prefix.gain [M] (ones), and for layernorm prefix.bias [M] (zeros; rmsnorm has none); neither gets
// weight decay.
inline std::vector<ParamInfo> norm_params(const std::string& prefix, int64_t M, NormKind kind) {
  std::vector<ParamInfo> out = {param_entry(prefix + ".gain", {M}, InitKind::Ones, 1)};
  if (kind == NormKind::LayerNorm) out.push_back(param_entry(prefix + ".bias", {M}, InitKind::Zeros, 1));
  for (ParamInfo& p : out) p.no_weight_decay = true;
  return out;
}

// prefix.wq [M, M] with block [M, A_l] at column head0 x D; prefix.wk, .wv [M, kv_heads x D] with
// block [M, KV_l] at column kv0 x D (replicated when the tensor axis does not split the key/value
// heads); prefix.wo [M, M] with block [A_l, M] at row head0 x D (fan_in M).
inline std::vector<ParamInfo> attention_params(const std::string& prefix, const AttentionShape& s) {
  const int64_t M = s.M, A_l = s.A_l, off = int64_t(s.head0) * s.D;
  const int64_t KV = int64_t(s.kv_heads) * s.D, KV_l = s.KV_l, kv_off = int64_t(s.kv0) * s.D;
  const uint8_t shard = s.sharded() ? kShardTensor : kShardNone;
  const uint8_t kv_shard = s.kv_sharded() ? kShardTensor : kShardNone;
  std::vector<ParamInfo> out;
  out.push_back(param_entry(prefix + ".wq", {M, M}, {M, A_l}, {0, off}, InitKind::TruncNormal, double(M), shard));
  for (const char* name : {".wk", ".wv"})
    out.push_back(param_entry(prefix + name, {M, KV}, {M, KV_l}, {0, kv_off}, InitKind::TruncNormal, double(M), kv_shard));
  out.push_back(param_entry(prefix + ".wo", {M, M}, {A_l, M}, {off, 0}, InitKind::TruncNormal, double(M), shard));
  return out;
}

// E experts of the feed-forward s stacked in front (E = 0: one dense feed-forward, no leading
// dimension): prefix.w_in [E, M, H] or, geglu and swiglu, [E, M, 2, H] (the bytes of [E, M, 2H]: mlp.hpp), fan_in
// M; prefix.w_out [E, H, M], fan_in H; this rank's block is experts [e0, e0 + E_l), hidden units
// [h0, h0 + H_l).
inline std::vector<ParamInfo> ffn_params(const std::string& prefix, const FfnShape& s, int E, int e0, int E_l,
                                         uint8_t sharded_over) {
  const int64_t M = s.M, H = s.H, H_l = s.H_l, h0 = s.h0;
  std::vector<int64_t> in_logical = {M, H}, in_local = {M, H_l}, in_offset = {0, h0};
  if (activation_gated(s.act)) in_logical = {M, 2, H}, in_local = {M, 2, H_l}, in_offset = {0, 0, h0};
  std::vector<int64_t> out_logical = {H, M}, out_local = {H_l, M}, out_offset = {h0, 0};
  if (E > 0) {
    for (auto* v : {&in_logical, &out_logical}) v->insert(v->begin(), E);
    for (auto* v : {&in_local, &out_local}) v->insert(v->begin(), E_l);
    for (auto* v : {&in_offset, &out_offset}) v->insert(v->begin(), e0);
  }
  return {param_entry(prefix + ".w_in", in_logical, in_local, in_offset, InitKind::TruncNormal, double(M), sharded_over),
          param_entry(prefix + ".w_out", out_logical, out_local, out_offset, InitKind::TruncNormal, double(H),
                      sharded_over)};
}
// The dense feed-forward (mlp.hpp): hidden units split over tensor when sharded.
inline std::vector<ParamInfo> mlp_params(const std::string& prefix, const FfnShape& s) {
  return ffn_params(prefix, s, 0, 0, 0, s.sharded() ? kShardTensor : kShardNone);
}
inline std::vector<ParamInfo> expert_params(const std::string& prefix, const ExpertShape& s) {
  return ffn_params(prefix, s.ffn, s.E, s.e0, s.E_l, s.sharded_over);
}

// The shared experts of an MoE layer (moe_layer.hpp): n experts of width H as one feed-forward of
// hidden width n H (`s`, hidden units split over tensor like the dense one); hidden unit i H + j is
// unit j of shared expert i. w_out's fan-in is one expert's width H, so that the weights initialise
// as n separate experts of width H would.
inline std::vector<ParamInfo> shared_expert_params(const std::string& prefix, const FfnShape& s, int expert_H) {
  std::vector<ParamInfo> out = mlp_params(prefix, s);
  out[1].fan_in = double(expert_H);
  return out;
}

// The router's prefix.wg [M, E] (fan_in M), replicated.
inline std::vector<ParamInfo> router_params(const std::string& prefix, int64_t M, int64_t E) {
  return {param_entry(prefix + ".wg", {M, E}, InitKind::TruncNormal, double(M))};
}

// Registers `entries` in order, entry i bound to views[i].
template <typename T>
void declare_params(ParamStore<T>& store, const std::vector<ParamInfo>& entries,
                    std::initializer_list<ParamView<T>*> views) {
  if (entries.size() != views.size()) throw std::logic_error("declare_params: one view per entry");
  auto view = views.begin();
  for (const ParamInfo& e : entries) store.add(e, *view++);
}

}  // namespace meshmoe
