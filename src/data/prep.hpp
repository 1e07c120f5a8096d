// `meshmoe prep`: turns text sources into a dataset file (layout in data/dataset.hpp).
//   prep gettext: pairs (translation, English msgid) from the GNU gettext catalogs of a locale tree;
//     direction xx-en: example = <lang> translation SEP english EOS, loss on the English tokens and EOS;
//     direction en-xx: example = <lang> english SEP translation EOS, loss on the translation and EOS
//     (the tag then names the language to translate into).
//   prep text: one example per line (or paragraph) of UTF-8 files;
//     example = <text> text EOS, loss on the text and EOS.
// Text tokens are bytes, or with --tokenizer spm SentencePiece pieces of a model trained on the
// train split's text (every translation, each English string once), or on a sample of it of
// --spm-sample texts, and stored in the file; every example is encoded with it.
// The split is a pure function of the English text (gettext) or the line (text): FNV-1a 64 of it,
// valid when hash % 100 < valid_percent, so one English string never lands on both sides.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.hpp"

namespace meshmoe {

// --spm-sample's default: the SentencePiece vocabulary of a larger train split learns from this many
// of its texts (spm_training_sample).
inline constexpr int64_t kSpmSampleDefault = 300000;

struct PrepGettextOptions {
  std::string root = "/usr/share/locale";  // scanned as <root>/<lang>/LC_MESSAGES/*.mo
  std::string output;                      // -o, the dataset file to write
  int64_t max_len = 256;                   // drop pairs whose example is longer (tokens)
  int64_t valid_percent = 2;               // 0..100
  int64_t min_pairs = 1;                   // drop languages with fewer pairs
  std::vector<std::string> languages;      // keep only these (empty = all)
  std::string tokenizer = "bytes";         // bytes | spm (data.tokenizer's names; parsed by prep)
  int64_t spm_pieces = 8000;               // SentencePiece vocabulary (tokenizer = spm)
  int64_t spm_sample = kSpmSampleDefault;  // texts the vocabulary learns from (0 = all)
  int64_t threads = 0;                     // encoding threads; 0: OPENBLAS_NUM_THREADS, or 1
  std::string direction = "xx-en";         // xx-en (translation -> English) | en-xx (English -> translation)
  bool quiet = false;                      // no progress lines
};

struct PrepTextOptions {
  std::vector<std::string> files;
  std::string output;
  int64_t max_len = 256;      // longer lines are cut into pieces of at most this many tokens
  int64_t valid_percent = 2;  // 0..100
  bool paragraphs = false;    // one example per paragraph (blank-line separated) instead of per line
  std::string tokenizer = "bytes";  // bytes | spm (data.tokenizer's names; parsed by prep)
  int64_t spm_pieces = 8000;        // SentencePiece vocabulary (tokenizer = spm)
  int64_t spm_sample = kSpmSampleDefault;  // texts the vocabulary learns from (0 = all)
  bool quiet = false;
};

struct PrepStats {
  int64_t catalogs = 0, catalogs_skipped = 0;  // read / skipped as corrupt
  int64_t entries = 0;                         // translated entries seen (header excluded)
  int64_t untranslated = 0, identical = 0, duplicates = 0, too_long = 0;
  int64_t languages_dropped = 0;               // fewer than min_pairs pairs
  int64_t pairs_dropped_with_languages = 0;
  int64_t train_examples = 0, valid_examples = 0, train_tokens = 0, valid_tokens = 0;
  int64_t pieces_cut = 0;                      // prep text: extra pieces from cutting long lines
  double seconds = 0;
};

struct PreparedDataset {
  DatasetInfo info;
  DataSplit train, valid;
  PrepStats stats;
};

// Build the dataset in memory; progress and warnings go to `log`. Throw InputError on bad options
// or sources (missing root, unknown language, no pairs, unreadable text file, an output that is
// one of the inputs, an empty train split).
PreparedDataset prepare_gettext(const PrepGettextOptions& opt, std::ostream& log);
PreparedDataset prepare_text(const PrepTextOptions& opt, std::ostream& log);

// Throws InputError when `output` is the same file as one of `inputs` (std::filesystem::equivalent
// when both exist, else the same weakly_canonical path: another spelling or a symlink), before
// anything is written, so prep never overwrites what it reads. An empty output is not checked.
void refuse_output_overwriting_input(const std::string& cmd, const std::string& output,
                                     const std::vector<std::string>& inputs);

// After a prep: an empty train split is an InputError (nothing to train on); an empty valid split
// is a warning on `log` (a deck must then set eval.every = 0).
void check_split_sizes(const std::string& cmd, const PreparedDataset& d, int64_t valid_percent, std::ostream& log);

// The --tokenizer of a prep as its enum (a name of data.tokenizer: bytes | spm), with --spm-pieces
// checked for spm and --spm-sample (0, or 100..10^9); InputError otherwise.
TokenizerKind parse_tokenizer_options(const std::string& cmd, const std::string& tokenizer, int64_t spm_pieces,
                                      int64_t spm_sample);
// The tokenizer of a prep: bytes, or SentencePiece of spm_pieces pieces trained on
// spm_training_sample(train_texts, spm_sample).
Tokenizer prep_tokenizer(const std::string& cmd, TokenizerKind kind, int64_t spm_pieces, int64_t spm_sample,
                         std::vector<std::string> languages, const std::vector<std::string_view>& train_texts, bool quiet,
                         std::ostream& log);
// The texts a SentencePiece vocabulary learns from: all of them when n is 0 or at least their number,
// else the n whose mix64(fnv1a64(text)) are smallest (ties by position), in their order in `texts`. A
// pure function of the texts, independent of their order: a uniform sample that two runs (and
// any machine) draw alike, in which a language has its share of the texts.
std::vector<std::string_view> spm_training_sample(const std::vector<std::string_view>& texts, int64_t n);

// Whether an example goes to the valid split: FNV-1a 64 of its key (gettext: the English text;
// text: the line or paragraph) % 100 < valid_percent.
inline bool in_valid_split(std::string_view key, int64_t valid_percent) {
  return fnv1a64(key) % 100 < uint64_t(valid_percent);
}

// One-line-per-item summary for the user.
std::string prep_summary(const PreparedDataset& d);

}  // namespace meshmoe
