#include "deck/deck_changes.hpp"

#include <array>
#include <string_view>

#include "deck/schema.hpp"

namespace meshmoe {

namespace {

// Sections and keys that leave the trained model's path unchanged: a run may be resumed with more
// steps, on another mesh (checkpoints reshard), into another directory, observed differently.
bool changes_training(const std::string& section, const std::string& key) {
  for (const std::string_view s : {"mesh", "eval", "checkpoint", "debug"})
    if (section == s) return false;
  if (section == "data" && key == "path") return false;  // the data's identity has its own check
  if (section != "run") return true;
  for (const std::string_view k : {"name", "out_dir", "steps", "log_every", "resume", "max_walltime", "max_bad_steps",
                                   "device", "threads", "grad_bucket_mb", "max_memory", "shm_collectives", "phase_sync",
                                   "peak_gflops"})
    if (key == k) return false;
  return true;  // run.seed
}

}  // namespace

std::vector<DeckChange> deck_changes(const Config& before, const Config& after) {
  std::vector<DeckChange> out;
  for (const deck::KeySpec& k : deck::schema()) {
    const deck::Value a = k.get(before), b = k.get(after);
    if (a == b) continue;
    out.push_back({k.name(), deck::toml_value(a), deck::toml_value(b), changes_training(k.section, k.key)});
  }
  return out;
}

std::string describe_changes(const std::vector<DeckChange>& changes, bool training) {
  std::string s;
  for (const DeckChange& c : changes)
    if (c.changes_training == training) s += "\n  " + c.key + ": " + c.before + " -> " + c.after;
  return s;
}

}  // namespace meshmoe
