#include "score/text.hpp"

namespace meshmoe {

std::u32string utf8_to_code_points(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    int extra = b < 0x80 ? 0 : (b >> 5) == 0x6 ? 1 : (b >> 4) == 0xE ? 2 : (b >> 3) == 0x1E ? 3 : -1;
    char32_t c = extra == 0 ? b : extra == 1 ? (b & 0x1F) : extra == 2 ? (b & 0x0F) : (b & 0x07);
    bool valid = extra >= 0 && i + size_t(extra) < s.size();
    for (int k = 1; valid && k <= extra; ++k) {
      const unsigned char cont = static_cast<unsigned char>(s[i + size_t(k)]);
      valid = (cont >> 6) == 0x2;
      c = (c << 6) | (cont & 0x3F);
    }
    if (!valid) {
      out.push_back(b);
      ++i;
    } else {
      out.push_back(c);
      i += size_t(extra) + 1;
    }
  }
  return out;
}

std::string code_points_to_utf8(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char32_t c : s) {
    if (c < 0x80) {
      out.push_back(char(c));
    } else if (c < 0x800) {
      out.push_back(char(0xC0 | (c >> 6)));
      out.push_back(char(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(char(0xE0 | (c >> 12)));
      out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(char(0x80 | (c & 0x3F)));
    } else {
      out.push_back(char(0xF0 | (c >> 18)));
      out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(char(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::vector<std::u32string> split_on_whitespace(const std::u32string& s) {
  std::vector<std::u32string> words;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_python_space(s[i])) ++i;
    const size_t start = i;
    while (i < s.size() && !is_python_space(s[i])) ++i;
    if (i > start) words.emplace_back(s, start, i - start);
  }
  return words;
}

}  // namespace meshmoe
