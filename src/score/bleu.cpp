#include "score/bleu.hpp"

#include <cmath>
#include <unordered_map>

#include "score/text.hpp"

namespace meshmoe {

namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size()) out.append(s, at, hit - at).append(to);
  s = out.append(s, at);
}

bool is_digit(char32_t c) { return c >= U'0' && c <= U'9'; }
bool is_period_or_comma(char32_t c) { return c == U'.' || c == U','; }
// The class [{-~[-` -&(-+:-@/] of 13a's first rule: ASCII punctuation and symbols but . , ' - and 0-9.
bool is_split_symbol(char32_t c) {
  return (c >= 0x7B && c <= 0x7E) || (c >= 0x5B && c <= 0x60) || (c >= 0x20 && c <= 0x26) || (c >= 0x28 && c <= 0x2B) ||
         (c >= 0x3A && c <= 0x40) || c == U'/';
}

// One pass of a two-character rule as a regular-expression substitution makes it: leftmost
// matches, none overlapping, replaced by `a b` with spaces as the rule says.
template <class Match, class Emit>
std::u32string pair_rule(const std::u32string& s, Match match, Emit emit) {
  std::u32string out;
  out.reserve(s.size() + s.size() / 2);
  size_t i = 0;
  while (i < s.size()) {
    if (i + 1 < s.size() && match(s[i], s[i + 1])) {
      emit(out, s[i], s[i + 1]);
      i += 2;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

std::unordered_map<std::u32string, int64_t> ngram_counts(const std::vector<std::u32string>& tokens, size_t n) {
  std::unordered_map<std::u32string, int64_t> counts;
  for (size_t i = 0; i + n <= tokens.size(); ++i) {
    std::u32string gram = tokens[i];
    for (size_t k = 1; k < n; ++k) gram.append(U" ").append(tokens[i + k]);
    ++counts[gram];
  }
  return counts;
}

}  // namespace

std::vector<std::u32string> tokenize_13a(std::string_view line) {
  std::string text(line);
  replace_all(text, "<skipped>", "");
  replace_all(text, "-\n", "");
  replace_all(text, "\n", " ");
  replace_all(text, "&quot;", "\"");
  replace_all(text, "&amp;", "&");
  replace_all(text, "&lt;", "<");
  replace_all(text, "&gt;", ">");
  const std::u32string s = utf8_to_code_points(" " + text + " ");
  std::u32string a;
  a.reserve(3 * s.size());
  for (const char32_t c : s) {
    if (is_split_symbol(c)) a.append({U' ', c, U' '});
    else a.push_back(c);
  }
  a = pair_rule(a, [](char32_t x, char32_t y) { return !is_digit(x) && is_period_or_comma(y); },
                [](std::u32string& o, char32_t x, char32_t y) { o.append({x, U' ', y, U' '}); });
  a = pair_rule(a, [](char32_t x, char32_t y) { return is_period_or_comma(x) && !is_digit(y); },
                [](std::u32string& o, char32_t x, char32_t y) { o.append({U' ', x, U' ', y}); });
  a = pair_rule(a, [](char32_t x, char32_t y) { return is_digit(x) && y == U'-'; },
                [](std::u32string& o, char32_t x, char32_t y) { o.append({x, U' ', y, U' '}); });
  return split_on_whitespace(a);
}

std::string tokenize_13a_text(std::string_view line) {
  std::u32string joined;
  for (const auto& t : tokenize_13a(line)) joined += (joined.empty() ? U"" : U" ") + t;
  return code_points_to_utf8(joined);
}

void BleuStats::add(std::string_view hypothesis, std::string_view reference) {
  const auto hyp = tokenize_13a(hypothesis), ref = tokenize_13a(reference);
  hyp_len += int64_t(hyp.size());
  ref_len += int64_t(ref.size());
  for (size_t n = 1; n <= size_t(kBleuOrder); ++n) {
    const auto h = ngram_counts(hyp, n), r = ngram_counts(ref, n);
    for (const auto& [gram, count] : h) {
      totals[n - 1] += count;
      if (const auto it = r.find(gram); it != r.end()) matches[n - 1] += std::min(count, it->second);
    }
  }
}

BleuStats& BleuStats::operator+=(const BleuStats& o) {
  for (int n = 0; n < kBleuOrder; ++n) matches[n] += o.matches[n], totals[n] += o.totals[n];
  hyp_len += o.hyp_len;
  ref_len += o.ref_len;
  return *this;
}

BleuScore bleu_score(const BleuStats& s) {
  BleuScore b;
  b.brevity_penalty = s.hyp_len >= s.ref_len ? 1.0 : s.hyp_len > 0 ? std::exp(1.0 - double(s.ref_len) / double(s.hyp_len)) : 0.0;
  bool any_match = false;
  for (const int64_t m : s.matches) any_match = any_match || m > 0;
  if (!any_match) return b;
  // "exp" smoothing (mteval): the k-th order with no match counts as 1 / 2^k matches. An order the
  // hypotheses are too short to have keeps precision 0, which makes the score 0.
  double smooth = 1, log_sum = 0;
  for (int n = 0; n < kBleuOrder; ++n) {
    if (s.totals[n] == 0) break;
    if (s.matches[n] == 0) {
      smooth *= 2;
      b.precisions[n] = 100.0 / (smooth * double(s.totals[n]));
    } else {
      b.precisions[n] = 100.0 * double(s.matches[n]) / double(s.totals[n]);
    }
  }
  for (const double p : b.precisions) log_sum += p > 0 ? std::log(p) : -9999999999.0;
  b.score = b.brevity_penalty * std::exp(log_sum / kBleuOrder);
  return b;
}

}  // namespace meshmoe
