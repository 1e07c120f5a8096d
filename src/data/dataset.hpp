// A tokenized dataset: what `meshmoe prep` writes and the trainer reads.
//
// File layout (HDF5), one group per split:
//   /train, /valid
//     tokens       [T]    uint16 (uint32 when vocab_size > 65535), examples back to back
//     doc_offsets  [n+1]  int64, example i = tokens[doc_offsets[i] : doc_offsets[i+1]]
//     lang         [n]    int32, index of the example's language in /languages/name
//     loss_mask    [T]    uint8, 1 = this token is a prediction target counted in the loss
//   /languages/name [L] strings (sorted; tag token of language i = 260 + i)
//   /languages/train_pairs, /languages/valid_pairs [L] int64
//   /sources        [S] strings (catalogs or text files read)
//   /tokenizer/spm_model [bytes] uint8, the serialized SentencePiece model (tokenizer = spm only)
//   root attributes: tokenizer, vocab_size, pad_id, bos_id, eos_id, sep_id, languages, created_by, root,
//     direction (prep gettext only: "xx-en" = source translation, target English; "en-xx" the reverse)
#pragma once
#include "core/hash.hpp"  // fnv1a64: assigns an example to the train or valid split
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.hpp"
#include "deck/options.hpp"

namespace meshmoe {

struct DataSplit {
  bool wide = false;                    // tokens held as uint32 (vocab_size > 65535), else uint16
  std::vector<uint16_t> tokens16;       // [T] when !wide
  std::vector<uint32_t> tokens32;       // [T] when wide
  std::vector<int64_t> doc_offsets{0};  // [n+1]
  std::vector<int32_t> lang;            // [n]
  std::vector<uint8_t> loss_mask;       // [T]

  size_t num_examples() const { return lang.size(); }
  size_t num_tokens() const { return loss_mask.size(); }
  // Whether any token is a prediction target (loss_mask = 1).
  bool has_target() const { return std::find(loss_mask.begin(), loss_mask.end(), uint8_t(1)) != loss_mask.end(); }
  uint32_t token(size_t i) const { return wide ? tokens32[i] : tokens16[i]; }
  size_t example_begin(size_t e) const { return size_t(doc_offsets[e]); }
  size_t example_size(size_t e) const { return size_t(doc_offsets[e + 1] - doc_offsets[e]); }
  // Appends one example; `tokens` and `mask` have the same length.
  void add_example(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& mask, int32_t language);
};

// The evaluation sample of a split (eval.examples_per_language, eval.bleu_examples, `meshmoe eval
// --max-examples`): `per_language` examples of every language, all of a language's when it has no
// more (or per_language is 0). Within a language, the examples whose hash mix64(language << 32 |
// position) is smallest, position counting that language's examples in file order: the same sample
// in every run and on every mesh, and independent between languages, whose validation examples are
// the same held-out English strings in the same (sorted) order. Examples of a language id outside
// [0, languages) are one more group. Returns example indices in file order.
std::vector<size_t> per_language_sample(const DataSplit& split, size_t languages, int64_t per_language);

// What the file says about itself (root attributes and the small datasets).
struct DatasetInfo {
  std::string tokenizer = Tokenizer::kName;
  int64_t vocab_size = 0;
  int64_t pad_id = Tokenizer::kPad, bos_id = Tokenizer::kBos, eos_id = Tokenizer::kEos, sep_id = Tokenizer::kSep;
  std::vector<std::string> languages;              // sorted
  std::vector<int64_t> train_pairs, valid_pairs;  // per language
  std::vector<std::string> sources;
  std::string created_by, root;
  std::string direction;  // prep gettext: "xx-en" or "en-xx" (which side is the source); empty otherwise
  std::string spm_model;  // serialized SentencePiece model; empty for the byte tokenizer
  // What Dataset::open holds of each split (DataSplit: the tokens at 2 or 4 bytes and loss_mask at 1
  // per token, doc_offsets at 8 and lang at 4 per example), from the datasets' shapes; 0 for a
  // split the file lacks. The memory plan counts them (run/memory.hpp).
  int64_t train_bytes = 0, valid_bytes = 0, train_examples = 0;

  Tokenizer tokenizer_object() const { return Tokenizer(languages, spm_model); }
};

// DatasetInfo::direction in words for the logs: which side is the source, which the target.
std::string direction_text(const std::string& direction);

// Throws InputError, naming the prep command that makes a matching file, when the dataset was not
// prepared with `tokenizer` (bytes | spm) or, for spm with spm_pieces > 0, not with that many pieces.
void check_dataset_tokenizer(const std::string& path, const DatasetInfo& info, TokenizerKind tokenizer,
                             int64_t spm_pieces);

// Writes a dataset file (one process; no collective). Throws Error on an I/O failure.
void write_dataset(const std::string& path, const DatasetInfo& info, const DataSplit& train, const DataSplit& valid);

// One split of a dataset file, held in memory. Every rank that calls open() reads the file itself.
class Dataset {
 public:
  // split = "train" or "valid". Throws InputError naming the file and what is wrong when it is
  // missing, not HDF5, not a meshmoe dataset, or inconsistent (a loss_mask value other than 0 or
  // 1 included), and when the train split has no target token (no loss_mask = 1).
  static Dataset open(const std::string& path, const std::string& split);
  // The file's attributes and language table without reading a split's tokens (the same checks
  // of the file and its attributes as open()).
  static DatasetInfo read_info(const std::string& path);
  // For tests and tools: a dataset built in memory (validated like a file).
  static Dataset from_memory(DatasetInfo info, DataSplit split, std::string name = "<memory>");

  const DatasetInfo& info() const { return info_; }
  const DataSplit& split() const { return split_; }
  const std::string& path() const { return path_; }
  const std::string& split_name() const { return split_name_; }
  int vocab_size() const { return int(info_.vocab_size); }
  size_t num_examples() const { return split_.num_examples(); }
  size_t num_tokens() const { return split_.num_tokens(); }

 private:
  void validate() const;  // throws InputError
  DatasetInfo info_;
  DataSplit split_;
  std::string path_, split_name_;
};

}  // namespace meshmoe
