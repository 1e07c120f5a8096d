// The Hugging Face Mixtral layout of a model (docs/export.md "The Hugging Face Mixtral layout"):
// `meshmoe export --layout hf` writes meshmoe's logical tensors under the names and shapes of the
// Hugging Face Mixtral checkpoints (MixtralForCausalLM), with a MixtralConfig config.json, and
// `train --init-from` reads such a file back. Both directions only move elements (a Linear weight
// is stored [out, in], the transpose of meshmoe's x @ W operand; a gated w_in [E, M, 2, He] splits
// into w1 = [:, :, 0, :]^T and w3 = [:, :, 1, :]^T per expert), so a round trip is bitwise.
//
// The layout holds the Mixtral decoder only: RMSNorm, rotary positions with the rotate-half
// pairing (meshmoe's own, so q_proj and k_proj need no permutation of their rows), SwiGLU experts
// in every block, softmax over the experts then top-k renormalised, no biases, no shared experts.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "deck/config.hpp"
#include "deck/shape_rules.hpp"
#include "io/safetensors.hpp"

namespace meshmoe {

// Throws InputError listing every deck key whose value the Mixtral layout cannot hold (one line
// per key: its value and the value the layout needs); `what` begins each line ("export --layout hf").
void check_hf_layout_deck(const Config& cfg, const std::string& what);

// meshmoe's logical tensors (read_logical_tensors) of a deck that check_hf_layout_deck accepts ->
// the Mixtral tensors, in the model's order. Throws Error on a tensor the layout has no name for.
std::vector<SafeTensor> to_hf_layout(const std::vector<LogicalTensor>& tensors);

// True when the file holds Hugging Face layout names (model.embed_tokens.weight, model.layers.*).
bool is_hf_layout(const SafeTensorsFile& file);

// The Mixtral tensors of `file` -> meshmoe's names and logical shapes (experts gathered into
// [E, M, 2, He] and [E, He, M]); names the layout does not define are dropped. Throws InputError
// naming `path` and the tensor when the experts of a layer are not 0..E-1 with one shape each.
SafeTensorsFile from_hf_layout(const SafeTensorsFile& file, const std::string& path);

// MixtralConfig's config.json for the deck's model and vocabulary V, with the dataset's token ids.
std::string hf_config_json(const Config& cfg, int64_t vocab, int64_t bos_id, int64_t eos_id, int64_t pad_id);

}  // namespace meshmoe
