// libFuzzer target for the input-deck parser (`make fuzz`; not part of `make check`).
// Any byte string is a possible deck: parse_deck must either return a Deck or throw InputError
// (a user error with a message). Anything else (another exception, a crash, a sanitizer report,
// an InputError without a message) is a bug the fuzzer stops on.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "deck/deck.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const meshmoe::Deck deck = meshmoe::parse_deck(text, "fuzz.toml", {});
    // A deck that parsed must round-trip: its effective deck is itself a valid deck.
    meshmoe::parse_deck(deck.effective_toml, "effective.toml", {});
  } catch (const meshmoe::InputError& e) {
    if (e.messages().empty() || e.messages().front().empty()) {
      std::fprintf(stderr, "InputError without a message\n");
      std::abort();
    }
  }
  return 0;
}
