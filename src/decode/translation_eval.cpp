#include "decode/translation_eval.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "decode/decoder.hpp"

namespace meshmoe {

int64_t translation_forward_tokens(const std::vector<TextPairs>& pairs, const Tokenizer& tokenizer) {
  int64_t tokens = 0;
  std::vector<int32_t> ids;
  for (const TextPairs& p : pairs)
    for (size_t i = 0; i < p.sources.size(); ++i) {
      ids.clear();
      tokenizer.encode(p.sources[i], ids);
      tokenizer.encode(p.references[i], ids);
      tokens += int64_t(ids.size()) + 3;
    }
  return tokens;
}

std::vector<TextPairs> validation_pairs(const Dataset& valid, const Tokenizer& tokenizer, int64_t per_language) {
  const DataSplit& s = valid.split();
  const int32_t sep = int32_t(valid.info().sep_id), eos = int32_t(valid.info().eos_id);
  std::vector<TextPairs> out(valid.info().languages.size());
  bool any = false;
  for (const size_t e : per_language_sample(s, out.size(), per_language)) {
    const int32_t lang = s.lang[e];
    if (lang < 0 || size_t(lang) >= out.size()) continue;
    TextPairs& p = out[size_t(lang)];
    std::vector<int32_t> ids(s.example_size(e));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(s.token(s.example_begin(e) + i));
    const auto at = std::find(ids.begin(), ids.end(), sep);
    if (ids.empty() || at == ids.end()) continue;
    auto end = ids.end();
    if (end - 1 > at && *(end - 1) == eos) --end;
    p.sources.push_back(one_line(tokenizer, std::vector<int32_t>(ids.begin() + 1, at)));
    p.references.push_back(one_line(tokenizer, std::vector<int32_t>(at + 1, end)));
    any = true;
  }
  if (!any)
    throw InputError(valid.path() + ": no validation example holds a SEP token, so there is no (source, reference) pair "
                     "to translate (a dataset of `meshmoe prep text`?): translation scores need `meshmoe prep gettext` data");
  return out;
}

TranslationScore& TranslationScore::operator+=(const TranslationScore& o) {
  bleu += o.bleu;
  chrf += o.chrf;
  sentences += o.sentences;
  too_long += o.too_long;
  seconds += o.seconds;
  return *this;
}

double TranslationScore::bleu_score() const { return sentences > 0 ? meshmoe::bleu_score(bleu).score : std::nan(""); }
double TranslationScore::chrf_score() const { return sentences > 0 ? meshmoe::chrf_score(chrf) : std::nan(""); }

std::vector<TranslationScore> translate_and_score(
    CachedModel<float>& cached, Comm& data, const Tokenizer& tokenizer, const std::vector<TextPairs>& pairs,
    const std::vector<size_t>& which, const BeamOptions& beam, int batch, const std::function<int()>& stop,
    const std::function<void(size_t, const TranslationScore&, const std::vector<std::string>&)>& done, int* stopped) {
  std::vector<LineBatch> work;
  std::vector<size_t> end_batch;  // [which.size()] one past the last batch of each language
  for (size_t l : which) {
    const int32_t tag = tokenizer.lang_token(tokenizer.languages()[l]);
    for (const LineBatch& b : line_batches(tag, pairs[l].sources, batch)) work.push_back(b);
    end_batch.push_back(work.size());
  }
  std::vector<TranslationScore> out(pairs.size());
  std::vector<BatchTranslation> got(work.size());
  size_t next = 0;  // the next language of `which` to score
  // The languages whose batches all arrived (`arrived` of them), scored in order.
  const auto score_ready = [&](size_t arrived) {
    for (; next < which.size() && end_batch[next] <= arrived; ++next) {
      const size_t l = which[next];
      TranslationScore& s = out[l];
      std::vector<std::string> hyp;
      for (size_t b = next == 0 ? 0 : end_batch[next - 1]; b < end_batch[next]; ++b) {
        for (size_t i = 0; i < got[b].text.size(); ++i) {
          hyp.push_back(got[b].text[i]);
          s.too_long += got[b].too_long[i] > 0;
        }
        s.seconds += got[b].seconds;
      }
      for (size_t i = 0; i < hyp.size(); ++i) {
        s.bleu.add(hyp[i], pairs[l].references[i]);
        s.chrf.add(hyp[i], pairs[l].references[i]);
      }
      s.sentences = int64_t(hyp.size());
      if (done) done(l, s, hyp);
    }
  };
  score_ready(0);  // languages without a pair
  int why = 0;
  translate_batches(
      cached, data, tokenizer, work, beam, stop,
      [&](size_t b, const BatchTranslation& t) {
        got[b] = t;
        score_ready(b + 1);
      },
      &why);
  if (why) {
    if (stopped) *stopped = why;
    return std::vector<TranslationScore>(pairs.size());
  }
  return out;
}

}  // namespace meshmoe
