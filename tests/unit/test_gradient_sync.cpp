// The data-parallel gradient all-reduce overlapped with the backward (parallel/gradient_sync.hpp):
// a few SGD steps of two micro-batches each, with tiny buckets (many of them, started during the
// last micro-batch's backward, the token embedding's rows that it does not embed first) and with the blocking all-reduce after the backward, on every mesh
// of this world with data > 1 (tied embeddings over pipe, experts over data, tensor > 1 included).
// Tolerance (stated): the parameters are bitwise equal. With 2 data ranks a + b is one rounding
// either way; with 4, Open MPI's blocking and non-blocking all-reduces could in principle pick
// summation orders that differ per message size, and this test is where that would show.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <numeric>
#include <random>

#include "../test_util.hpp"
#include "../support/model_support.hpp"
#include "../support/optim_support.hpp"
#include "mesh/mesh.hpp"
#include "mesh/mpi_comm.hpp"
#include "parallel/gradient_sync.hpp"
#include "parallel/pipeline_executor.hpp"

using namespace meshmoe;

namespace {

constexpr int kVocab = 64, kSeq = 8, kRows = 8, kMicro = 2;

Config overlap_config() {
  Config c;
  c.model.seq_len = kSeq;
  c.model.d_model = 8;
  c.model.num_layers = 4;
  c.model.num_heads = 2;
  c.model.d_ff = 12;
  c.model.activation = Activation::Gelu;
  c.model.tied_embeddings = true;
  c.model.dropout = 0.1;
  c.moe.num_experts = 4;
  c.moe.every = 2;
  c.moe.router = RouterKind::Top2;
  c.moe.expert_axis = ExpertAxis::Data;
  c.moe.group_size = kSeq;
  c.moe.aux_loss_coef = 1e-1;
  c.moe.z_loss_coef = 1e-2;
  return c;
}

struct Trained {
  std::vector<float> weights;
  int fewest_started_in_backward = 1 << 30;  // over the steps
  size_t buckets = 0;
};

// `steps` SGD steps (w -= 0.1 g) of the whole trainer's gradient path on `mesh`; node_shared: the
// weights and gradients in memory the data axis's collectives read directly, as the Trainer's.
Trained train(const Config& cfg, Mesh& mesh, size_t bucket_elems, int steps, bool node_shared = false) {
  Placement placement = model_sharding(mesh, cfg);
  if (node_shared) placement.data = &mesh.axis(Axis::Data);
  Transformer<float> model(cfg, kVocab, placement);
  CHECK(model.params().node_shared() == (node_shared && mesh.extent(Axis::Data) > 1));
  model.init(7, 1.0);
  PhaseTimers timers;
  PipelineExecutor exec(model, mesh, timers);
  GradientSync sync(model, mesh, bucket_elems, cfg.model.tied_embeddings);
  Trained out;
  for (int step = 0; step < steps; ++step) {
    const Batch batch = test::random_batch(kRows, kSeq, kVocab, uint32_t(100 + step), 4);
    double mask_total = 0;
    for (float m : batch.mask) mask_total += m;
    const double tokens = kRows * kSeq;
    const LossWeights w{1.0 / mask_total, cfg.moe.aux_loss_coef / (tokens / kSeq), cfg.moe.z_loss_coef / tokens};
    auto& P = model.params();
    P.zero_grad();
    std::vector<Micro> micros =
        split_micro_batches(batch, kMicro, mesh.extent(Axis::Data), mesh.coord(Axis::Data), 5, step, true, nullptr);
    sync.begin_step(int(micros.size()), std::span(batch.inputs).last(size_t(kRows / kMicro) * kSeq));
    exec.train(micros, w, [](const ForwardStats&) {});
    exec.sync_tied_embedding(cfg.model.tied_embeddings);
    sync.reduce_over_data();
    out.fewest_started_in_backward = std::min(out.fewest_started_in_backward, sync.buckets_started_in_backward());
    for (size_t i = 0; i < P.size(); ++i) P.weights()[i] -= 0.1f * P.grads()[i];
  }
  out.weights.assign(model.params().weights(), model.params().weights() + model.params().size());
  out.buckets = sync.num_buckets();
  return out;
}

}  // namespace

