#include "score/chrf.hpp"

#include <unordered_map>

#include "score/text.hpp"

namespace meshmoe {

namespace {

std::u32string without_whitespace(std::string_view s) {
  std::u32string out;
  for (const char32_t c : utf8_to_code_points(s))
    if (!is_python_space(c)) out.push_back(c);
  return out;
}

std::unordered_map<std::u32string_view, int64_t> char_ngrams(const std::u32string& s, size_t n) {
  std::unordered_map<std::u32string_view, int64_t> counts;
  for (size_t i = 0; i + n <= s.size(); ++i) ++counts[std::u32string_view(s).substr(i, n)];
  return counts;
}

}  // namespace

void ChrfStats::add(std::string_view hypothesis, std::string_view reference) {
  const std::u32string h = without_whitespace(hypothesis), r = without_whitespace(reference);
  for (size_t n = 1; n <= size_t(kChrfOrder); ++n) {
    const auto hc = char_ngrams(h, n), rc = char_ngrams(r, n);
    hyp[n - 1] += h.size() >= n ? int64_t(h.size() - n + 1) : 0;
    ref[n - 1] += r.size() >= n ? int64_t(r.size() - n + 1) : 0;
    for (const auto& [gram, count] : hc)
      if (const auto it = rc.find(gram); it != rc.end()) matches[n - 1] += std::min(count, it->second);
  }
}

ChrfStats& ChrfStats::operator+=(const ChrfStats& o) {
  for (int n = 0; n < kChrfOrder; ++n) hyp[n] += o.hyp[n], ref[n] += o.ref[n], matches[n] += o.matches[n];
  return *this;
}

double chrf_score(const ChrfStats& s, double beta) {
  double precision = 0, recall = 0;
  int orders = 0;  // those with n-grams on both sides
  for (int n = 0; n < kChrfOrder; ++n) {
    if (s.hyp[n] == 0 || s.ref[n] == 0) continue;
    precision += double(s.matches[n]) / double(s.hyp[n]);
    recall += double(s.matches[n]) / double(s.ref[n]);
    ++orders;
  }
  if (orders == 0 || precision + recall == 0) return 0.0;
  precision /= orders;
  recall /= orders;
  const double b2 = beta * beta;
  return 100.0 * (1 + b2) * precision * recall / (b2 * precision + recall);
}

}  // namespace meshmoe
