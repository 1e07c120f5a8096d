// `meshmoe eval` (docs/user-guide.md "Translation"): a checkpoint's validation loss overall and per language
// (the training run's evaluation sample, src/train/evaluate.hpp) and the BLEU and chrF of its
// translations of every language's validation sources (src/decode/translation_eval.hpp), printed
// as a table (languages by training examples, largest first) and written to an HDF5 file.
// Decodes on the deck's mesh as `meshmoe translate` does (no pipeline mesh, host only).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "decode/beam_search.hpp"
#include "deck/deck.hpp"
#include "mesh/mesh.hpp"

namespace meshmoe {

struct EvalCliOptions {
  std::string checkpoint;          // a checkpoint file, or a ckpt / run directory (its LATEST)
  BeamOptions beam;                // beam 1: greedy
  int batch = 16;                  // sources decoded together
  int64_t max_examples = 0;        // validation pairs translated per language; 0: all
  std::vector<std::string> langs;  // languages translated; empty: all
  std::string output;              // "": eval-<step>.h5 in the checkpoint's run directory
  std::string write_text;          // a directory for <lang>.src, <lang>.ref, <lang>.hyp; "": none
  bool allow_other_data = false;   // a checkpoint trained on other data than data.path: warn, go on
                                   // (checked by main before eval_main: check_checkpoint_data)
};

// The default output: eval-<step>.h5 in the run directory of `checkpoint` (the parent of its
// ckpt/ directory), or beside the file when it is not in a ckpt/ directory.
std::string default_eval_path(const std::string& checkpoint, int64_t step);

int eval_main(const Deck& deck, Mesh& mesh, const EvalCliOptions& opt, const std::string& version);

}  // namespace meshmoe
