// The deck of a decoding command (generate, translate, eval): the model from the checkpoint, the
// mesh from the ranks launched (docs/user-guide.md "Translation", "The checkpoint is enough").
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "deck/deck.hpp"

namespace meshmoe {

// Collective over `comm`. The deck the checkpoint that `checkpoint` names stores (its effective
// training deck), with, in this order:
//   1. the keys the file `deck_path` gives (none when ""), except [mesh] (its training mesh) and the
//      model's keys ([model], [moe]): a model key the file gives with another value than the
//      checkpoint's is refused (InputError naming the file, line, key and both values), but for the
//      decoding choices moe.expert_axis, moe.decode_capacity and moe.capacity_factor_eval;
//   2. the decoding mesh: the mesh.* keys `overrides` give; pipe and tensor 1 and data the ranks
//      left (world / (pipe x tensor)) where not given, mesh.expert_parallel 0 (as fits);
//   3. `overrides` (--set), every key.
// Checked as DeckUse::Decode. A checkpoint without a stored deck (written before decks were
// stored) takes `deck_path` as it is, or is refused without one.
Deck decoding_deck(const std::string& checkpoint, const std::string& deck_path, const std::vector<std::string>& overrides,
                   MPI_Comm comm);

}  // namespace meshmoe
