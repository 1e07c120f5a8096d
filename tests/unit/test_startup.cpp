// The start-up sequence (src/run/startup.hpp, docs/ARCHITECTURE.md "One run"): each rank's
// placement, shape table and memory plan, computed once, are the ones the one-call functions
// compute for its coordinates (placement_at, ShapeTable, plan_memory, model_sharding's Comms); the
// model built from them is the model built from the deck; the memory check refuses a plan the node
// cannot hold; without a vocabulary nothing is planned and the report says why.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "mesh/mesh.hpp"
#include "model/transformer.hpp"
#include "run/startup.hpp"
#include "../test_util.hpp"

using namespace meshmoe;

namespace {

constexpr int kVocab = 50;

Config startup_deck() {
  Config c;
  c.model.vocab_size = kVocab;
  c.model.seq_len = 16;
  c.model.d_model = 32;
  c.model.num_layers = 4;
  c.model.num_heads = 4;
  c.model.d_ff = 64;
  c.moe.num_experts = 4;
  c.moe.every = 2;
  c.moe.group_size = 16;
  c.optim.batch_size = 8;
  c.optim.micro_batches = 2;
  c.run.max_memory = "64G";
  return c;
}

void check_same_plan(const MemoryPlan& got, const MemoryPlan& want) {
  CHECK(got.pipe_rank == want.pipe_rank);
  CHECK(got.data_rank == want.data_rank);
  CHECK(got.tensor_rank == want.tensor_rank);
  CHECK(got.params_total == want.params_total);
  CHECK(got.params_activated == want.params_activated);
  CHECK(got.params_rank == want.params_rank);
  CHECK(got.flops_per_token == want.flops_per_token);
  CHECK(got.param_bytes == want.param_bytes);
  CHECK(got.optim_bytes == want.optim_bytes);
  CHECK(got.activation_bytes == want.activation_bytes);
  CHECK(got.workspace_bytes == want.workspace_bytes);
  CHECK(got.pipeline_bytes == want.pipeline_bytes);
  CHECK(got.stash_bytes == want.stash_bytes);
  CHECK(got.sent_data == want.sent_data);
  CHECK(got.sent_tensor == want.sent_tensor);
  CHECK(got.sent_pipe == want.sent_pipe);
}

// This rank's pieces of a training start-up on `mesh` against the one-call functions.
void check_rank(const Config& cfg, Mesh& mesh) {
  const MeshShape shape = mesh.shape();
  const RankCoords at{mesh.coord(Axis::Pipe), mesh.coord(Axis::Data), mesh.coord(Axis::Tensor)};
  INFO(shape.str() << " at pipe " << at.pipe << " data " << at.data << " tensor " << at.tensor);
  const Startup start = Startup::training(cfg, mesh);
  REQUIRE(start.vocab() == kVocab);
  check_same_plan(start.plan(), plan_memory(cfg, kVocab, shape, at.pipe, at.data, at.tensor));

  const Placement want = placement_at(cfg, shape, at);
  CHECK(start.placement().pipe_rank == want.pipe_rank);
  CHECK(start.placement().data_rank == want.data_rank);
  CHECK(start.placement().tensor_rank == want.tensor_rank);
  CHECK(start.placement().expert_parallel == want.expert_parallel);

  const std::vector<ParamInfo> got = start.table().params(), table = ShapeTable(cfg, kVocab, shape, at, true).params();
  REQUIRE(got.size() == table.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].name == table[i].name);
    CHECK(got[i].local_shape == table[i].local_shape);
    CHECK(got[i].flat_offset == table[i].flat_offset);
  }

  // The Comms model_sharding hands out, and a model of the same parameters as the deck's.
  const Placement connected = start.placement_on(mesh), sharding = model_sharding(mesh, cfg);
  CHECK(connected.tensor == sharding.tensor);
  CHECK(connected.expert_group == sharding.expert_group);
  CHECK(connected.replica_group == sharding.replica_group);
  const Transformer<float> from_start(cfg, start.table(), connected), from_deck(cfg, kVocab, sharding);
  CHECK(from_start.params().size() == from_deck.params().size());
  CHECK(from_start.params().size() == size_t(start.plan().params_rank));
}

}  // namespace

