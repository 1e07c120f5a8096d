// `meshmoe generate` and `meshmoe translate` (docs/user-guide.md "Translation"): a deck's model with the
// parameters of a checkpoint, decoded over the KV cache on the deck's mesh.
//
// translate shares its batches of lines out over the data ranks (translate_batches, decoder.hpp);
// the ranks of a data group decode the same batch with the same tokens at each step, and the data
// ranks step together for the MoE all-to-all (docs/ARCHITECTURE.md "Decoding"). generate decodes
// its prompts on every data group alike. On a pipeline mesh each stage runs its blocks and passes
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

// The decoding options' ranges (docs/user-guide.md "Translation"): InputError naming the option, its
// value and the range. The output bounds (--max-new, --max-len) above model.seq_len are capped
// there later (with a note); --beam and --batch are bounded by the decoding memory check
// (decode/decode_memory.hpp). `command` names the command in the message (translate, eval).
void check_sampling_options(const SamplingOptions& sampling);
void check_beam_options(const std::string& command, const BeamOptions& beam, int batch);

// The output bound past model.seq_len is no bound: nothing decodes beyond it (decode/sampling.hpp,
// decode/beam_search.hpp). Says so on rank 0 when it caps a value other than the option's default.
int capped_by_seq_len(int value, int seq_len, int default_value, const std::string& command, const std::string& option,
                      int rank);

}  // namespace meshmoe
