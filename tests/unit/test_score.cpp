// Translation scores: SacreBLEU's 13a tokenisation, corpus BLEU, chrF. Oracles: values worked out
// by hand here (counts exact, scores from their formula), and one published SacreBLEU chrF value.
// tests/scripts/score_vs_nltk.sh compares random corpora with NLTK and a Python 13a tokeniser.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "data/dataset.hpp"
#include "decode/translation_eval.hpp"
#include "score/bleu.hpp"
#include "score/chrf.hpp"
#include "score/text.hpp"

using namespace meshmoe;

namespace {

BleuScore bleu_of(const std::vector<std::pair<std::string, std::string>>& pairs, BleuStats* out = nullptr) {
  BleuStats s;
  for (const auto& [h, r] : pairs) s.add(h, r);
  if (out) *out = s;
  return bleu_score(s);
}

}  // namespace

TEST_CASE("13a tokenisation splits as mteval-v13a", "[score]") {
  CHECK(tokenize_13a_text("Hello, world!") == "Hello , world !");
  // Periods, commas and dashes stay inside numbers; an apostrophe and a word-internal dash stay.
  CHECK(tokenize_13a_text("It's 3.14 and 1,000 items, e-mail 2-3.") == "It's 3.14 and 1,000 items , e-mail 2 - 3 .");
  CHECK(tokenize_13a_text("end.") == "end .");
  CHECK(tokenize_13a_text(".5 and 5.") == ". 5 and 5 .");  // a number's leading period is split off
  // Entities unescaped in order (&amp;lt; becomes <), <skipped> dropped, symbols split.
  CHECK(tokenize_13a_text("&quot;a&quot; &amp;lt;b&gt; x<skipped>y") == "\" a \" < b > xy");
  CHECK(tokenize_13a_text("a/b (c) [d] {e} $5 @x #1 ~") == "a / b ( c ) [ d ] { e } $ 5 @ x # 1 ~");
  // Unicode whitespace separates (no-break space, ideographic space); other letters are letters.
  CHECK(tokenize_13a_text("caf\u00e9\u00a0na\u00efve\u3000\u4e2d\u6587.") == "caf\u00e9 na\u00efve \u4e2d\u6587 .");
  CHECK(tokenize_13a_text("  \t ").empty());
  CHECK(tokenize_13a("").empty());
}

TEST_CASE("corpus BLEU against hand-computed statistics", "[score]") {
  SECTION("clipped n-gram matches, geometric mean") {
    BleuStats s;
    const BleuScore b = bleu_of({{"The relationship between Obama and Netanyahu is not exactly friendly.",
                                  "The ties between Obama and Netanyahu are not particularly friendly."}},
                                &s);
    CHECK(s.matches == std::array<int64_t, 4>{8, 4, 2, 1});
    CHECK(s.totals == std::array<int64_t, 4>{11, 10, 9, 8});
    CHECK(s.hyp_len == 11);
    CHECK(s.ref_len == 11);
    CHECK(b.brevity_penalty == 1.0);
    const double expect = 100 * std::pow(8.0 / 11 * 4.0 / 10 * 2.0 / 9 * 1.0 / 8, 0.25);
    CHECK(b.score == Approx(expect).epsilon(1e-13));
  }
  SECTION("clipping: a repeated word counts at most as often as in the reference") {
    BleuStats s;
    bleu_of({{"the the the the the the the", "the cat is on the mat"}}, &s);
    CHECK(s.matches[0] == 2);
    CHECK(s.totals[0] == 7);
  }
  SECTION("exp smoothing: the k-th order without a match counts 1 / 2^k") {
    BleuStats s;
    const BleuScore b = bleu_of({{"a b c d", "a b x d"}}, &s);
    CHECK(s.matches == std::array<int64_t, 4>{3, 1, 0, 0});
    CHECK(b.precisions[2] == Approx(100.0 / (2 * 2)).epsilon(1e-15));
    CHECK(b.precisions[3] == Approx(100.0 / (4 * 1)).epsilon(1e-15));
    CHECK(b.score == Approx(100 * std::pow(0.75 * (1.0 / 3) * 0.25 * 0.25, 0.25)).epsilon(1e-13));
  }
  SECTION("brevity penalty from the corpus lengths") {
    const BleuScore b = bleu_of({{"a b c d e", "a b c d e f g h"}, {"x y z w", "x y z w"}});
    CHECK(b.brevity_penalty == Approx(std::exp(1.0 - 12.0 / 9.0)).epsilon(1e-15));
    // Every n-gram of the hypotheses matches: the score is the penalty.
    CHECK(b.score == Approx(100 * b.brevity_penalty).epsilon(1e-13));
  }
  SECTION("degenerate corpora score 0") {
    CHECK(bleu_of({{"p q r s t", "a b c d e"}}).score == 0.0);  // no n-gram matches
    CHECK(bleu_of({{"", "a b c"}}).score == 0.0);                // empty translation
    CHECK(bleu_of({{"a b", "a b"}}).score == 0.0);               // no 3-grams to count: precision 0
    CHECK(bleu_of({{"a b c d", "a b c d"}}).score == Approx(100).epsilon(1e-14));
  }
  SECTION("statistics add over sentences") {
    const std::vector<std::pair<std::string, std::string>> pairs = {
        {"the cat sat on the mat .", "the cat sat on a mat ."}, {"a dog , 3.5 kg", "one dog of 3.5 kg"}, {"yes", "no"}};
    BleuStats all, sum;
    bleu_of(pairs, &all);
    for (const auto& p : pairs) {
      BleuStats one;
      one.add(p.first, p.second);
      sum += one;
    }
    CHECK(sum.matches == all.matches);
    CHECK(sum.totals == all.totals);
    CHECK(sum.hyp_len == all.hyp_len);
    CHECK(sum.ref_len == all.ref_len);
  }
}

