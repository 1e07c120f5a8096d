// chrF (Popović 2015) as SacreBLEU computes it by default: character n-grams of orders 1..6 of
// the text with its whitespace removed, counts summed over the corpus, precision and recall
// averaged over the orders both sides have, then the F-score with beta = 2 (recall weighs twice).
#pragma once
#include <array>
#include <cstdint>
#include <string_view>

namespace meshmoe {

constexpr int kChrfOrder = 6;

// The sufficient statistics: they add over sentences (and over ranks, languages, ...).
struct ChrfStats {
  std::array<int64_t, kChrfOrder> hyp{};      // hypothesis character n-grams, n = 1..6
  std::array<int64_t, kChrfOrder> ref{};      // reference character n-grams
  std::array<int64_t, kChrfOrder> matches{};  // clipped matches
  void add(std::string_view hypothesis, std::string_view reference);
  ChrfStats& operator+=(const ChrfStats& o);
};

// 0..100.
double chrf_score(const ChrfStats& s, double beta = 2.0);

}  // namespace meshmoe
