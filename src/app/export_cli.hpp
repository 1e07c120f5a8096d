// `meshmoe export CKPT -o model.safetensors [--data DATA] [--layout hf [--config FILE]]`
// (docs/export.md): a checkpoint written on any mesh, read by one process in its logical
// (unsharded) tensors, written as a safetensors file (src/io/safetensors.hpp) whose metadata holds
// the effective deck and the tokenizer of the dataset it was trained on, so that
// postprocess/meshmoe_torch.py and `train --init-from` need nothing else; with --layout hf under
// the Hugging Face Mixtral names, with a config.json (checkpoint/hf_layout.hpp). Rank 0 works,
// every rank returns its exit code: 0 written, 2 bad input (a checkpoint or dataset that cannot be
// read, an output that is the input, a deck the hf layout cannot hold), 1 a failure to write.
#pragma once
#include <string>

namespace meshmoe {

struct ExportCliOptions {
  std::string checkpoint;  // a file, or a ckpt / run directory (its LATEST)
  std::string output;
  std::string data;  // the dataset whose tokenizer goes into the metadata; empty: the checkpoint's data_path
  std::string layout = "meshmoe";  // meshmoe, or hf: the Hugging Face Mixtral names (checkpoint/hf_layout.hpp)
  std::string config;              // --layout hf: where config.json goes (-o DIR: DIR/config.json)
};
int export_main(const ExportCliOptions& opt, const std::string& version);

}  // namespace meshmoe