TEST_CASE("chrF: character n-grams without whitespace, averaged precision and recall, beta 2", "[score]") {
  auto chrf = [](const std::string& h, const std::string& r, ChrfStats* out = nullptr) {
    ChrfStats s;
    s.add(h, r);
    if (out) *out = s;
    return chrf_score(s);
  };
  // SacreBLEU's documented value for this pair (chrF2, orders 1-6).
  CHECK(chrf("The relationship between Obama and Netanyahu is not exactly friendly.",
             "The ties between Obama and Netanyahu are not particularly friendly.") ==
        Approx(61.576379378113785).epsilon(1e-13));
  CHECK(chrf("a cat", "a cat") == Approx(100).epsilon(1e-15));
  CHECK(chrf("a  c\ta t", "ac\u00a0at") == Approx(100).epsilon(1e-15));  // whitespace does not count
  CHECK(chrf("xyz", "abc") == 0.0);
  CHECK(chrf("", "abc") == 0.0);
  SECTION("hand count: 'ab' against 'abc'") {
    ChrfStats s;
    const double score = chrf("ab", "abc", &s);
    CHECK(s.hyp == std::array<int64_t, 6>{2, 1, 0, 0, 0, 0});
    CHECK(s.ref == std::array<int64_t, 6>{3, 2, 1, 0, 0, 0});
    CHECK(s.matches == std::array<int64_t, 6>{2, 1, 0, 0, 0, 0});
    // Orders 1 and 2 have n-grams on both sides: P = (1 + 1) / 2, R = (2/3 + 1/2) / 2.
    const double p = 1.0, r = (2.0 / 3 + 0.5) / 2;
    CHECK(score == Approx(100 * 5 * p * r / (4 * p + r)).epsilon(1e-14));
  }
  SECTION("characters are code points") {
    ChrfStats s;
    chrf("\u00e9t\u00e9", "\u00e9t\u00e9", &s);
    CHECK(s.hyp[0] == 3);
    CHECK(s.matches[2] == 1);
  }
  SECTION("corpus statistics are the sums of the sentences'") {
    ChrfStats a, b, both;
    a.add("the cat", "a cat");
    b.add("dogs bark", "the dog barks");
    both.add("the cat", "a cat");
    both.add("dogs bark", "the dog barks");
    a += b;
    CHECK(a.hyp == both.hyp);
    CHECK(a.ref == both.ref);
    CHECK(a.matches == both.matches);
  }
}

TEST_CASE("UTF-8 decoding keeps stray bytes", "[score]") {
  CHECK(utf8_to_code_points("a\u00e9\u4e2d\U0001F600") == U"a\u00e9\u4e2d\U0001F600");
  CHECK(utf8_to_code_points(std::string("a\xff" "b\xc3", 4) ) == std::u32string{U'a', 0xFF, U'b', 0xC3});
  CHECK(code_points_to_utf8(U"a\u00e9\u4e2d\U0001F600") == "a\u00e9\u4e2d\U0001F600");
}

