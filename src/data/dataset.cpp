#include "data/dataset.hpp"

#include "core/error.hpp"

namespace meshmoe {

void DataSplit::add_example(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& mask, int32_t language) {
  if (tokens.size() != mask.size()) throw Error("DataSplit::add_example: tokens and mask differ in length");
  for (int32_t t : tokens) {
    if (wide) tokens32.push_back(uint32_t(t));
    else tokens16.push_back(uint16_t(t));
  }
  loss_mask.insert(loss_mask.end(), mask.begin(), mask.end());
  doc_offsets.push_back(int64_t(loss_mask.size()));
  lang.push_back(language);
}

std::vector<size_t> per_language_sample(const DataSplit& split, size_t languages, int64_t per_language) {
  std::vector<std::vector<size_t>> groups(languages + 1);
  for (size_t e = 0; e < split.num_examples(); ++e) {
    const int32_t l = split.lang[e];
    groups[l >= 0 && size_t(l) < languages ? size_t(l) : languages].push_back(e);
  }
  std::vector<size_t> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<size_t>& in = groups[g];
    if (per_language > 0 && int64_t(in.size()) > per_language) {
      std::vector<std::pair<uint64_t, size_t>> keyed(in.size());  // (hash, position): ties to the earlier
      for (size_t j = 0; j < in.size(); ++j) keyed[j] = {mix64(uint64_t(g) << 32 | j), j};
      std::nth_element(keyed.begin(), keyed.begin() + per_language, keyed.end());
      std::vector<size_t> kept;
      for (int64_t i = 0; i < per_language; ++i) kept.push_back(in[keyed[size_t(i)].second]);
      in = std::move(kept);
    }
    out.insert(out.end(), in.begin(), in.end());
  }
  std::sort(out.begin(), out.end());
  return out;
}

Dataset Dataset::from_memory(DatasetInfo info, DataSplit split, std::string name) {
  Dataset d;
  d.info_ = std::move(info);
  d.split_ = std::move(split);
  d.path_ = std::move(name);
  d.split_name_ = "memory";
  d.validate();
  return d;
}

void check_dataset_tokenizer(const std::string& path, const DatasetInfo& info, TokenizerKind tokenizer,
                             int64_t spm_pieces) {
  const Tokenizer tok = info.tokenizer_object();
  const TokenizerKind have = tok.is_spm() ? TokenizerKind::Spm : TokenizerKind::Bytes;
  const std::string want_name(option_name(tokenizer));
  const std::string remake =
      "; prepare one with `meshmoe prep gettext --tokenizer " + want_name +
      (tokenizer == TokenizerKind::Spm && spm_pieces > 0 ? " --spm-pieces " + std::to_string(spm_pieces) : "") +
      " -o FILE` (or `prep text`) and set data.path, or change data.tokenizer";
  if (have != tokenizer)
    throw InputError("data.tokenizer = " + want_name + " but " + path + " was prepared with the " +
                     std::string(option_name(have)) + " tokenizer" + remake);
  if (tok.is_spm() && spm_pieces > 0 && tok.spm_pieces() != spm_pieces)
    throw InputError("data.spm_pieces = " + std::to_string(spm_pieces) + " but " + path + " has " +
                     std::to_string(tok.spm_pieces()) + " SentencePiece pieces" + remake);
}

void Dataset::validate() const {
  const std::string where = path_ + " (split /" + split_name_ + ")";
  auto bad = [&](const std::string& what) {
    throw InputError(where + ": " + what + "; rewrite the file with `meshmoe prep`");
  };
  const bool spm = info_.tokenizer == Tokenizer::kSpmName;
  if (info_.tokenizer != Tokenizer::kName && !spm)
    bad("tokenizer '" + info_.tokenizer + "' is not one meshmoe reads ('" + Tokenizer::kName + "' or '" +
        Tokenizer::kSpmName + "')");
  if (spm != !info_.spm_model.empty())
    bad(spm ? "tokenizer spm without its model /tokenizer/spm_model" : "a SentencePiece model with the byte tokenizer");
  const Tokenizer tok = info_.tokenizer_object();
  if (info_.vocab_size != tok.vocab_size())
    bad("vocab_size " + std::to_string(info_.vocab_size) + " does not match 260 + " +
        std::to_string(info_.languages.size()) + " languages" +
        (spm ? " + " + std::to_string(tok.spm_pieces()) + " SentencePiece pieces" : ""));
  if (info_.pad_id != Tokenizer::kPad || info_.bos_id != Tokenizer::kBos || info_.eos_id != Tokenizer::kEos ||
      info_.sep_id != Tokenizer::kSep)
    bad("special token ids differ from pad=256 bos=257 eos=258 sep=259");
  const DataSplit& s = split_;
  const size_t n = s.lang.size(), t = s.loss_mask.size();
  if ((s.wide ? s.tokens32.size() : s.tokens16.size()) != t) bad("tokens and loss_mask differ in length");
  if (s.doc_offsets.size() != n + 1) bad("doc_offsets must hold one more entry than lang");
  if (s.doc_offsets.front() != 0 || s.doc_offsets.back() != int64_t(t)) bad("doc_offsets must run from 0 to the token count");
  for (size_t i = 0; i < n; ++i)
    if (s.doc_offsets[i + 1] < s.doc_offsets[i]) bad("doc_offsets decrease at example " + std::to_string(i));
  for (size_t i = 0; i < n; ++i)
    if (s.lang[i] < 0 || size_t(s.lang[i]) >= info_.languages.size())
      bad("lang[" + std::to_string(i) + "] = " + std::to_string(s.lang[i]) + " is not a language index");
  for (size_t i = 0; i < t; ++i)
    if (s.loss_mask[i] > 1)  // a weight of 7 would scale the token's loss, not mark it
      bad("loss_mask[" + std::to_string(i) + "] = " + std::to_string(int(s.loss_mask[i])) + " is neither 0 nor 1");
  for (size_t i = 0; i < t; ++i)
    if (int64_t(s.token(i)) >= info_.vocab_size)
      bad("token " + std::to_string(s.token(i)) + " at " + std::to_string(i) + " is outside the vocabulary");
}

std::string direction_text(const std::string& direction) {
  if (direction == "xx-en") return "xx-en (source: the translation after its language tag; target: English)";
  if (direction == "en-xx") return "en-xx (source: English after the target language's tag; target: the translation)";
  return direction;
}

}  // namespace meshmoe
