#include "run/decode_bytes.hpp"

#include <algorithm>

#include "deck/shape_rules.hpp"

namespace meshmoe {

double decode_memory_bytes(const Config& cfg, int vocab, const DecodeShape& s) {
  const double M = cfg.model.d_model, V = vocab, L = cfg.model.num_layers;
  const double streams = std::max(s.streams, 1), hyps = std::max(s.hyps, 1);
  // Room per stream: the prompt and every hypothesis's tokens (the flat beam's interleaved stream,
  // decode/beam_search.hpp).
  const double capacity = double(std::max(s.prompt, 1)) + hyps * double(std::max(s.max_new, 1));
  // Keys and values of kv_heads heads (grouped-query attention: M kv_heads / num_heads wide).
  const double KV = M / double(cfg.model.num_heads) * double(kv_heads_of(cfg));
  const double kv_cache = L * 2 * streams * capacity * KV * sizeof(float);
  // Each live hypothesis keeps a 0/1 mask over its stream; the step's masks and the next beam's copies.
  const double masks = 3 * streams * hyps * capacity;
  // The widest step: the prefill of every prompt's tokens or one token per hypothesis.
  const double n = std::max(streams * hyps, streams * double(std::max(s.prompt, 1)));
  const double expert_h = cfg.moe.expert_d_ff > 0 ? cfg.moe.expert_d_ff : cfg.model.d_ff;
  const double H = std::max<double>(cfg.model.d_ff, expert_h * std::max<double>(1, double(cfg.moe.shared_experts))) *
                   (cfg.model.activation == Activation::Geglu ? 2 : 1);
  // Stream, queries, keys, values, attention output, LayerNorm and residual rows; the feed-forward's
  // hidden rows; an MoE step without a capacity limit may send every token to k experts.
  const double experts = cfg.moe.every > 0 ? std::max<double>(1, double(cfg.moe.top_k)) + 1 : 0;
  const double activations = n * (8 * M + 2 * H + experts * (M + H)) * sizeof(float);
  // Logits [n, V] and one source's candidates (hyps x V of 16 bytes) with its log-probabilities.
  const double logits = n * V * sizeof(float) + hyps * V * 16 + V * sizeof(double);
  return kv_cache + masks + activations + logits;
}

DecodeShape bleu_eval_shape(const Config& cfg) {
  const int T = int(cfg.model.seq_len);
  return {kBleuBatch, 1, std::min(kBleuMaxLen, T), T};
}

}  // namespace meshmoe