TEST_CASE("gradient sync: buckets overlapped with the backward give the blocking path's parameters bitwise",
          "[grad_sync][mpi]") {
  const int W = test::world_size();
  struct Shape {
    int pipe, data, tensor;
  };
  std::vector<Shape> shapes;
  if (W >= 2) shapes.push_back({1, W, 1});
  if (W == 4) {
    shapes.push_back({2, 2, 1});
    shapes.push_back({1, 2, 2});
  }
  if (shapes.empty()) SUCCEED("needs at least 2 ranks");
  for (const Shape& s : shapes) {
    Mesh mesh(MPI_COMM_WORLD, s.pipe, s.data, s.tensor);
    INFO("mesh pipe=" << s.pipe << " data=" << s.data << " tensor=" << s.tensor << ", rank " << mesh.rank());
    const Config cfg = overlap_config();
    const Trained blocking = train(cfg, mesh, 0, 3);
    const Trained overlapped = train(cfg, mesh, 5, 3);  // 5 floats: several buckets per layer
    CHECK(blocking.buckets == 0);
    CHECK(overlapped.buckets > 20);
    CHECK(overlapped.fewest_started_in_backward > 0);  // the overlap happened in every step
    REQUIRE(overlapped.weights.size() == blocking.weights.size());
    size_t differ = 0;
    for (size_t i = 0; i < blocking.weights.size(); ++i) differ += overlapped.weights[i] != blocking.weights[i];
    CHECK(differ == 0);
  }
}

// The Trainer's weights and gradients live in node-shared memory, where the shared-memory
// collectives sum and gather in place (mesh/shm_collectives.hpp): training gives bitwise the
// parameters of private memory summed through the window's slots (both add in rank order).
TEST_CASE("gradient sync: node-shared weights and gradients train bitwise as private ones", "[grad_sync][mpi]") {
  const int W = test::world_size();
  std::vector<std::array<int, 3>> shapes;  // pipe, data, tensor
  if (W >= 2) shapes.push_back({1, W, 1});
  if (W == 4) shapes.push_back({2, 2, 1}), shapes.push_back({1, 2, 2});
  if (shapes.empty()) SUCCEED("needs at least 2 ranks");
  ShmSettings small;  // the tiny model's gradient runs take the window
  small.min_bytes = 64;
  small.slot_bytes = 4096;
  for (const auto& [pipe, data, tensor] : shapes) {
    Mesh mesh(MPI_COMM_WORLD, pipe, data, tensor);
    mesh.set_shm(small);
    INFO("mesh pipe=" << pipe << " data=" << data << " tensor=" << tensor << ", rank " << mesh.rank());
    const Config cfg = overlap_config();
    const Trained private_memory = train(cfg, mesh, 0, 3, false);
    const Trained node_shared = train(cfg, mesh, 0, 3, true);
    REQUIRE(node_shared.weights.size() == private_memory.weights.size());
    size_t differ = 0;
    for (size_t i = 0; i < node_shared.weights.size(); ++i) differ += node_shared.weights[i] != private_memory.weights[i];
    CHECK(differ == 0);
  }
}

