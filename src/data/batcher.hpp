// Packs dataset examples into fixed-length training sequences.
//
// A sequence holds seq_len + 1 tokens: inputs = the first seq_len, targets = the same shifted by
// one. Examples are laid back to back in a seeded order; when the next example does not fit in what
// is left of a sequence, the tail is filled with PAD (mask 0) and the example starts the next
// sequence. An example longer than seq_len + 1 loses the end of its source (the tokens before its
// first target but the one that predicts it; the language tag stays) so that its target survives
// whole; one whose target does not fit even so is dropped (docs/user-guide.md "Datasets"; both counted by
// count_too_long). Each token carries its segment (which
// example of the row it belongs to, 0, 1, ...; the PAD tail is one more) and its position within
// that example, so attention stays inside an example and positions restart with each one
// (docs/ARCHITECTURE.md "Packed sequences"). A target in another segment than its input (the next
// example's first token) never counts in the loss. The batcher always builds the GLOBAL batch of a
// step, so the data does not depend on the rank layout; a rank keeps rows [row_begin, row_end) of it.
//
// Language-balanced sampling (data.temperature T != 1; M4's temperature sampling, GShard section 4):
// an epoch is still num_examples draws, but each draw first picks a language with probability
// p_l proportional to (n_l / n)^(1/T) (n_l: the language's examples a sequence can hold, n their
// sum), then takes that language's next example in the epoch's shuffled order, starting over when
// the language runs out (an upsampled language repeats, a downsampled one sees a fresh subset each
// epoch). The epoch's draws are a pure function of (seed, epoch), so the cursor stays (epoch,
// position) and a resumed run continues the same stream. T = 1 keeps the plain shuffled order.
//
// Encoder-decoder (model.arch = "encdec"; docs/ARCHITECTURE.md "Encoder-decoder"): each example
// `<lang> source SEP target EOS` is split at its first SEP. A row is an encoder sequence and a
// decoder sequence of seq_len tokens each: the encoder reads `<lang> source` (no loss), the decoder
// reads `BOS target` and predicts `target EOS`. Examples are packed back to back on both sides at
// once (the next one starts a new row when either side is full), with the same segment id on both
// sides; positions restart with each example on each side; each side's PAD tail is one more
// segment. A source longer than seq_len loses its end (the tag stays); an example whose
// `target EOS` exceeds seq_len is dropped (fit_encdec_example).
#pragma once
#include <cstdint>
#include <vector>

#include "data/dataset.hpp"
#include "deck/options.hpp"

