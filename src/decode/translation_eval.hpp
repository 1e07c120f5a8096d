// Translation quality per language (docs/user-guide.md "Translation", `meshmoe eval` and eval.bleu_every): the
// validation pairs of each language as text, translated with a CachedModel, scored with corpus
// BLEU and chrF (src/score) per language and over all of them.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/dataset.hpp"
#include "data/tokenizer.hpp"
#include "decode/beam_search.hpp"
#include "decode/cached_model.hpp"
#include "mesh/comm.hpp"
#include "score/bleu.hpp"
#include "score/chrf.hpp"

namespace meshmoe {

// One language's validation pairs, line i of both lists being example i.
struct TextPairs {
  std::vector<std::string> sources, references;
};

// Per language of the dataset's table, its validation examples of per_language_sample
// (data/dataset.hpp; all when per_language is 0) as text, the way postprocess/valid_pairs.py writes
// them: the source is what lies between the language tag and the first SEP, the reference what
// follows the SEP (EOS dropped), each decoded with the tokenizer on one line (newlines become
// spaces). Examples without a SEP are left out (after the sample is drawn); throws InputError when
// no example has one (data from `prep text` has no translation pairs).
std::vector<TextPairs> validation_pairs(const Dataset& valid, const Tokenizer& tokenizer, int64_t per_language);

// The tokens a greedy translation of `pairs` runs through the model, each translation taken as long
// as its reference: per pair `<tag> source SEP` (the encoder's `<tag> source` and the decoder's BOS
// alike) and the reference with EOS, src + ref + 3 tokens (docs/user-guide.md "Training": the ETA
// counts translation scores not yet timed as these tokens' forwards).
int64_t translation_forward_tokens(const std::vector<TextPairs>& pairs, const Tokenizer& tokenizer);

struct TranslationScore {
  BleuStats bleu;
  ChrfStats chrf;
  int64_t sentences = 0;  // pairs translated and scored
  int64_t too_long = 0;   // of them, sources the model could not read whole (docs/user-guide.md "Translation")
  double seconds = 0;     // wall time of the translation, summed over its batches (each on its data group)
  TranslationScore& operator+=(const TranslationScore& o);
  double bleu_score() const;  // 0..100; NaN without a sentence
  double chrf_score() const;  // 0..100; NaN without a sentence
};

// Collective over the mesh: the languages `which` (indices into `pairs`, in order) translated with
// the beam (1: greedy) and scored. Their pairs go in batches of `batch` sources (a batch holds one
// language's) to translate_batches (decoder.hpp), which splits the batches over the data axis; the
// scores are every rank's and equal one rank's. Before each round of batches `stop()` (collective;
// 0 = go on) may end the work: its reason goes to *stopped and every language keeps sentences = 0.
// `done(l, score, translations)` is called on every rank for each language l, in order, as soon as
// its batches have arrived (progress lines, the translations' text).
std::vector<TranslationScore> translate_and_score(CachedModel<float>& cached, Comm& data, const Tokenizer& tokenizer,
                                                  const std::vector<TextPairs>& pairs, const std::vector<size_t>& which,
                                                  const BeamOptions& beam, int batch, const std::function<int()>& stop,
                                                  const std::function<void(size_t, const TranslationScore&, const std::vector<std::string>&)>& done,
                                                  int* stopped = nullptr);

}  // namespace meshmoe