namespace {

// One step's gradients of `model` on `mesh` (after reduce_over_data) and the global norm.
struct StepGrads {
  double norm = 0;
};
StepGrads step_grads(const Config& cfg, Transformer<float>& model, Mesh& mesh, GradientSync& sync, const Batch& batch) {
  double mask_total = 0;
  for (float m : batch.mask) mask_total += m;
  const double tokens = kRows * kSeq;
  const LossWeights w{1.0 / mask_total, cfg.moe.aux_loss_coef / (tokens / kSeq), cfg.moe.z_loss_coef / tokens};
  PhaseTimers timers;
  PipelineExecutor exec(model, mesh, timers);
  model.params().zero_grad();
  std::vector<Micro> micros =
      split_micro_batches(batch, kMicro, mesh.extent(Axis::Data), mesh.coord(Axis::Data), 5, 1, true, nullptr);
  sync.begin_step(int(micros.size()));
  exec.train(micros, w, [](const ForwardStats&) {});
  exec.sync_tied_embedding(cfg.model.tied_embeddings);
  sync.reduce_over_data();
  return {sync.global_norm()};
}

}  // namespace

// Expert replicas (docs/ARCHITECTURE.md "Expert replicas"): with expert groups of P < data ranks
// each expert's gradient is summed over its replica group, so every replica holds the whole
// batch's gradient, bitwise alike; the dense gradients are summed over data as before. Oracle: the
// one-rank model on the same batch (tolerance 1e-5 of each parameter's largest gradient: the
// sums run in another order), and the one-rank global norm (1e-5 relative).
TEST_CASE("gradient sync: expert replicas sum their gradients over the replica group", "[grad_sync][mpi]") {
  if (test::world_size() != 4) {
    SUCCEED("needs 4 ranks");
    return;
  }
  struct Case {
    int pipe, data, tensor, experts, expert_parallel, replicas;
  };
  for (const Case& c : {Case{1, 4, 1, 4, 2, 2}, Case{1, 4, 1, 2, 0, 2}, Case{1, 4, 1, 4, 1, 4}, Case{1, 2, 2, 4, 1, 2},
                        Case{2, 2, 1, 2, 1, 2}}) {
    Config cfg = overlap_config();
    cfg.moe.num_experts = c.experts;
    cfg.mesh.expert_parallel = c.expert_parallel;
    Mesh mesh(MPI_COMM_WORLD, c.pipe, c.data, c.tensor);
    INFO("mesh pipe=" << c.pipe << " data=" << c.data << " tensor=" << c.tensor << ", E = " << c.experts
                      << ", mesh.expert_parallel = " << c.expert_parallel << ", rank " << mesh.rank());
    const int P = int(expert_parallel(cfg, c.data));
    CHECK(c.data / P == c.replicas);
    Transformer<float> model(cfg, kVocab, model_sharding(mesh, cfg));
    model.init(7, 1.0);
    GradientSync sync(model, mesh, 0, cfg.model.tied_embeddings);
    Mesh self(MPI_COMM_SELF, 1, 1, 1);
    Config one_rank = cfg;
    one_rank.mesh.expert_parallel = 0;  // a placement key: one rank has no expert groups
    Transformer<float> whole(one_rank, kVocab);
    whole.init(7, 1.0);
    GradientSync whole_sync(whole, self);
    const Batch batch = test::random_batch(kRows, kSeq, kVocab, 321u, 4);
    const double norm = step_grads(cfg, model, mesh, sync, batch).norm;
    const double whole_norm = step_grads(cfg, whole, self, whole_sync, batch).norm;
    CHECK(std::abs(norm - whole_norm) <= 1e-5 * whole_norm);

    int experts_seen = 0;
    for (const ParamInfo& p : model.params().infos()) {
      INFO("parameter " << p.name);
      const bool expert = p.name.find(".moe.experts.") != std::string::npos;
      // experts split over data have replicas exactly when an expert group is smaller than data
      if (expert && P > 1) CHECK(bool(p.sharded_over & kShardReplicas) == (P < c.data));
      if (!expert || P == 1) CHECK(!(p.sharded_over & (kShardData | kShardReplicas)));
      experts_seen += expert;
      const ParamInfo* wp = test::find_param(whole.params(), p.name);
      REQUIRE(wp != nullptr);
      const float* g = model.params().grads() + p.flat_offset;
      double largest = 0, worst = 0;
      for (size_t i = 0; i < p.size; ++i) {
        const double want = whole.params().grads()[wp->flat_offset + test::logical_index(p, i)];
        largest = std::max(largest, std::abs(want));
        worst = std::max(worst, std::abs(double(g[i]) - want));
      }
      CHECK(worst <= 1e-5 * largest);
      if (p.sharded_over & kShardReplicas) {  // the replicas hold bitwise the same sum
        std::vector<float> mine(g, g + p.size), most = mine;
        model.placement().replica_group->all_reduce(most.data(), most.size(), Op::Max);
        CHECK(most == mine);
      }
    }
    CHECK(experts_seen > 0);
    // With replicas, the overlapped buckets give bitwise the blocking path's training too.
    if (P > 1 && P < c.data) {
      const Trained blocking = train(cfg, mesh, 0, 2), overlapped = train(cfg, mesh, 5, 2);
      CHECK(overlapped.weights == blocking.weights);
    }
  }
}

