// Tokenizer with special and language-tag tokens: bytes, or SentencePiece subwords.
//   ids 0..255      the bytes of the UTF-8 text (the byte tokenizer's text tokens)
//   256 PAD, 257 BOS, 258 EOS, 259 SEP
//   260 + i         tag of language i, languages sorted by name ("<de>", "<pt_BR>", "<text>")
//   260 + L + p     SentencePiece piece p (spm tokenizer only; L = number of languages)
// vocab_size = 260 + L, plus the pieces for spm. The spm tokenizer keeps the same specials and tags
// (its model has no BOS/EOS/PAD of its own, and falls back to bytes for text it has no piece for),
// so ids 0..255 are unused there.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace meshmoe {

class Tokenizer {
 public:
  static constexpr int32_t kPad = 256, kBos = 257, kEos = 258, kSep = 259, kFirstLang = 260;
  static constexpr const char* kName = "bytes+specials+langtags";
  static constexpr const char* kSpmName = "spm+specials+langtags";

  Tokenizer() = default;
  // Languages are sorted and de-duplicated; a name must be non-empty and hold no '<', '>' or space.
  // spm_model: a serialized SentencePiece model (train_spm), or empty for the byte tokenizer.
  explicit Tokenizer(std::vector<std::string> languages, std::string spm_model = "");

  // The trainer's work is split into this many shards (its num_threads) on any machine: it sums the
  // shards' expected piece counts in shard order, so the model depends on the shard count and not
  // on the cores (same texts, same model bits).
  static constexpr int kSpmTrainShards = 16;
  // Trains a SentencePiece unigram model of `pieces` pieces (byte fallback on) on `texts`; returns
  // it serialized. Throws InputError when the texts cannot give that many pieces. With `progress`,
  // the trainer's phases are written there, one line each with the seconds since the start.
  static std::string train_spm(const std::vector<std::string_view>& texts, int pieces, std::ostream* progress);

  bool is_spm() const { return spm_ != nullptr; }
  const char* name() const { return is_spm() ? kSpmName : kName; }
  const std::string& spm_model() const { return spm_model_; }
  int spm_pieces() const;
  int32_t first_piece() const { return kFirstLang + int32_t(languages_.size()); }
  int vocab_size() const { return first_piece() + (is_spm() ? spm_pieces() : 0); }
  const std::vector<std::string>& languages() const { return languages_; }
  // Index of a language in languages(), or -1 when unknown.
  int language_index(std::string_view name) const;
  // Tag token of a language; throws InputError when the language is not in the vocabulary.
  int32_t lang_token(std::string_view name) const;

  // Bytes -> ids 0..255 (appended to `out`).
  static void encode_bytes(std::string_view text, std::vector<int32_t>& out);
  // Text -> its bytes or its pieces (appended to `out`).
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  std::vector<int32_t> encode(std::string_view text) const;
  // Every text's ids, text i's at ids[offsets[i], offsets[i + 1]), on `threads` threads (each one
  // a contiguous range of texts): the same ids on any number of threads.
  struct EncodedTexts {
    std::vector<int32_t> ids;
    std::vector<size_t> offsets;  // texts.size() + 1
  };
  EncodedTexts encode_all(const std::vector<std::string_view>& texts, int threads) const;
  // Ids -> text: bytes as themselves, pieces as SentencePiece decodes them, specials as "<pad>",
  // "<bos>", "<eos>", "<sep>", tags as "<de>". Throws Error on an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string token_text(int32_t id) const;

 private:
  std::vector<std::string> languages_;
  std::string spm_model_;
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> spm_;  // shared by copies
};

}  // namespace meshmoe
