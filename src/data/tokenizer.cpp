#include "data/tokenizer.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace meshmoe {

Tokenizer::Tokenizer(std::vector<std::string> languages) : languages_(std::move(languages)) {
  std::sort(languages_.begin(), languages_.end());
  languages_.erase(std::unique(languages_.begin(), languages_.end()), languages_.end());
  for (const auto& l : languages_)
    if (l.empty() || l.find_first_of("<> \t\n") != std::string::npos)
      throw InputError("tokenizer: invalid language name '" + l + "' (must be non-empty, without '<', '>' or spaces)");
}

int Tokenizer::language_index(std::string_view name) const {
  const auto it = std::lower_bound(languages_.begin(), languages_.end(), name);
  return (it != languages_.end() && *it == name) ? int(it - languages_.begin()) : -1;
}

int32_t Tokenizer::lang_token(std::string_view name) const {
  const int i = language_index(name);
  if (i < 0) throw InputError("tokenizer: language '" + std::string(name) + "' is not in the vocabulary");
  return kFirstLang + i;
}

void Tokenizer::encode_bytes(std::string_view text, std::vector<int32_t>& out) {
  for (unsigned char c : text) out.push_back(int32_t(c));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  encode_bytes(text, ids);
  return ids;
}

std::string Tokenizer::token_text(int32_t id) const {
  if (id >= 0 && id < 256) return std::string(1, char(id));
  switch (id) {
    case kPad: return "<pad>";
    case kBos: return "<bos>";
    case kEos: return "<eos>";
    case kSep: return "<sep>";
    default: break;
  }
  if (id >= kFirstLang && id < vocab_size()) return "<" + languages_[size_t(id - kFirstLang)] + ">";
  throw Error("tokenizer: id " + std::to_string(id) + " outside the vocabulary of " + std::to_string(vocab_size()));
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  s.reserve(ids.size());
  for (int32_t id : ids) s += token_text(id);
  return s;
}

}  // namespace meshmoe
