// Byte-level tokenizer with special and language-tag tokens.
//   ids 0..255      the bytes of the UTF-8 text
//   256 PAD, 257 BOS, 258 EOS, 259 SEP
//   260 + i         tag of language i, languages sorted by name ("<de>", "<pt_BR>", "<text>")
// vocab_size = 260 + number of languages.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshmoe {

class Tokenizer {
 public:
  static constexpr int32_t kPad = 256, kBos = 257, kEos = 258, kSep = 259, kFirstLang = 260;
  static constexpr const char* kName = "bytes+specials+langtags";

  Tokenizer() = default;
  // Languages are sorted and de-duplicated; a name must be non-empty and hold no '<', '>' or space.
  explicit Tokenizer(std::vector<std::string> languages);

  int vocab_size() const { return kFirstLang + int(languages_.size()); }
  const std::vector<std::string>& languages() const { return languages_; }
  // Index of a language in languages(), or -1 when unknown.
  int language_index(std::string_view name) const;
  // Tag token of a language; throws InputError when the language is not in the vocabulary.
  int32_t lang_token(std::string_view name) const;

  // Bytes -> ids 0..255 (appended to `out`).
  static void encode_bytes(std::string_view text, std::vector<int32_t>& out);
  std::vector<int32_t> encode(std::string_view text) const;
  // Ids -> text: bytes as themselves, specials as "<pad>", "<bos>", "<eos>", "<sep>", tags as
  // "<de>". Throws Error on an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string token_text(int32_t id) const;

 private:
  std::vector<std::string> languages_;
};

}  // namespace meshmoe