TEST_CASE("startup: this rank's placement, shape table and plan are the deck's, each once", "[startup]") {
  if (test::world_size() != 1) return;
  Mesh mesh(MPI_COMM_WORLD, 1, 1, 1);
  const Config cfg = startup_deck();
  check_rank(cfg, mesh);

  // The stages' plans and the report that `meshmoe plan` prints.
  const Startup stages = Startup::stages(cfg, mesh);
  CHECK_THROWS_AS(stages.table(), std::logic_error);  // no rank of its own
  const std::string report = stages.memory_report(mesh.world());
  CHECK(report.find("model: ") == 0);
  CHECK(report.find("available memory: 64.00 GiB per node (run.max_memory = \"64G\"), 1 rank on the node: the plan fits") !=
        std::string::npos);

  // Forward only: no plan, and a table without the micro-batch's buffers unless the batch is checked.
  const Startup forward = Startup::forward_only(cfg, kVocab, mesh, false);
  CHECK(forward.table().letters().N == 0);
  CHECK_THROWS_AS(forward.plan(), std::logic_error);
  CHECK(Startup::forward_only(cfg, kVocab, mesh, true).table().letters().N == 8 / 2 * 16);

  // The Transformer refuses a table of another rank than its placement's.
  const ShapeTable other(cfg, kVocab, MeshShape{2, 1, 1}, RankCoords{1, 0, 0});
  CHECK_THROWS_AS(Transformer<float>(cfg, other, placement_at(cfg, MeshShape{2, 1, 1}, RankCoords{0, 0, 0})),
                  std::logic_error);
}

TEST_CASE("startup: the memory check refuses a plan the node cannot hold", "[startup]") {
  if (test::world_size() != 1) return;
  Mesh mesh(MPI_COMM_WORLD, 1, 1, 1);
  Config cfg = startup_deck();
  cfg.run.max_memory = "100K";
  CHECK_THROWS_WITH(Startup::training(cfg, mesh),
                    Catch::StartsWith("the plan needs") && Catch::Contains("more than the 100.00 KiB available"));
  cfg.run.device = Device::Cuda;  // GPU memory: not the node's
  CHECK_NOTHROW(Startup::training(cfg, mesh));
}

TEST_CASE("startup: without a vocabulary nothing is planned", "[startup]") {
  if (test::world_size() != 1) return;
  Mesh mesh(MPI_COMM_WORLD, 1, 1, 1);
  Config cfg = startup_deck();
  cfg.model.vocab_size = 0;
  cfg.data.path = test::scratch_dir() + "/startup-no-such-dataset.h5";
  const Startup start = Startup::training(cfg, mesh);
  CHECK(start.vocab() == 0);
  CHECK_THROWS_AS(start.table(), std::logic_error);
  CHECK_THROWS_AS(start.agree_vocab(kVocab, mesh.world()), InputError);
  CHECK(Startup::stages(cfg, mesh).memory_report(mesh.world()) ==
        "memory: not computed: model.vocab_size = 0 and the dataset " + cfg.data.path + " could not be read (dataset " +
            cfg.data.path + ": no such file; write one with `meshmoe prep gettext -o " + cfg.data.path +
            "`); set model.vocab_size to plan without data\n");
}

TEST_CASE("startup: every rank's pieces on 4 ranks", "[startup][mpi]") {
  if (test::world_size() != 4) return;
  Config cfg = startup_deck();
  for (const MeshShape shape : {MeshShape{2, 2, 1}, MeshShape{1, 2, 2}, MeshShape{2, 1, 2}, MeshShape{1, 4, 1}}) {
    Mesh mesh(MPI_COMM_WORLD, shape.pipe, shape.data, shape.tensor);
    cfg.moe.expert_axis = ExpertAxis::Data;
    check_rank(cfg, mesh);
    cfg.moe.expert_axis = ExpertAxis::Tensor;
    check_rank(cfg, mesh);
  }
  // Expert replicas (4 data ranks, groups of 2) and sharded optimizer state: every data rank's
  // state in the report.
  cfg.moe.expert_axis = ExpertAxis::Data;
  cfg.mesh.expert_parallel = 2;
  cfg.optim.shard_state = true;
  Mesh mesh(MPI_COMM_WORLD, 1, 4, 1);
  check_rank(cfg, mesh);
  const std::string report = Startup::stages(cfg, mesh).memory_report(mesh.world());
  if (test::world_rank() == 0) {
    std::string states = "optimizer state sharded over 4 data ranks (optim.shard_state; whole parameters), stage 0, data ranks 0-3:";
    for (int d = 0; d < 4; ++d) states += " " + std::to_string(plan_memory(cfg, kVocab, mesh.shape(), 0, d, 0).optim_bytes);
    CHECK(report.find(states) != std::string::npos);
  } else {
    CHECK(report.empty());
  }
}
