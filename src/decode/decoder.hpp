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
#include "train/checkpoint.hpp"

namespace meshmoe {

// Refuses (InputError) what decoding cannot run on: a pipeline mesh, run.device = "cuda".
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
// The model of this rank's shards, no optimizer state (the routers' selection biases, with
// moe.balance = "bias", route as in training); rank 0's logits are every rank's.
Decoder load_decoder(const Deck& deck, Mesh& mesh, const std::string& checkpoint);

// The CachedModel of a whole model on the mesh: rank 0's logits broadcast at each step.
std::unique_ptr<CachedModel<float>> agreed_cached_model(Transformer<float>& model, Mesh& mesh);

// The tag token of `lang`; "" picks the dataset's only language (InputError when it has several,
// naming them, or when `lang` is not one of them).
int32_t language_tag(const Tokenizer& tokenizer, const std::string& lang, const std::string& data_path);

// What the model wrote, on one line (newlines become spaces).
std::string one_line(const Tokenizer& tok, const std::vector<int32_t>& ids);

// Collective: every rank translates every line (README "Translation"), `batch` lines at a time,
// and returns the translations (the same on every rank; the beam answers do not depend on
// `batch`). Decoder-only: `<tag> line SEP` is the prompt, and a line leaving no room in
// model.seq_len gets an empty translation; encdec: `<tag> line` goes to the encoder, cut at
// model.seq_len. `too_long(i, tokens)` is called for each such line i (0-based) with its length.
std::vector<std::string> translate_lines(CachedModel<float>& cached, const Tokenizer& tokenizer, int32_t tag,
                                         const std::vector<std::string>& lines, const BeamOptions& beam, int batch,
                                         const std::function<void(size_t, size_t)>& too_long = {});

}  // namespace meshmoe
