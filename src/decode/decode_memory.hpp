// The memory a decoding call allocates beyond the model (decode_memory_bytes, run/decode_bytes.hpp):
// translate and generate check it against the node's available memory (check_node_memory,
// run/memory_limit.hpp) after the model is loaded and before decoding allocates, so that a --beam or
// --batch the node cannot hold is an input error (exit 2) instead of a run that grows until the
// kernel or std::bad_alloc stops it.
#pragma once
#include <string>

#include "deck/config.hpp"
#include "mesh/mesh.hpp"
#include "run/decode_bytes.hpp"  // DecodeShape, decode_memory_bytes, kBleuBatch

namespace meshmoe {

// Collective over the mesh: throws InputError on every rank (exit 2) when the ranks of some node
// cannot hold decode_memory_bytes each; `what` names the command and its options in the message.
void check_decode_memory(const Config& cfg, int vocab, const DecodeShape& shape, const std::string& what, Mesh& mesh);

}  // namespace meshmoe
