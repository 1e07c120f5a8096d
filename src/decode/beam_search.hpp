// Beam search over the KV cache as GShard's flat beam search (appendix A.1): the hypotheses of one
// source share one stream of the cache, their tokens interleaved in the order they were decoded,
// and each new token sees its prompt and its own ancestors only (a 0/1 mask per hypothesis). When
// hypotheses are pruned and expanded only those masks follow their parents: the cached keys and
// values never move.
//
// The rule, per source, at every step: the candidates are every live hypothesis extended by every
// token, ranked by the sum of log-probabilities (ties: the earlier hypothesis, then the lower token
// id); going down the best 2 K, a candidate ending in EOS becomes finished (while fewer than K are),
// any other becomes live, until K are live. The source is done when K hypotheses have finished or
// the output reached max_len tokens (the live ones then finish without EOS). The answer is the
// finished hypothesis of the best length-normalised score log P(Y) / lp(Y), GNMT's length penalty
// lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016, eq. 14, as GShard appendix A.1 cites it), |Y| the
// tokens generated, EOS included. Beam 1 is greedy decoding.
#pragma once
#include <cstdint>
#include <vector>

#include "decode/cached_model.hpp"

namespace meshmoe {

struct BeamOptions {
  int beam = 4;        // K
  double alpha = 0.6;  // length normalisation exponent (0: none)
  int max_len = 64;    // output tokens at most, EOS included (also bounded by model.seq_len)
};

struct Hypothesis {
  std::vector<int32_t> tokens;  // the output, EOS not included
  double log_prob = 0;          // sum of the log-probabilities of the output's tokens (EOS included)
  bool ended = false;           // finished with EOS (else stopped at max_len)
  double score = 0;             // log_prob / lp(|Y|)
};

// ((5 + length) / 6)^alpha
double length_penalty(int length, double alpha);

// The best hypothesis of each prompt. Encoder-decoder: the model's encode() has the sources, one
// per prompt, and each prompt is the decoder's start (BOS); the hypotheses of source b share its
// stream b, so they read its cross-attention keys and values (CachedModel).
template <typename T>
std::vector<Hypothesis> beam_search(CachedModel<T>& model, const std::vector<std::vector<int32_t>>& prompts,
                                    int32_t eos, const BeamOptions& opt);

}  // namespace meshmoe
