// The bytes a decoding call allocates beyond the model (docs/user-guide.md "Translation", "Memory
// check"): the KV cache of every decoder block (beam x length per stream), the beam's visibility
// masks, the logits and the feed-forwards' buffers of the widest step. Below decode/ in the layer
// order, so that the training plan (run/memory.hpp) counts the decoding of its translation scores;
// decode/decode_memory.hpp checks a decoding command's against the node.
#pragma once
#include "deck/config.hpp"

namespace meshmoe {

struct DecodeShape {
  int streams = 1;   // sources (translate: --batch) or prompts (generate) decoded together
  int hyps = 1;      // hypotheses per stream (--beam; 1 for greedy and sampling)
  int max_new = 1;   // output tokens per hypothesis at most, already capped by model.seq_len
  int prompt = 1;    // tokens of the longest prompt, at most model.seq_len
};

// The translation scores during training (eval.bleu_every, Trainer::evaluate_bleu): greedy, kBleuBatch
// sources decoded together (the batches shared out over the data ranks; the scores depend on it only
// where capacity drops choices), outputs of at most kBleuMaxLen tokens (BeamOptions' default max_len,
// decode/beam_search.hpp), sources up to model.seq_len. The training plan counts their decoding
// (run/memory.hpp add_process_memory).
constexpr int kBleuBatch = 16;
constexpr int kBleuMaxLen = 64;
DecodeShape bleu_eval_shape(const Config& cfg);

// An upper bound of the bytes one rank allocates to decode `shape` with the model of `cfg` and
// vocabulary `vocab`: every decoder block counted on every rank and the attention unsharded, so
// that the bound holds on any mesh. In double: --beam 1e9 gives a large number, not an overflow.
double decode_memory_bytes(const Config& cfg, int vocab, const DecodeShape& shape);

}  // namespace meshmoe
