#include "data/tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <unordered_map>

#include "core/error.hpp"

namespace meshmoe {

namespace {

class TextsIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit TextsIterator(const std::vector<std::string_view>& texts) : texts_(texts) { load(); }
  bool done() const override { return i_ >= texts_.size(); }
  void Next() override {
    ++i_;
    load();
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void load() {
    if (!done()) value_.assign(texts_[i_]);
  }
  const std::vector<std::string_view>& texts_;
  size_t i_ = 0;
  std::string value_;
};

}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> languages, std::string spm_model)
    : languages_(std::move(languages)), spm_model_(std::move(spm_model)) {
  std::sort(languages_.begin(), languages_.end());
  languages_.erase(std::unique(languages_.begin(), languages_.end()), languages_.end());
  for (const auto& l : languages_)
    if (l.empty() || l.find_first_of("<> \t\n") != std::string::npos)
      throw InputError("tokenizer: invalid language name '" + l + "' (must be non-empty, without '<', '>' or spaces)");
  if (!spm_model_.empty()) {
    auto p = std::make_shared<sentencepiece::SentencePieceProcessor>();
    if (const auto st = p->LoadFromSerializedProto(spm_model_); !st.ok())
      throw InputError("tokenizer: the SentencePiece model cannot be read (" + st.ToString() + ")");
    spm_ = std::move(p);
  }
}

std::string Tokenizer::train_spm(const std::vector<std::string_view>& texts, int pieces, bool quiet) {
  // Unigram model (SentencePiece's default, Kudo 2018); no BOS/EOS/PAD of its own (ours are
  // used); byte fallback so that every text encodes; the whole input read in a fixed order with a
  // fixed seed, so that the same texts give the same model.
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "unigram"},         {"vocab_size", std::to_string(pieces)},
      {"byte_fallback", "true"},         {"character_coverage", "0.9995"},
      {"bos_id", "-1"},                  {"eos_id", "-1"},
      {"pad_id", "-1"},                  {"unk_id", "0"},
      {"input_sentence_size", "0"},      {"shuffle_input_sentence", "false"},
      {"num_threads", "1"},              {"minloglevel", quiet ? "2" : "1"},
      {"max_sentence_length", "65536"},  {"hard_vocab_limit", "true"}};
  sentencepiece::SetRandomGeneratorSeed(1234);
  TextsIterator it(texts);
  std::string model;
  if (const auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &model); !st.ok())
    throw InputError("SentencePiece training of " + std::to_string(pieces) + " pieces failed: " + st.ToString() +
                     " (the vocabulary holds 256 byte pieces for the fallback, the text's characters and the pieces learnt;\n"
                     "  too large a vocabulary for the text fails too)");
  return model;
}

int Tokenizer::spm_pieces() const { return spm_ ? spm_->GetPieceSize() : 0; }

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

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  if (!spm_) return encode_bytes(text, out);
  std::vector<int> pieces;
  if (const auto st = spm_->Encode(text, &pieces); !st.ok()) throw Error("SentencePiece encode: " + st.ToString());
  for (const int p : pieces) out.push_back(first_piece() + p);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  encode(text, ids);
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
  if (id >= kFirstLang && id < first_piece()) return "<" + languages_[size_t(id - kFirstLang)] + ">";
  if (spm_ && id >= first_piece() && id < vocab_size()) return spm_->IdToPiece(id - first_piece());
  throw Error("tokenizer: id " + std::to_string(id) + " outside the vocabulary of " + std::to_string(vocab_size()));
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  s.reserve(ids.size());
  std::vector<int> run;  // consecutive pieces decode together (SentencePiece joins and unescapes them)
  auto flush = [&] {
    if (run.empty()) return;
    std::string text;
    if (const auto st = spm_->Decode(run, &text); !st.ok()) throw Error("SentencePiece decode: " + st.ToString());
    s += text;
    run.clear();
  };
  for (int32_t id : ids) {
    if (spm_ && id >= first_piece() && id < vocab_size()) {
      run.push_back(id - first_piece());
      continue;
    }
    flush();
    s += token_text(id);
  }
  flush();
  return s;
}

}  // namespace meshmoe