// The data ranks share the norm of the data-replicated gradients (each takes its state owners'
// entries, parallel/state_shards.hpp) whether the optimizer state is sharded or not. Oracle: every
// data rank holds the summed gradients after reduce_over_data (unsharded), so the one-rank sum of
// all entries in store order, taken on this rank, is the same double sums in the same order:
// bitwise equal, on every data rank; and the sharded sync gives bitwise the same norm.
TEST_CASE("gradient sync: the data ranks share the norm, bitwise the one-rank order", "[grad_sync][mpi]") {
  if (test::world_size() < 2) {
    SUCCEED("needs 2 or more ranks");
    return;
  }
  Config cfg = overlap_config();
  cfg.moe.every = 0;  // dense: every parameter is replicated over data
  Mesh mesh(MPI_COMM_WORLD, 1, test::world_size(), 1);
  const Batch batch = test::random_batch(kRows, kSeq, kVocab, 654u, 4);
  double norms[2] = {0, 0};
  for (const bool shard : {false, true}) {
    INFO("optim.shard_state = " << shard << ", rank " << mesh.rank());
    Transformer<float> model(cfg, kVocab, model_sharding(mesh, cfg));
    model.init(7, 1.0);
    GradientSync sync(model, mesh, 0, cfg.model.tied_embeddings, nullptr, shard);
    norms[shard] = step_grads(cfg, model, mesh, sync, batch).norm;
    if (!shard) {
      std::vector<size_t> every(model.params().infos().size());
      std::iota(every.begin(), every.end(), size_t(0));
      CHECK(norms[0] == std::sqrt(test::grad_sum_squares(model.params(), every)));
    }
  }
  CHECK(norms[1] == norms[0]);
}

// The entries the optimizer updates: all of them on every rank unless the state is sharded, then
// each data-replicated entry on exactly one data rank.
TEST_CASE("gradient sync: the optimizer's entries, sharded or not", "[grad_sync][mpi]") {
  Config cfg = overlap_config();
  cfg.moe.every = 0;
  Mesh self(MPI_COMM_SELF, 1, 1, 1), world(MPI_COMM_WORLD, 1, test::world_size(), 1);
  for (Mesh* mesh : {&self, &world})
    for (const bool shard : {false, true}) {
      INFO("data ranks " << mesh->extent(Axis::Data) << ", optim.shard_state = " << shard);
      Transformer<float> model(cfg, kVocab, model_sharding(*mesh, cfg));
      GradientSync sync(model, *mesh, 0, cfg.model.tied_embeddings, nullptr, shard);
      const size_t entries = model.params().infos().size();
      if (!shard || mesh->extent(Axis::Data) == 1) {
        CHECK(sync.owned_entries().size() == entries);
        continue;
      }
      std::vector<int> owned(entries, 0);
      for (size_t e : sync.owned_entries()) owned[e] = 1;
      mesh->axis(Axis::Data).all_reduce(owned.data(), owned.size(), Op::Sum);
      CHECK(owned == std::vector<int>(entries, 1));
    }
}
