// What a resumed run changes against the deck its checkpoint was written with.
#pragma once
#include <string>
#include <vector>

#include "deck/config.hpp"

namespace meshmoe {

struct DeckChange {
  std::string key;            // "optim.lr"
  std::string before, after;  // TOML values, e.g. "0.001" and "0.0005"
  // False for keys that say where, how long or how the run is observed (run length, mesh, output,
  // evaluation, checkpoints, debugging, data.path): the trained model follows the same path.
  bool changes_training = true;
};

// Every key whose value differs, in schema order.
std::vector<DeckChange> deck_changes(const Config& before, const Config& after);

// "  optim.lr: 0.001 -> 0.0005" lines of the changes whose changes_training equals `training`.
std::string describe_changes(const std::vector<DeckChange>& changes, bool training);

}  // namespace meshmoe
