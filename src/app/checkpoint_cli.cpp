#include "app/checkpoint_cli.hpp"

#include <mpi.h>

#include <cstdio>
#include <map>

#include "core/error.hpp"
#include "core/sizes.hpp"
#include "checkpoint/checkpoint.hpp"
#include "deck/deck.hpp"
#include "model/placement.hpp"
#include "model/shape_table.hpp"

namespace meshmoe {

namespace {

// "" when the parameter tensors of `path` are those of the model its stored deck defines (names
// and logical shapes, from the shape table on one rank), else what differs first. "" too when the
// checkpoint stores no deck. Throws InputError when the stored deck does not parse.
std::string stored_model_mismatch(const std::string& path, const CheckpointMeta& m) {
  if (m.deck.empty()) return "";
  Config cfg = parse_deck(m.deck, path + " (its stored deck)", {}, DeckUse::Decode).cfg;
  cfg.mesh.expert_parallel = 0;  // one rank holds every expert
  std::map<std::string, std::vector<int64_t>> stored;
  for (const CheckpointTensorInfo& t : checkpoint_tensors(path, "params")) stored[t.name] = t.shape;
  int64_t vocab = cfg.model.vocab_size;
  if (const auto wte = stored.find("embed.wte"); vocab == 0 && wte != stored.end() && !wte->second.empty())
    vocab = wte->second[0];
  const MeshShape one{};
  const ShapeTable table(CheckedShapes(cfg, int(vocab), one, false), placement_at(cfg, one, RankCoords{0, 0, 0}));
  for (const ParamInfo& p : table.params()) {
    const auto at = stored.find(p.name);
    if (at == stored.end()) return "its stored deck's model has " + p.name + " " + shape_str(p.logical_shape) + ", the checkpoint does not";
    if (at->second != p.logical_shape)
      return p.name + " is " + shape_str(at->second) + ", its stored deck's model has " + shape_str(p.logical_shape);
    stored.erase(at);
  }
  // What is left the model does not have (std::map: the first by name, as before).
  if (!stored.empty())
    return "holds " + stored.begin()->first + " " + shape_str(stored.begin()->second) + ", which its stored deck's model has not";
  return "";
}

int ckpt_info(const std::string& path) {
  const CheckpointMeta m = read_checkpoint_meta(path);
  std::printf("checkpoint   %s\n", path.c_str());
  std::printf("step         %lld (optimizer updates %lld)\n", (long long)m.step, (long long)m.update_count);
  std::printf("mesh         %s\n", m.mesh.str().c_str());
  std::printf("version      %s\n", m.version.c_str());
  std::printf("seed         %llu\n", (unsigned long long)m.seed);
  std::printf("data cursor  epoch %llu, position %llu\n", (unsigned long long)m.data_cursor.epoch,
              (unsigned long long)m.data_cursor.position);
  std::printf("optimizer    %s\n", m.optimizer.c_str());
  std::printf("lineage      %s%s\n", m.lineage.empty() ? "(none: written before lineages)" : m.lineage.c_str(),
              m.forked_from.empty() ? "" : (", forked from " + m.forked_from).c_str());
  if (!m.data_fingerprint.empty())
    std::printf("data         %s: %s (fingerprint %s)\n", m.data_path.c_str(), m.data_summary.c_str(), m.data_fingerprint.c_str());
  for (const auto& [k, v] : m.counters) std::printf("counter      %s = %lld\n", k.c_str(), (long long)v);
  const auto params = checkpoint_tensors(path, "params"), optim = checkpoint_tensors(path, "optim");
  int64_t total = 0;
  for (const auto& t : params) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    total += n;
  }
  std::printf("parameters   %zu tensors, %lld elements\n", params.size(), (long long)total);
  for (const auto& t : params) std::printf("  %-40s %s\n", t.name.c_str(), shape_str(t.shape).c_str());
  std::printf("optimizer state  %zu tensors\n", optim.size());
  for (const auto& t : optim) std::printf("  %-40s %s\n", t.name.c_str(), shape_str(t.shape).c_str());
  std::printf("deck         %zu bytes (h5py: f.attrs['deck'])\n", m.deck.size());
  // The model its stored deck defines: what generate, translate and eval decode without a deck.
  if (!m.deck.empty()) try {
      const Config c = parse_deck(m.deck, path + " (its stored deck)", {}, DeckUse::Decode).cfg;
      std::string moe = "dense";
      if (c.moe.every > 0)
        moe = std::to_string(c.moe.num_experts) + " experts every " + std::to_string(c.moe.every) + " blocks (" +
              std::string(option_name(c.moe.router)) + ")";
      const std::string mesh = std::to_string(c.mesh.pipe) + "x" + std::to_string(c.mesh.data) + "x" + std::to_string(c.mesh.tensor);
      std::printf("model        %s, d_model %lld, %lld blocks, %lld heads, d_ff %lld, seq_len %lld, %s; trained on mesh "
                  "%s (pipe x data x tensor; decodes on any)\n",
                  std::string(option_name(c.model.arch)).c_str(), (long long)c.model.d_model, (long long)c.model.num_layers,
                  (long long)c.model.num_heads, (long long)c.model.d_ff, (long long)c.model.seq_len, moe.c_str(),
                  mesh.c_str());
    } catch (const InputError& e) {
      std::printf("model        its stored deck does not parse in this version: %s\n", e.what());
    }
  return kExitOk;
}
}  // namespace

int ckpt_main(const CkptCliOptions& opt) {
  int rc = kExitFailure, rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    try {
      const std::string path = find_named_checkpoint(opt.path);
      if (opt.action == "info") {
        rc = ckpt_info(path);
      } else if (opt.action == "verify") {
        VerifyResult v = verify_checkpoint(path);
        // The model of its stored deck, which generate, translate and eval decode without a deck.
        if (v.ok) try {
            if (const std::string why = stored_model_mismatch(path, read_checkpoint_meta(path)); !why.empty())
              v = {false, "its tensors are not the model its stored deck defines: " + why};
          } catch (const InputError& e) {
            // Not a fault of the file (a deck of another version): decoding it then needs a deck.
            std::fprintf(stderr, "meshmoe: note: %s: its stored deck does not parse in this version (%s): generate, "
                         "translate and eval need a deck for it\n", path.c_str(), e.messages().front().c_str());
          }
        if (v.ok) {
          std::printf("%s: %s\n", path.c_str(), v.message.c_str());
          rc = kExitOk;
        } else {
          std::fprintf(stderr, "meshmoe: checkpoint %s is bad: %s\n", path.c_str(), v.message.c_str());
          rc = kExitFailure;
        }
      } else {
        std::fprintf(stderr, "meshmoe: ckpt: unknown action '%s' (info, verify)\n", opt.action.c_str());
        rc = kExitInputError;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "meshmoe: ckpt %s: %s\n", opt.action.c_str(), e.what());
      rc = kExitFailure;
    }
    std::fflush(stdout);
    std::fflush(stderr);
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return rc;
}

}  // namespace meshmoe
