// A deck's model with a checkpoint's parameters, ready to decode (docs/ARCHITECTURE.md "Decoding",
// step 1), and translation of text lines with it: what `meshmoe translate`, `meshmoe generate`,
// `meshmoe eval` and the training run's BLEU (eval.bleu_every) share.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.hpp"
#include "data/tokenizer.hpp"
#include "decode/beam_search.hpp"
#include "decode/cached_model.hpp"
#include "deck/deck.hpp"
#include "mesh/mesh.hpp"
#include "model/transformer.hpp"
#include "checkpoint/checkpoint.hpp"

namespace meshmoe {

// Refuses (InputError) what decoding cannot run on: run.device = "cuda", expert-choice routing.
void check_decodable(const Config& cfg);

struct Decoder {
  Dataset valid;  // the dataset's valid split: the tokenizer, the languages, the validation pairs
  Tokenizer tokenizer;
  std::string checkpoint;  // the checkpoint file read
  CheckpointMeta meta;     // its step, trained tokens per language, ...
  std::unique_ptr<Transformer<float>> model;
  std::unique_ptr<CachedModel<float>> cached;
};

// Collective. `checkpoint`: a checkpoint file, or a ckpt / run directory whose LATEST names one.
// The model of this rank's shards (from Startup::forward_only, run/startup.hpp), no optimizer state
// (the routers' selection biases, with moe.balance = "bias", route as in training), its CachedModel
// as data_group_cached_model's.
Decoder load_decoder(const Deck& deck, Mesh& mesh, const std::string& checkpoint);

// The CachedModel of a whole model on the mesh, each data group decoding inputs of its own: the
// logits of the group's last pipe stage and tensor rank 0 are all its ranks' (broadcasts over pipe
// and tensor at each step), and the data ranks step together (an MoE all-to-all spans them; a
// rank out of tokens steps with none).
std::unique_ptr<CachedModel<float>> data_group_cached_model(Transformer<float>& model, Mesh& mesh);

// The tag token of `lang`; "" picks the dataset's only language (InputError when it has several,
// naming them, or when `lang` is not one of them).
int32_t language_tag(const Tokenizer& tokenizer, const std::string& lang, const std::string& data_path);

// What the model wrote, on one line (newlines become spaces).
std::string one_line(const Tokenizer& tok, const std::vector<int32_t>& ids);

// Lines [first, last) of `lines`, to translate with the language tag `tag`.
struct LineBatch {
  int32_t tag = 0;
  const std::vector<std::string>* lines = nullptr;
  size_t first = 0, last = 0;
};

// `lines` in batches of `batch` (the last one shorter), in order.
std::vector<LineBatch> line_batches(int32_t tag, const std::vector<std::string>& lines, int batch);

// One batch's translations, one per line, and for each line the tokens of a source too long for
// the model (0: it fits; decoder-only: `<tag> line SEP` leaves no room in model.seq_len and the
// translation is empty; encdec: `<tag> line` is cut at model.seq_len).
struct BatchTranslation {
  std::vector<std::string> text;
  std::vector<size_t> too_long;
  double seconds = 0;  // wall time of its decoding, on its data group
};

// Collective over the mesh: the batches `work` translated (beam search, `beam.beam` = 1: greedy),
// all of them on every rank at the end. They are split over the data axis in contiguous blocks
// (data rank d of `data` ranks: batches [n d / data, n (d + 1) / data)) and decoded in rounds,
// round r decoding the r-th batch of every block (an empty one where a block has ended: the steps stay collective over the
// data axis, CachedModel::more_steps); each round's translations then go to every rank. Batch b
// is decoded alone, as one rank would, so the translations do not depend on the mesh (docs/user-guide.md
// "The device mesh and parallelism"). Decoder-only: `<tag> line SEP` is the prompt; encdec: `<tag> line` goes to the encoder,
// each batch one encoder call. Before each round `stop()` (collective; 0 = go on) may end the
// work: its reason is returned in *stopped with the batches not done empty. `ready(b, batch b's
// translations)` is called on every rank for b = 0, 1, ... in order, as soon as batches 0..b have
// arrived.
std::vector<BatchTranslation> translate_batches(CachedModel<float>& cached, Comm& data, const Tokenizer& tokenizer,
                                                const std::vector<LineBatch>& work, const BeamOptions& beam,
                                                const std::function<int()>& stop = {},
                                                const std::function<void(size_t, const BatchTranslation&)>& ready = {},
                                                int* stopped = nullptr);

}  // namespace meshmoe