namespace meshmoe {

struct Batch {
  int rows = 0, seq_len = 0;
  std::vector<int32_t> inputs;   // [rows, seq_len]
  std::vector<int32_t> targets;  // [rows, seq_len]
  std::vector<int32_t> lang;     // [rows, seq_len] language index of the target's example, -1 on PAD
  std::vector<float> mask;       // [rows, seq_len] 1 where the target counts in the loss
  std::vector<int32_t> segment;  // [rows, seq_len] example of the input token within its row (0, 1, ...)
  std::vector<int32_t> position; // [rows, seq_len] position of the input token within its example
  // encdec only (the fields above are then the decoder's): the encoder sequences, enc_len tokens each.
  int enc_len = 0;
  std::vector<int32_t> enc_inputs;    // [rows, enc_len]
  std::vector<int32_t> enc_segment;   // [rows, enc_len] the same example ids as the decoder's segment
  std::vector<int32_t> enc_position;  // [rows, enc_len]
  // Rows [row_begin, row_end) as a batch of their own.
  Batch slice(int row_begin, int row_end) const;
};

// What a sequence of seq_len + 1 tokens keeps of one example: its first `head` tokens, then the
// rest after `cut` more (the end of the source); `drop` when even its target does not fit.
struct ExampleFit {
  size_t head = 0, cut = 0;
  bool drop = false;
  size_t kept(size_t size) const { return drop ? 0 : size - cut; }
  bool truncated() const { return cut > 0; }
};
ExampleFit fit_example(const DataSplit& s, size_t e, int seq_len);

// What an encoder-decoder row keeps of one example (model.arch = "encdec"): SEP at index `sep`; the
// first `source` tokens on the encoder side (`cut` more of the source's end lost), the `target`
// tokens after SEP (`target EOS`) on the decoder side; `drop` when they exceed seq_len or the
// example has no SEP.
struct EncDecFit {
  size_t sep = 0, source = 0, cut = 0, target = 0;
  bool drop = false;
  bool truncated() const { return cut > 0; }
};
EncDecFit fit_encdec_example(const DataSplit& s, size_t e, int seq_len, int64_t sep_id);

// Examples of a split that a sequence of seq_len + 1 tokens (encdec: seq_len on each side) must
// truncate at the source or drop.
struct TooLong {
  size_t truncated = 0, dropped = 0;
};
TooLong count_too_long(const DataSplit& s, int seq_len, ModelArch arch = ModelArch::Decoder,
                       int64_t sep_id = Tokenizer::kSep);
// The same counts of a dataset a run trains or evaluates on; throws InputError, naming the file and
// split, when every example would be dropped, and for encdec when an example has no SEP.
TooLong check_examples_fit(const Dataset& data, int seq_len, ModelArch arch = ModelArch::Decoder);

// Where the batcher stands: the next example is order(epoch)[position]. Plain integers, so a
// checkpoint stores and restores it exactly.
struct DataCursor {
  uint64_t epoch = 0;
  uint64_t position = 0;
  bool operator==(const DataCursor&) const = default;
};

class Batcher {
 public:
  // shuffle: visit examples in a per-epoch permutation drawn from Philox keyed by (seed, epoch,
  // RngPurpose::DataShuffle); otherwise in file order. Throws InputError on seq_len < 1 or a
  // dataset without tokens, or one whose every example is too long to keep.
  // temperature != 1 (needs shuffle): language-balanced draws (above); InputError when T <= 0.
  // arch: how an example becomes a row (above).
  Batcher(const Dataset& data, int seq_len, uint64_t seed, bool shuffle, double temperature = 1.0,
          ModelArch arch = ModelArch::Decoder);

  // The next global batch of batch_size sequences.
  Batch next(int batch_size);
  // The next global batch, of which only rows [row_begin, row_end) are returned.
  Batch next(int batch_size, int row_begin, int row_end);

  DataCursor cursor() const { return cursor_; }
  void restore(DataCursor c);
  // The examples of its dataset that the sequences truncate or drop (check_examples_fit).
  const TooLong& too_long() const { return too_long_; }

  // Example indices in the visiting order of an epoch (a pure function of seed and epoch).
  std::vector<uint32_t> epoch_order(uint64_t epoch) const;
  // The probability with which a draw picks each language of the dataset's table: n_l / n at
  // temperature 1, else p_l as above (0 for a language without an example that fits).
  const std::vector<double>& language_probabilities() const { return lang_p_; }

 private:
  // One packed sequence of seq_len + 1 tokens.
  struct Row {
    std::vector<int32_t> tok, lng, seg, pos;
    std::vector<uint8_t> msk;
  };
  // Fills `row` (token, loss mask, language, segment, position) from the cursor on.
  void pack_row(Row& row);
  // encdec: fills the encoder row `enc` (token, segment, position) and the decoder row `dec` (its
  // tok holds the targets, inputs the decoder inputs) from the cursor on.
  void pack_encdec_row(Row& enc, Row& dec, std::vector<int32_t>& dec_inputs);
  // The example at the cursor (starting the next epoch when this one is done).
  uint32_t example_at_cursor();
  // Whether example e is dropped as too long for this model's rows (never drawn).
  bool drops(size_t e) const;
  void set_epoch(uint64_t epoch);
  std::vector<uint32_t> shuffled_order(uint64_t epoch) const;
  std::vector<uint32_t> language_draws(uint64_t epoch) const;

  const Dataset& data_;
  int seq_len_;
  ModelArch arch_;
  uint64_t seed_;
  bool shuffle_;
  double temperature_;
  std::vector<double> lang_p_;  // [L] probability of drawing each language
  DataCursor cursor_;
  std::vector<uint32_t> order_;  // of cursor_.epoch
  TooLong too_long_;
};

}  // namespace meshmoe
