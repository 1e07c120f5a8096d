// Text helpers of the translation scores: UTF-8 to code points and Python's notion of whitespace,
// so that BLEU's tokens and chrF's characters are the ones SacreBLEU (Python str) sees.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace meshmoe {

// Code points of a UTF-8 string. A byte that does not start a valid sequence stands for itself
// (as Latin-1 would read it), so any input scores instead of failing.
std::u32string utf8_to_code_points(std::string_view s);

std::string code_points_to_utf8(const std::u32string& s);

// Python's str.isspace(): ASCII whitespace, the separators U+001C..U+001F, U+0085, U+00A0 and the
// Unicode space separators, line and paragraph separators.
bool is_python_space(char32_t c);

// Python's str.split() with no argument: runs of whitespace separate, none at either end.
std::vector<std::u32string> split_on_whitespace(const std::u32string& s);

}  // namespace meshmoe
