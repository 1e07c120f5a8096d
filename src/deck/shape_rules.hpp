// The divisibility rules of a deck on its mesh, in one place (docs/ARCHITECTURE.md "The shape
// table"): the deck reports them with the file position of their keys (deck.cpp), the shape table
// (model/shape_table.hpp) and the memory plan refuse a deck that breaks one. Each rule makes one
// of the legend's local letters whole: heads_l, H_l, E_l, the expert H_l, the blocks of a stage,
// the batch rows B of a rank and its routing groups G.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "deck/config.hpp"

namespace meshmoe {

// A rule: `ok`, or the deck's error `message`; `keys` are the deck keys it involves (the deck places
// the message at the first one the deck gave, and skips the rule when one of them is already bad).
struct ShapeRule {
  std::vector<const char*> keys;
  bool ok = true;
  std::string message;
  bool batch = false;  // a rule of the micro-batch (the model's parameters do not depend on it)
};

// Every rule of `cfg` on a pipe x data x tensor mesh, in the order the deck reports them: the
// model's (heads, hidden units, experts, layers over the mesh axes) first, then the batch's.
std::vector<ShapeRule> shape_rules(const Config& cfg, int64_t pipe, int64_t data, int64_t tensor);

// P of mesh.expert_parallel resolved on a data axis of `data` ranks: the data ranks of an expert
// group, which hold every expert between them (E / P each) and run the MoE all-to-all; the data / P
// groups are each other's replicas (docs/ARCHITECTURE.md "Expert replicas"). The deck's value, or
// when 0 the largest P dividing both data and moe.num_experts. 1 when the experts are not split over
// data (moe.expert_axis = tensor, or no MoE layer).
int64_t expert_parallel(const Config& cfg, int64_t data);

// The key/value heads of the self-attention (model.kv_heads; its default 0 is model.num_heads): the
// one reading of the key, for the layers, the shape table, the checkpoint and the export.
int64_t kv_heads_of(const Config& cfg);

// Throws InputError with the message of the first failing rule of `rules` (with_batch: the batch's
// rules too).
void require_rules(const std::vector<ShapeRule>& rules, bool with_batch);

}  // namespace meshmoe
