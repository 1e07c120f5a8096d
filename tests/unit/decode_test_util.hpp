// What the decoding tests share: a tiny deck and the full forward's logits (the oracle of the
// cached decoding, tests/unit/test_decode*.cpp).
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "model/transformer.hpp"

namespace meshmoe::test {

// Two blocks, the second one's feed-forward `ffn`: "dense", or MoE with router "top1" (Switch) or
// "top2" (GShard). capacity_factor_eval = E: no choice is ever dropped in evaluation. Dropout and
// router jitter are set, to show that decoding leaves them off.
// ffn: dense, top1, top2, ...; a "+blocks" suffix adds the blocks of today's MoE models
// (docs/ARCHITECTURE.md "Blocks"): RMSNorm, rotary positions, SwiGLU, the first block dense; then
// "+gqa" 4 query heads over 2 key/value heads, "+mqa" over 1 (model.kv_heads).
inline Config decode_config(const std::string& ffn_and_blocks) {
  const size_t plus = ffn_and_blocks.find("+blocks");
  const std::string ffn = ffn_and_blocks.substr(0, plus);
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
  if (plus != std::string::npos) {
    c.model.norm = NormKind::RmsNorm;
    c.model.position = PositionKind::Rope;
    c.model.rope_base = 100;  // angles that turn visibly over 16 positions
    c.model.activation = Activation::Swiglu;
    c.moe.every = ffn == "dense" ? 0 : 1;
    c.moe.first_dense = 1;
  }
  if (ffn_and_blocks.find("+gqa") != std::string::npos) c.model.num_heads = 4, c.model.kv_heads = 2;
  if (ffn_and_blocks.find("+mqa") != std::string::npos) c.model.num_heads = 4, c.model.kv_heads = 1;
  return c;
}

// decode_config's blocks as an encoder-decoder: two encoder blocks, then two decoder blocks.
inline Config encdec_decode_config(const std::string& ffn) {
  Config c = decode_config(ffn);
  c.model.arch = ModelArch::EncDec;
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

// The full encdec forward (evaluation mode) of row b: sources[b] into the encoder, decoder_inputs[b]
// (BOS target prefix) into the decoder, both padded to the longest of all as the Batcher pads (the
// padding a segment of its own) -> logits [rows * T, V]; T_out = T, row b's token t at b * T + t.
template <typename T>
std::vector<T> full_encdec_logits(Transformer<T>& model, const std::vector<std::vector<int32_t>>& sources,
                                  const std::vector<std::vector<int32_t>>& decoder_inputs, int& T_out) {
  const int rows = int(sources.size());
  int T_seq = 1;
  for (int b = 0; b < rows; ++b)
    T_seq = std::max({T_seq, int(sources[size_t(b)].size()), int(decoder_inputs[size_t(b)].size())});
  const size_t N = size_t(rows) * T_seq;
  std::vector<int32_t> enc(N, 0), enc_seg(N), enc_pos(N), dec(N, 0), dec_seg(N), dec_pos(N), targets(N, 0);
  auto pack = [&](const std::vector<int32_t>& seq, size_t row, std::vector<int32_t>& tok, std::vector<int32_t>& seg,
                  std::vector<int32_t>& pos) {
    for (int t = 0; t < T_seq; ++t) {
      const bool in = t < int(seq.size());
      tok[row + size_t(t)] = in ? seq[size_t(t)] : 0;
      seg[row + size_t(t)] = in ? 0 : 1;
      pos[row + size_t(t)] = in ? t : t - int(seq.size());
    }
  };
  for (int b = 0; b < rows; ++b) {
    pack(sources[size_t(b)], size_t(b) * T_seq, enc, enc_seg, enc_pos);
    pack(decoder_inputs[size_t(b)], size_t(b) * T_seq, dec, dec_seg, dec_pos);
  }
  const std::vector<float> mask(N, 0.f);
  MicroBatch mb{rows, T_seq, dec.data(), targets.data(), mask.data(), dec_seg.data(), dec_pos.data()};
  mb.enc_len = T_seq;
  mb.enc_inputs = enc.data();
  mb.enc_segment = enc_seg.data();
  mb.enc_position = enc_pos.data();
  StepContext ctx;
  ctx.training = false;
  model.forward(ctx, mb, LossWeights{});
  T_out = T_seq;
  return std::vector<T>(model.logits().begin(), model.logits().end());
}

}  // namespace meshmoe::test
