// The input deck: TOML text -> validated Config. See schema.def for the keys.
#pragma once
#include <mpi.h>

#include <map>
#include <string>
#include <vector>

#include "deck/config.hpp"

namespace meshmoe {

struct Deck {
  Config cfg;
  std::string path;            // the file it came from ("<string>" for text)
  std::string effective_toml;  // every key (defaults included) after --set overrides, as TOML
  // The keys the file or --set gave ("model.d_model"), each with where: "file:line:col: " or "--set ...: ".
  std::map<std::string, std::string> given;
};

// What a deck is checked for: training (every rule), or a decoding command (generate, translate,
// eval: the rules of keys only training reads are skipped, such as mesh.pipe <= optim.micro_batches
// and the batch's divisibility; docs/user-guide.md "Translation").
enum class DeckUse { Train, Decode };

// The key an override "section.key=value" (--set) names, blanks trimmed ("" without one).
std::string override_key(const std::string& override_text);

// Parses and validates deck text; no MPI. `overrides` are "section.key=value" strings (--set),
// validated like the file. Throws InputError carrying every problem found, each naming the file,
// line and column and the key.
Deck parse_deck(const std::string& text, const std::string& path, const std::vector<std::string>& overrides = {},
                DeckUse use = DeckUse::Train);

// Rank 0 reads the file and validates; the verdict and the text are broadcast, so every rank
// returns the same Deck or throws the same InputError; no rank starts another collective on a
// bad deck.
Deck load_deck(const std::string& path, const std::vector<std::string>& overrides, MPI_Comm comm,
               DeckUse use = DeckUse::Train);

// Checks that need the launch: pipe * data * tensor must equal the world size.
// Throws InputError naming both numbers.
void check_world_size(const Config& cfg, int world_size);

// Markdown reference of every deck key (type, default, constraint, doc), grouped by section.
std::string deck_reference_markdown();

}  // namespace meshmoe
