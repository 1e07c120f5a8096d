// What a layer needs to know about the current step besides its inputs.
#pragma once
#include <cstdint>

#include "core/timers.hpp"

namespace meshmoe {

struct StepContext {
  uint64_t seed = 0;          // run.seed
  uint32_t step = 0;          // optimizer step (keys the random streams)
  bool training = true;       // dropout, jitter and random routing only in training
  uint64_t token_offset = 0;  // global index of this rank's first token in the step's batch, so
                              // random numbers are keyed by global token index (docs/ARCHITECTURE.md "Principles" 1)
  PhaseTimers* timers = nullptr;  // optional: layers time their stages with ScopedPhase(ctx.timers, "gate")
  // Packed sequences (docs/ARCHITECTURE.md "Packed sequences"), [N] each, device-readable, set by
  // Transformer::forward for its layers: the example each token belongs to within its sequence,
  // and its position within that example. Null: each sequence is one example (position n % T).
  const int32_t* segment = nullptr;
  const int32_t* position = nullptr;
  // Tokens per MoE routing group for this forward; 0: moe.group_size. Incremental decoding routes
  // the few new tokens of a step as one group of their own (docs/ARCHITECTURE.md "Decoding").
  int moe_group_size = 0;
  // Incremental decoding (decode/cached_model.hpp): MoE capacity by moe.decode_capacity.
  bool decoding = false;
};

}  // namespace meshmoe
