// The Transformer's decoder run one step at a time over a KV cache (docs/ARCHITECTURE.md
// "Decoding"): embed the new tokens at their positions, each block's attention appends their keys
// and values to its AttentionCache and attends over it, the feed-forwards (dense or MoE, evaluation
// mode: capacity_factor_eval, no jitter, no random routing, no dropout) run on the new tokens only,
// then the final LayerNorm and the head give the new tokens' logits.
//
// MoE routing groups: the n new tokens of a step on this rank are one group of n tokens
// (StepContext::moe_group_size), by default without a capacity limit (moe.decode_capacity =
// dropless); with moe.decode_capacity = eval, capacity ceil(k n capacity_factor_eval / E) at most
// n, a choice over capacity dropped as in training (the token keeps the residual only). The full
// forward groups moe.group_size consecutive tokens instead, so the two agree exactly when nothing
// is dropped in either (e.g. capacity_factor_eval >= E, or moe.dropless).
//
// The encoder-decoder (model.arch = "encdec"): encode() runs the encoder once over the sources
// (one row each, padded as the Batcher pads; bidirectional within the source; all the rows' tokens
// one routing group, the padding included) and keeps each decoder block's cross-attention keys
// and values of its output (CrossAttentionCache); stream s then decodes source s: step() runs the
// decoder blocks only, each with its cross-attention over the source of the token's stream between
// the self-attention and the feed-forward. The logits equal the full encdec forward's for the same
// (source, target prefix) under the same drop caveat.
//
// On a mesh the ranks that decode the same inputs (a data group: its tensor ranks and pipe stages)
// call step() together with the same tokens; `agree_logits`, when set, makes their logits one
// rank's (a broadcast), so that they all take the same decisions from them. Data groups decode
// their own inputs, yet an MoE all-to-all over the data axis needs every data rank in every call:
// `more_steps`, when set, keeps them stepping together (keep_stepping()), a rank without tokens
// left calling step() with none (docs/user-guide.md "The device mesh and parallelism", docs/ARCHITECTURE.md "Decoding").
//
// On a pipeline mesh (mesh.pipe > 1) every stage calls encode(), reset() and step() with the same
// arguments: a stage runs its own blocks, receives the previous stage's stream [n, M] and sends its
// own to the next (encode: the encoder's stream, as in training; step: the decoder's residual); the
// last stage's logits are broadcast over the pipe axis, so every stage returns them. encdec: the
// stages with decoder blocks keep their blocks' cross-attention caches; the encoder output reaches
// them along the stages as in training.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/attention_cache.hpp"
#include "model/cross_attention_cache.hpp"
#include "mesh/comm.hpp"
#include "model/transformer.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

template <typename T>
class CachedModel {
 public:
  // `pipe`: the pipe axis when the model is one stage of a pipeline (null: the whole model).
  explicit CachedModel(Transformer<T>& model, Comm* pipe = nullptr);

  // Room for `capacity` tokens in each of `streams` streams (none: a rank stepping with no tokens);
  // empties them all.
  void reset(int streams, int capacity);
  // encdec: the encoder over the sources (none empty, at most model.seq_len tokens each: `<lang>
  // source`, as the Batcher gives the encoder; no source at all on a rank that only keeps step);
  // stream s decodes sources[s]. reset() keeps them.
  void encode(const std::vector<std::vector<int32_t>>& sources);
  bool encdec() const { return model_.encdec(); }
  int sources() const { return sources_; }
  int vocab() const { return model_.shape().vocab; }
  int max_positions() const { return model_.shape().seq_len; }

  // tokens [tok.n] appended as `tok` says -> their logits [tok.n, V]. Index of token i in its
  // stream: where()[i].
  const Buffer<T>& step(const int32_t* tokens, const CachedTokens& tok);
  const std::vector<int32_t>& where() const { return where_; }
  // Each prompt (none empty) into its own stream b at positions 0, 1, ..., causal, in one step:
  // the logits of all their tokens; last_row[b] is the row of prompt b's last token. encdec: the
  // prompts are the decoder's starts (BOS ...), prompt b that of sources[b] (as many as encoded).
  const Buffer<T>& prefill(const std::vector<std::vector<int32_t>>& prompts, std::vector<int>& last_row);

  std::function<void(T*, size_t)> agree_logits;
  // Collective over the ranks that step together: whether any of them has tokens to step.
  std::function<bool(bool)> more_steps;
  // Whether the decoding loop steps again, given whether this rank has tokens (`mine`).
  bool keep_stepping(bool mine) const { return more_steps ? more_steps(mine) : mine; }
  bool lockstep() const { return bool(more_steps); }

 private:
  Transformer<T>& model_;
  Comm* pipe_ = nullptr;
  size_t first_decoder_block_ = 0;             // in model_.blocks(): encdec's encoder blocks come first
  std::vector<AttentionCache<T>> caches_;      // one per decoder block of this stage
  std::vector<CrossAttentionCache<T>> cross_;  // encdec: one per decoder block of this stage
  int sources_ = 0, capacity_ = 0;
  std::vector<int> length_;                    // [streams] tokens held (every stage, with or without caches)
  std::vector<int32_t> where_;                 // [n] index of each new token of the last step in its stream
  // The new tokens' places in their streams (where_, length_); throws as the caches would.
  void append(const CachedTokens& tok);
  // Pipeline: the previous stage's stream into `x` / this stage's to the next (no-ops at the ends).
  void receive(Buffer<T>& x, size_t n, int tag);
  void pass_on(const Buffer<T>& x, size_t n, int tag);
  Buffer<T> x_, h_, f_, logits_;               // [n, M] and [n, V]
  Buffer<T> enc_, enc_in_;                     // encdec: the sources' encoder output [source tokens, M];
                                               // the stream a later stage receives [rows * len, M]
  Buffer<int32_t> tokens_, positions_;         // [n]
};

}  // namespace meshmoe
