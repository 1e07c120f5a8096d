// `meshmoe generate` and `meshmoe translate` (README "Translation"): a deck's model with the
// parameters of a checkpoint, decoded over the KV cache on the deck's mesh.
//
// Every rank decodes every input, in lockstep: the MoE layers' all-to-all and the tensor axis'
// all-reduces need every rank of a group to run each step with the same tokens, and rank 0's
// logits are broadcast at each step so that all ranks take the same decisions
// (docs/ARCHITECTURE.md "Decoding"). On a pipeline mesh each stage runs its blocks and passes
// the stream on (src/decode/cached_model.hpp). Rank 0 prints. run.device = "cuda" is refused.
//
// translate with an encoder-decoder (model.arch = "encdec"): each source `<lang> line` goes to the
// encoder (its end cut at model.seq_len, as the Batcher cuts it), the decoder starts from BOS.
// generate refuses an encdec deck (it continues prompts; translate is the encdec's entry).
#pragma once
#include <string>
#include <vector>

#include "decode/beam_search.hpp"
#include "decode/sampling.hpp"
#include "deck/deck.hpp"
#include "mesh/mesh.hpp"

namespace meshmoe {

struct GenerateCliOptions {
  std::string checkpoint;            // a checkpoint file, or a ckpt / run directory (its LATEST)
  std::vector<std::string> prompts;  // one output line each
  std::string lang;                  // the tag before the prompt; default: the dataset's only language
  SamplingOptions sampling;
};
int generate_main(const Deck& deck, Mesh& mesh, const GenerateCliOptions& opt);

struct TranslateCliOptions {
  std::string checkpoint;
  std::string input;  // one source sentence per line; "" or "-": stdin
  std::string lang;   // the source language's tag; default: the dataset's only language
  BeamOptions beam;
  int batch = 16;     // sources decoded together
};
int translate_main(const Deck& deck, Mesh& mesh, const TranslateCliOptions& opt);

}  // namespace meshmoe
