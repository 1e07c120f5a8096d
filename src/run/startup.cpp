#include "run/startup.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/error.hpp"
#include "data/dataset.hpp"
#include "mesh/agree.hpp"
#include "run/memory_limit.hpp"

namespace meshmoe {

namespace {
RankCoords coords_of(const Mesh& mesh) {
  return {mesh.coord(Axis::Pipe), mesh.coord(Axis::Data), mesh.coord(Axis::Tensor)};
}
}  // namespace

Startup::Startup(const Config& cfg, const MeshShape& shape, RankCoords me) : cfg_(&cfg), mesh_(shape), me_(me) {}

Startup Startup::training(const Config& cfg, const Mesh& mesh) {
  Startup s(cfg, mesh.shape(), coords_of(mesh));
  s.plan_stages(mesh.world(), true);
  if (s.vocab_ > 0) check_memory_plan(cfg, s.stage_plans_[size_t(s.me_.pipe)], mesh.world());
  return s;
}

Startup Startup::stages(const Config& cfg, const Mesh& mesh) { return stages(cfg, mesh.shape(), mesh.world()); }

Startup Startup::stages(const Config& cfg, const MeshShape& shape, MPI_Comm world) {
  Startup s(cfg, shape, RankCoords{0, 0, 0});
  s.plan_stages(world, false);
  return s;
}

Startup Startup::forward_only(const Config& cfg, int vocab, const Mesh& mesh, bool with_batch) {
  Startup s(cfg, mesh.shape(), coords_of(mesh));
  s.vocab_ = vocab;
  s.checked_.emplace(cfg, vocab, s.mesh_, with_batch);
  s.placement_ = placement_at(cfg, s.mesh_, s.me_);
  s.table_.emplace(*s.checked_, s.placement_);
  return s;
}

void Startup::plan_stages(MPI_Comm world, bool mine) {
  const Config& cfg = *cfg_;
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  // Only the dataset's attributes and sizes: its tokens are loaded after the memory check. Every
  // rank holds the whole train and valid splits and the batcher's order of the train examples
  // (4 bytes each, data/batcher.hpp).
  vocab_ = int(cfg.model.vocab_size);
  int64_t dataset_bytes = 0;
  if (rank == 0) {
    try {
      const DatasetInfo info = Dataset::read_info(cfg.data.path);
      if (vocab_ == 0) vocab_ = int(info.vocab_size);
      dataset_bytes = info.train_bytes + info.valid_bytes + info.train_examples * int64_t(sizeof(uint32_t));
    } catch (const std::exception& e) {
      if (vocab_ == 0) no_vocab_ = e.what();  // with model.vocab_size a plan without data counts none
    }
  }
  MPI_Bcast(&vocab_, 1, MPI_INT, 0, world);
  MPI_Bcast(&dataset_bytes, 1, MPI_INT64_T, 0, world);
  if (vocab_ <= 0) return;
  checked_.emplace(cfg, vocab_, mesh_, true);
  for (int p = 0; p < mesh_.pipe; ++p) {
    const Placement place = placement_at(cfg, mesh_, RankCoords{p, 0, 0});
    ShapeTable table(*checked_, place);
    if (p == 0) counts_ = model_counts(cfg, table);
    stage_plans_.push_back(plan_memory(cfg, table, counts_));
    add_process_memory(cfg, vocab_, size_t(dataset_bytes), stage_plans_.back());
    if (mine && me_.pipe == p && me_.data == 0 && me_.tensor == 0) {
      placement_ = place;
      table_.emplace(std::move(table));
      plan_ = stage_plans_.back();
    }
  }
  if (mine && !table_) {
    placement_ = placement_at(cfg, mesh_, me_);
    table_.emplace(*checked_, placement_);
    plan_ = plan_memory(cfg, *table_, counts_);
    add_process_memory(cfg, vocab_, size_t(dataset_bytes), *plan_);
  }
}

const Placement& Startup::placement() const {
  if (!table_) throw std::logic_error("Startup: no placement of this rank (no vocabulary, or a plan of the stages only)");
  return placement_;
}

const ShapeTable& Startup::table() const {
  if (!table_) throw std::logic_error("Startup: no shape table of this rank (no vocabulary, or a plan of the stages only)");
  return *table_;
}

const MemoryPlan& Startup::plan() const {
  if (!plan_) throw std::logic_error("Startup: no memory plan of this rank (not a training start-up)");
  return *plan_;
}

Placement Startup::placement_on(Mesh& mesh) const { return model_sharding(mesh, placement()); }

void Startup::agree_vocab(int vocab, MPI_Comm world) const {
  agree_on_input(world, [&] {
    if (vocab > 0 && vocab == vocab_) return;
    throw InputError("data.path " + cfg_->data.path + ": a vocabulary of " + std::to_string(vocab) +
                     " tokens, but the start-up read " + (vocab_ > 0 ? std::to_string(vocab_) : std::string("none")) +
                     " on rank 0 before the data was loaded (another file on another node, or the file rewritten since?)");
  });
}

std::string Startup::memory_report(MPI_Comm world, const NodeShare* planned) const {
  const Config& cfg = *cfg_;
  const NodeShare share = planned ? *planned : node_share(cfg.run.max_memory, world);
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  if (rank != 0) return "";
  if (vocab_ <= 0)
    return "memory: not computed: model.vocab_size = 0 and the dataset " + cfg.data.path + " could not be read (" +
           no_vocab_ + "); set model.vocab_size to plan without data\n";
  // With optim.shard_state the data ranks of a stage hold different optimizer state: their plans too.
  std::vector<std::vector<MemoryPlan>> stages;
  for (int p = 0; p < mesh_.pipe; ++p) {
    std::vector<MemoryPlan>& plans = stages.emplace_back(1, stage_plans_[size_t(p)]);
    for (int d = 1; cfg.optim.shard_state && d < mesh_.data; ++d) {
      plans.push_back(plan_memory(cfg, ShapeTable(*checked_, placement_at(cfg, mesh_, RankCoords{p, d, 0})), counts_));
      add_process_memory(cfg, vocab_, stage_plans_[size_t(p)].dataset_bytes, plans.back());
    }
  }
  std::string text = meshmoe::memory_report(cfg, mesh_, stages, share.per_rank);
  if (share.per_rank > 0) {
    double need = 0;
    for (const MemoryPlan& p : stage_plans_) need = std::max(need, double(p.total_bytes()));
    text += "available memory: " + format_bytes(share.per_rank * share.ranks) + " per node (" + share.source + "), " +
            std::to_string(share.ranks) + (share.ranks == 1 ? " rank" : " ranks") + " on the node: " +
            (need <= share.per_rank ? "the plan fits" : "the plan does NOT fit (meshmoe train refuses it)") + "\n";
  }
  return text;
}

}  // namespace meshmoe
