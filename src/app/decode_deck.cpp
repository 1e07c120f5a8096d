#include "app/decode_deck.hpp"

#include <algorithm>
#include <set>

#include "checkpoint/checkpoint.hpp"
#include "core/error.hpp"
#include "deck/schema.hpp"
#include "mesh/agree.hpp"

namespace meshmoe {

namespace {

// Keys of [model] and [moe] that say how to decode or where the experts sit, not what was trained.
const std::set<std::string> kDecodingChoices = {"moe.expert_axis", "moe.decode_capacity", "moe.capacity_factor_eval"};

// The --set options of the [mesh] section.
std::vector<std::string> mesh_overrides(const std::vector<std::string>& overrides) {
  std::vector<std::string> out;
  for (const std::string& ov : overrides)
    if (override_key(ov).rfind("mesh.", 0) == 0) out.push_back(ov);
  return out;
}

// "mesh.pipe=1", ...: the mesh given with --set, the rest fitted to the `world` ranks.
std::vector<std::string> decoding_mesh(const std::vector<std::string>& overrides, int world) {
  const Deck given = parse_deck("", "--set", mesh_overrides(overrides), DeckUse::Decode);
  const auto& m = given.cfg.mesh;
  int64_t data = m.data;
  if (!given.given.count("mesh.data")) {
    if (world % (m.pipe * m.tensor) != 0)
      throw InputError("the " + std::to_string(world) + " ranks launched do not split into mesh.pipe x mesh.tensor = " +
                       std::to_string(m.pipe) + " x " + std::to_string(m.tensor) +
                       " groups: launch a multiple of " + std::to_string(m.pipe * m.tensor) +
                       " ranks, or give the whole mesh with --set mesh.data=...");
    data = world / (m.pipe * m.tensor);
  }
  return {"mesh.pipe=" + std::to_string(m.pipe), "mesh.data=" + std::to_string(data),
          "mesh.tensor=" + std::to_string(m.tensor), "mesh.expert_parallel=" + std::to_string(m.expert_parallel)};
}

}  // namespace

Deck decoding_deck(const std::string& checkpoint, const std::string& deck_path, const std::vector<std::string>& overrides,
                   MPI_Comm comm) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  const std::string file = resolve_named_checkpoint(checkpoint, "--checkpoint", comm);
  std::string stored;
  agree_on_input(comm, [&] {
    if (rank == 0) stored = read_checkpoint_meta(file).deck;
  });
  stored = broadcast_string(std::move(stored), 0, comm);
  if (stored.empty()) {
    if (deck_path.empty())
      throw InputError("--checkpoint " + file + ": the checkpoint stores no deck (written by an older meshmoe?): give "
                       "the deck it was trained with (meshmoe " "translate DECK --checkpoint ...)");
    return load_deck(deck_path, overrides, comm, DeckUse::Decode);
  }
  const std::string label = file + " (its stored deck)";
  const Deck trained = parse_deck(stored, label, {}, DeckUse::Decode);

  std::vector<std::string> composed, conflicts;
  if (!deck_path.empty()) {
    const Deck user = load_deck(deck_path, overrides, comm, DeckUse::Decode);
    for (const deck::KeySpec& k : deck::schema()) {
      const auto at = user.given.find(k.name());
      if (at == user.given.end() || at->second.rfind("--set ", 0) == 0 || k.section == "mesh") continue;
      const std::string mine = deck::toml_value(k.get(user.cfg)), theirs = deck::toml_value(k.get(trained.cfg));
      if ((k.section == "model" || k.section == "moe") && !kDecodingChoices.count(k.name())) {
        if (mine != theirs)
          conflicts.push_back(at->second + k.name() + " = " + mine + ", but the checkpoint " + file +
                              " was trained with " + k.name() + " = " + theirs);
        continue;
      }
      composed.push_back(k.name() + "=" + mine);
    }
  }
  if (!conflicts.empty()) {
    conflicts.push_back("the model's keys come from the checkpoint: drop them from " + deck_path +
                        " (or leave the deck out: the checkpoint is enough), or check that --checkpoint names the "
                        "model you mean");
    throw InputError(std::move(conflicts));
  }
  for (std::string& m : decoding_mesh(overrides, world)) composed.push_back(std::move(m));
  composed.insert(composed.end(), overrides.begin(), overrides.end());
  Deck deck = parse_deck(stored, label, composed, DeckUse::Decode);
  deck.path = deck_path.empty() ? file : deck_path;
  return deck;
}

}  // namespace meshmoe