namespace {

// One example `<tag> source SEP target [EOS]` of language `lang` (byte tokens), or without a SEP.
void add_pair(DataSplit& s, int32_t lang, const std::string& source, const std::string& target, bool sep = true,
              bool eos = true) {
  std::vector<int32_t> ids{Tokenizer::kFirstLang + lang};
  for (unsigned char c : source) ids.push_back(c);
  if (sep) ids.push_back(Tokenizer::kSep);
  for (unsigned char c : target) ids.push_back(c);
  if (eos) ids.push_back(Tokenizer::kEos);
  s.add_example(ids, std::vector<uint8_t>(ids.size(), 1), lang);
}

Dataset pairs_dataset(const DataSplit& s) {
  DatasetInfo info;
  info.languages = {"de", "fr", "sv"};
  info.vocab_size = 263;
  info.train_pairs = {0, 0, 0};
  info.valid_pairs = {0, 0, 0};
  return Dataset::from_memory(info, s);
}

}  // namespace

TEST_CASE("validation pairs as text: source between tag and SEP, reference after it", "[score][decode]") {
  DataSplit s;
  add_pair(s, 0, "Datei 1 kopiert", "copied file 1");
  add_pair(s, 1, "fichier\n2", "copied\rfile 2");  // newlines become spaces, as valid_pairs.py writes them
  add_pair(s, 0, "kein Paar", "", false);           // no SEP: left out
  add_pair(s, 0, "Ordner 3", "folder 3", true, false);  // no EOS: the reference runs to the end
  add_pair(s, 0, "Datei 4", "file 4");
  const Dataset d = pairs_dataset(s);
  const Tokenizer tok = d.info().tokenizer_object();
  const std::vector<TextPairs> all = validation_pairs(d, tok, 0);
  REQUIRE(all.size() == 3);
  CHECK(all[0].sources == std::vector<std::string>{"Datei 1 kopiert", "Ordner 3", "Datei 4"});
  CHECK(all[0].references == std::vector<std::string>{"copied file 1", "folder 3", "file 4"});
  CHECK(all[1].sources == std::vector<std::string>{"fichier 2"});
  CHECK(all[1].references == std::vector<std::string>{"copied file 2"});
  CHECK(all[2].sources.empty());
  // The ETA's tokens of translating them (bytes, by hand): src + ref + 3 (tag, SEP, EOS) a pair:
  // 15 + 13, 8 + 8, 7 + 6 and 9 + 13, and 4 x 3.
  CHECK(translation_forward_tokens(all, tok) == 91);
  // Two of each language: per_language_sample's, drawn before the pairs without SEP are left out.
  // Language 0's four examples rank 3, 1, 2, 0 by mix64(position): positions 1 (no SEP) and 3.
  const std::vector<TextPairs> two = validation_pairs(d, tok, 2);
  CHECK(two[0].sources == std::vector<std::string>{"Datei 4"});
  CHECK(two[0].references == std::vector<std::string>{"file 4"});
  CHECK(two[1].sources.size() == 1);

  DataSplit text;  // `prep text` data: no pair at all
  add_pair(text, 0, "some text", "", false);
  CHECK_THROWS_AS(validation_pairs(pairs_dataset(text), tok, 0), InputError);
}

TEST_CASE("translation scores add over languages like one corpus", "[score][decode]") {
  const std::vector<std::pair<std::string, std::string>> de{{"the cat sat on the mat", "the cat sat on a mat"},
                                                            {"a dog", "the dog barks"}},
      fr{{"hello world again", "hello world"}};
  TranslationScore a, b, none;
  for (const auto& [h, r] : de) a.bleu.add(h, r), a.chrf.add(h, r);
  for (const auto& [h, r] : fr) b.bleu.add(h, r), b.chrf.add(h, r);
  a.sentences = 2, b.sentences = 1;
  CHECK(std::isnan(none.bleu_score()));
  CHECK(std::isnan(none.chrf_score()));
  TranslationScore sum = a;
  sum += b;
  BleuStats corpus;
  ChrfStats chrf;
  for (const auto* part : {&de, &fr})
    for (const auto& [h, r] : *part) corpus.add(h, r), chrf.add(h, r);
  CHECK(sum.sentences == 3);
  CHECK(sum.bleu_score() == bleu_score(corpus).score);
  CHECK(sum.chrf_score() == chrf_score(chrf));
  CHECK(a.bleu_score() == bleu_of(de).score);
}
