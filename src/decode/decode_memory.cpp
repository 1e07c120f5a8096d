#include "decode/decode_memory.hpp"

#include <algorithm>

#include "run/memory_limit.hpp"

namespace meshmoe {

void check_decode_memory(const Config& cfg, int vocab, const DecodeShape& shape, const std::string& what, Mesh& mesh) {
  if (cfg.run.device != Device::Cpu) return;
  check_node_memory(decode_memory_bytes(cfg, vocab, shape), what + " (the KV cache of every decoder block, beam x length per source)",
                    cfg.run.max_memory,
                    "use a smaller --beam or --batch, fewer prompts, or set run.max_memory if the node has more",
                    mesh.world());
}

}  // namespace meshmoe
