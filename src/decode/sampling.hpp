// Continuations of prompts by a decoder LM (meshmoe generate): greedy, or sampled with a
// temperature, top-k and top-p (nucleus) filtering, seeded. Every sampled token is drawn with a
// Philox number keyed by (seed, decoding step, prompt index) (src/core/philox.hpp), so the same
// seed gives the same text on any mesh and in any batch.
#pragma once
#include <cstdint>
#include <vector>

#include "decode/cached_model.hpp"

namespace meshmoe {

struct SamplingOptions {
  int max_new = 64;          // tokens generated at most (also bounded by model.seq_len)
  double temperature = 0;    // 0: greedy (argmax, ties to the lower id)
  int top_k = 0;             // keep the k most likely tokens; 0: all
  double top_p = 1;          // then the smallest most-likely set of probability >= top_p
  uint64_t seed = 0;
};

// The token chosen from one row of logits [V], `u` uniform in [0, 1). Temperature 0: the argmax.
// Else the tokens sorted by logit (ties to the lower id), cut to the top k, then to the top-p
// prefix, and the token where u falls in their renormalised cumulative probabilities.
template <typename T>
int32_t choose_token(const T* logits, int V, const SamplingOptions& opt, double u);

// The continuation of each prompt (EOS not included) until EOS, opt.max_new tokens, or the
// position model.seq_len (the last token is never fed back, as in beam_search). `first_index` is the index of prompts[0] among all the prompts of the
// run (keys the random numbers). Encoder-decoder: as beam_search (the sources encoded first).
template <typename T>
std::vector<std::vector<int32_t>> generate(CachedModel<T>& model, const std::vector<std::vector<int32_t>>& prompts,
                                           int32_t eos, const SamplingOptions& opt, uint64_t first_index = 0);

}  // namespace meshmoe
