#include <chrono>
#include <fstream>
#include <ostream>
#include <sstream>

#include "core/error.hpp"
#include "data/prep.hpp"

namespace meshmoe {
namespace {

// Lines (or blank-line separated paragraphs, lines joined by '\n') of a text, '\r' stripped,
// blank ones skipped.
std::vector<std::string> split_units(const std::string& text, bool paragraphs) {
  std::vector<std::string> units;
  std::string para;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const bool blank = line.find_first_not_of(" \t\f\v") == std::string::npos;
    if (!paragraphs) {
      if (!blank) units.push_back(line);
    } else if (blank) {
      if (!para.empty()) units.push_back(std::move(para));
      para.clear();
    } else {
      para += (para.empty() ? "" : "\n") + line;
    }
  }
  if (!para.empty()) units.push_back(std::move(para));
  return units;
}

// Pieces of at most `max_bytes` bytes, not cutting a UTF-8 sequence (unless one is longer than
// max_bytes, which valid UTF-8 never is for max_bytes >= 4).
std::vector<std::string_view> cut(std::string_view s, size_t max_bytes) {
  std::vector<std::string_view> out;
  while (s.size() > max_bytes) {
    size_t n = max_bytes;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // s[n] continues a sequence
    if (n == 0) n = max_bytes;
    out.push_back(s.substr(0, n));
    s.remove_prefix(n);
  }
  if (!s.empty()) out.push_back(s);
  return out;
}

}  // namespace

PreparedDataset prepare_text(const PrepTextOptions& opt, std::ostream& log) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.files.empty()) throw InputError("prep text: give at least one text file");
  if (opt.max_len < 6) throw InputError("prep text: --max-len must be >= 6 (got " + std::to_string(opt.max_len) + ")");
  if (opt.valid_percent < 0 || opt.valid_percent > 100)
    throw InputError("prep text: --valid-percent must be in 0..100 (got " + std::to_string(opt.valid_percent) + ")");
  refuse_output_overwriting_input("prep text", opt.output, opt.files);
  const TokenizerKind tokenizer = parse_tokenizer_options("prep text", opt.tokenizer, opt.spm_pieces, opt.spm_sample);

  // Every file's lines (or paragraphs) first: a SentencePiece model learns from the train split's.
  std::vector<std::vector<std::string>> units(opt.files.size());
  std::vector<std::string_view> train_texts;
  for (size_t f = 0; f < opt.files.size(); ++f) {
    std::ifstream in(opt.files[f], std::ios::binary);
    if (!in) throw InputError("prep text: cannot open " + opt.files[f]);
    std::ostringstream ss;
    ss << in.rdbuf();
    units[f] = split_units(ss.str(), opt.paragraphs);
  }
  // The split follows the whole line, so the pieces of a long line stay on one side.
  for (const auto& file_units : units)
    for (const auto& u : file_units)
      if (!in_valid_split(u, opt.valid_percent)) train_texts.push_back(u);

  PreparedDataset out;
  const Tokenizer tok = prep_tokenizer("prep text", tokenizer, opt.spm_pieces, opt.spm_sample, {"text"}, train_texts,
                                       opt.quiet, log);
  DatasetInfo& info = out.info;
  info.tokenizer = tok.name();
  info.spm_model = tok.spm_model();
  info.vocab_size = tok.vocab_size();
  info.languages = tok.languages();
  info.train_pairs.assign(1, 0);
  info.valid_pairs.assign(1, 0);
  info.created_by = "meshmoe prep text";
  info.sources = opt.files;
  const int32_t tag = tok.lang_token("text");

  std::vector<int32_t> ids, text_ids;
  std::vector<uint8_t> mask;
  for (size_t f = 0; f < opt.files.size(); ++f) {
    for (const auto& u : units[f]) {
      const bool valid = in_valid_split(u, opt.valid_percent);
      // Pieces of at most max_len - 2 tokens: <text> tokens EOS. Bytes are cut where a UTF-8
      // sequence starts; SentencePiece pieces anywhere.
      std::vector<std::vector<int32_t>> pieces;
      if (tokenizer == TokenizerKind::Bytes) {
        for (const auto piece : cut(u, size_t(opt.max_len - 2))) pieces.push_back(tok.encode(piece));
      } else {
        text_ids = tok.encode(u);
        for (size_t at = 0; at < text_ids.size() || at == 0; at += size_t(opt.max_len - 2))
          pieces.emplace_back(text_ids.begin() + std::ptrdiff_t(at),
                              text_ids.begin() + std::ptrdiff_t(std::min(text_ids.size(), at + size_t(opt.max_len - 2))));
      }
      out.stats.pieces_cut += int64_t(pieces.size()) - 1;
      for (const auto& piece : pieces) {
        ids.assign(1, tag);
        ids.insert(ids.end(), piece.begin(), piece.end());
        ids.push_back(Tokenizer::kEos);
        mask.assign(ids.size(), 1);
        mask[0] = 0;  // the tag starts the example; nothing predicts it
        (valid ? out.valid : out.train).add_example(ids, mask, 0);
        ++(valid ? info.valid_pairs : info.train_pairs)[0];
      }
    }
    if (!opt.quiet)
      log << "prep text: " << opt.files[f] << ": " << units[f].size() << (opt.paragraphs ? " paragraphs\n" : " lines\n");
  }
  PrepStats& st = out.stats;
  st.train_examples = int64_t(out.train.num_examples());
  st.valid_examples = int64_t(out.valid.num_examples());
  st.train_tokens = int64_t(out.train.num_tokens());
  st.valid_tokens = int64_t(out.valid.num_tokens());
  if (st.train_examples + st.valid_examples == 0) throw InputError("prep text: the files hold no non-blank lines");
  check_split_sizes("prep text", out, opt.valid_percent, log);
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace meshmoe
