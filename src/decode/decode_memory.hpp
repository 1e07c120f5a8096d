// The memory a decoding call allocates beyond the model (docs/user-guide.md "Translation", "Memory
// check"): the KV cache of every decoder block (beam x length per stream), the beam's visibility
// masks, the logits and the feed-forwards' buffers of the widest step. translate and generate check
// it against the node's available memory (check_node_memory, run/memory_limit.hpp) after the model
// is loaded and before decoding allocates, so that a --beam or --batch the node cannot hold is an
// input error (exit 2) instead of a run that grows until the kernel or std::bad_alloc stops it.
#pragma once
#include <string>

#include "deck/config.hpp"
#include "mesh/mesh.hpp"

namespace meshmoe {

struct DecodeShape {
  int streams = 1;   // sources (translate: --batch) or prompts (generate) decoded together
  int hyps = 1;      // hypotheses per stream (--beam; 1 for greedy and sampling)
  int max_new = 1;   // output tokens per hypothesis at most, already capped by model.seq_len
  int prompt = 1;    // tokens of the longest prompt, at most model.seq_len
};

// An upper bound of the bytes one rank allocates to decode `shape` with the model of `cfg` and
// vocabulary `vocab`: every decoder block counted on every rank and the attention unsharded, so
// that the bound holds on any mesh. In double: --beam 1e9 gives a large number, not an overflow.
double decode_memory_bytes(const Config& cfg, int vocab, const DecodeShape& shape);

// Collective over the mesh: throws InputError on every rank (exit 2) when the ranks of some node
// cannot hold decode_memory_bytes each; `what` names the command and its options in the message.
void check_decode_memory(const Config& cfg, int vocab, const DecodeShape& shape, const std::string& what, Mesh& mesh);

}  // namespace meshmoe
