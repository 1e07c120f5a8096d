// What the decoding tests share: a tiny deck and the full forward's logits (the oracle of the
// cached decoding, tests/unit/test_decode*.cpp).
#pragma once
#include <string>
#include <vector>

#include "model/transformer.hpp"

namespace meshmoe::test {

// Two blocks, the second one's feed-forward `ffn`: "dense", or MoE with router "top1" (Switch) or
// "top2" (GShard). capacity_factor_eval = E: no choice is ever dropped in evaluation. Dropout and
// router jitter are set, to show that decoding leaves them off.
inline Config decode_config(const std::string& ffn) {
  Config c;
  c.model.seq_len = 16;
  c.model.d_model = 16;
  c.model.num_layers = 2;
  c.model.num_heads = 2;
  c.model.d_ff = 24;
  c.model.activation = Activation::Gelu;
  c.model.dropout = 0.1;
  c.moe.num_experts = 4;
  c.moe.every = ffn == "dense" ? 0 : 2;
  if (ffn != "dense") c.moe.router = parse_option<RouterKind>(ffn).value();
  c.moe.group_size = 1;  // any sequence length is whole groups (the references run odd ones)
  c.moe.capacity_factor_eval = 4;
  c.moe.jitter_eps = 0.01;
  return c;
}

// logits [rows * T, V] of the full forward (evaluation mode) of `rows` sequences of T tokens.
template <typename T>
std::vector<T> full_logits(Transformer<T>& model, const std::vector<int32_t>& tokens, int rows, int T_seq) {
  const std::vector<int32_t> targets(tokens.size(), 0);
  const std::vector<float> mask(tokens.size(), 0.f);
  StepContext ctx;
  ctx.training = false;
  model.forward(ctx, MicroBatch{rows, T_seq, tokens.data(), targets.data(), mask.data()}, LossWeights{});
  return std::vector<T>(model.logits().begin(), model.logits().end());
}

}  // namespace meshmoe::test
