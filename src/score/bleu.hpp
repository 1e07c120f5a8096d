// Corpus BLEU as SacreBLEU defines it (Post 2018; its defaults): the 13a tokenisation of
// mteval-v13a, n-grams up to 4 with clipped counts summed over the corpus, the brevity penalty
// from the summed lengths, the geometric mean of the four precisions, "exp" smoothing of a zero
// count, and 0 when no n-gram matches at all. One reference per hypothesis.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshmoe {

// The tokens of mteval-v13a (SacreBLEU's default tokenize = "13a"): unescapes &quot; &amp; &lt;
// &gt;, drops <skipped>, splits off punctuation and symbols, and periods, commas and dashes except
// within numbers ("3.14", "1,000" stay whole).
std::vector<std::u32string> tokenize_13a(std::string_view line);
// Those tokens as UTF-8 text, one space between (what `meshmoe score --print-tokens` shows).
std::string tokenize_13a_text(std::string_view line);

constexpr int kBleuOrder = 4;

// The sufficient statistics: they add over sentences (and over ranks, languages, ...).
struct BleuStats {
  std::array<int64_t, kBleuOrder> matches{};  // clipped n-gram matches, n = 1..4
  std::array<int64_t, kBleuOrder> totals{};   // hypothesis n-grams
  int64_t hyp_len = 0, ref_len = 0;           // tokens
  void add(std::string_view hypothesis, std::string_view reference);
  BleuStats& operator+=(const BleuStats& o);
};

struct BleuScore {
  double score = 0;                           // 0..100
  std::array<double, kBleuOrder> precisions{};  // percent, after smoothing
  double brevity_penalty = 0;
};
BleuScore bleu_score(const BleuStats& s);

}  // namespace meshmoe
