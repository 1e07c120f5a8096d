// The placement object (src/model/placement.hpp) against hand-written values: the expert range,
// the expert group and the replicas of a rank on a few meshes, and on a real mesh the Comms that
// model_sharding hands out (members and ranks written out for 4 ranks).
#include <catch2/catch.hpp>

#include <vector>

#include "../test_util.hpp"
#include "deck/config.hpp"
#include "mesh/mesh.hpp"
#include "model/placement.hpp"
#include "model/shape_table.hpp"

using namespace meshmoe;

namespace {

constexpr int kM = 4, kH = 16;  // model width, expert d_ff

Config placement_deck(int E, ExpertAxis axis, int expert_parallel = 0) {
  Config c;
  c.model.d_model = kM;
  c.moe.every = 1;
  c.moe.num_experts = E;
  c.moe.expert_d_ff = kH;
  c.moe.expert_axis = axis;
  c.mesh.expert_parallel = expert_parallel;
  return c;
}

// What one rank should hold: P, its rank in the expert group, the replicas of its experts, its
// experts [e0, e0 + E_l) and hidden units [h0, h0 + H_l), and the sharded_over bits.
struct Expected {
  int P, expert_rank, replicas, e0, E_l, h0, H_l;
  uint8_t sharded_over;
};

void check_experts(const Config& cfg, const MeshShape& mesh, RankCoords at, const Expected& want) {
  INFO(mesh.str() << " at pipe " << at.pipe << " data " << at.data << " tensor " << at.tensor);
  const Placement p = placement_at(cfg, mesh, at);
  CHECK(p.expert_parallel == want.P);
  CHECK(p.expert_rank() == want.expert_rank);
  CHECK(p.replicas() == want.replicas);
  const ExpertShape s = p.expert_shape(kM, cfg.moe.num_experts, kH, Activation::Relu);
  CHECK(s.E == cfg.moe.num_experts);
  CHECK(s.e0 == want.e0);
  CHECK(s.E_l == want.E_l);
  CHECK(s.ffn.h0 == want.h0);
  CHECK(s.ffn.H_l == want.H_l);
  CHECK(int(s.sharded_over) == int(want.sharded_over));
  CHECK(p.expert_group == nullptr);  // sizes only
  CHECK(p.replica_group == nullptr);
  CHECK(p.tensor == nullptr);
}

}  // namespace

TEST_CASE("placement_at: expert ranges, groups and replicas on a few meshes", "[placement]") {
  const ExpertAxis data = ExpertAxis::Data, tensor = ExpertAxis::Tensor;
  // 8 experts over data = 4 (P = gcd(8, 4) = 4), hidden units over tensor = 2 (Switch 5.5).
  check_experts(placement_deck(8, data), {1, 4, 2}, {0, 3, 1}, {4, 3, 1, 6, 2, 8, 8, kShardData | kShardTensor});
  check_experts(placement_deck(8, data), {1, 4, 2}, {0, 0, 0}, {4, 0, 1, 0, 2, 0, 8, kShardData | kShardTensor});
  // mesh.expert_parallel = 2 on data = 8: data rank 5 is rank 1 of expert group [4, 6), 4 replicas.
  check_experts(placement_deck(8, data, 2), {1, 8, 1}, {0, 5, 0}, {2, 1, 4, 4, 4, 0, 16, kShardData | kShardReplicas});
  // 6 experts on data = 4: P = gcd(6, 4) = 2, data rank 2 is rank 0 of its group, experts [0, 3).
  check_experts(placement_deck(6, data), {1, 4, 1}, {0, 2, 0}, {2, 0, 2, 0, 3, 0, 16, kShardData | kShardReplicas});
  // 8 experts on data = 3: P = 1, every rank holds every expert, nothing split.
  check_experts(placement_deck(8, data), {1, 3, 1}, {0, 2, 0}, {1, 0, 3, 0, 8, 0, 16, kShardNone});
  // Pipeline-MoE: 8 experts over tensor = 4, whole experts; P = 1 whatever the data axis.
  check_experts(placement_deck(8, tensor), {2, 2, 4}, {1, 1, 2}, {1, 0, 2, 4, 2, 0, 16, kShardTensor});
  // One rank: everything here.
  check_experts(placement_deck(8, data), {1, 1, 1}, {0, 0, 0}, {1, 0, 1, 0, 8, 0, 16, kShardNone});

  const Placement p = placement_at(placement_deck(8, tensor), {2, 2, 4}, {1, 1, 2});
  CHECK((p.pipe_rank == 1 && p.pipe_size == 2 && p.data_rank == 1 && p.data_size == 2 && p.tensor_rank == 2 &&
         p.tensor_size == 4));
  CHECK((!p.first_stage() && p.last_stage()));
  CHECK((p.expert_parallel_tensor() && !p.expert_parallel_data() && !p.hidden_split()));
  // The shared experts (n H = 32) split over tensor like a dense feed-forward: [16, 24) at rank 2.
  const FfnShape shared = p.shared_shape(kM, 32, Activation::Relu);
  CHECK((shared.h0 == 16 && shared.H_l == 8));
}

TEST_CASE("model_sharding: the Comms of the expert and replica groups on 4 ranks", "[placement][mpi]") {
  if (test::world_size() != 4) return;
  const int r = test::world_rank();
  auto members = [](Comm* c) {
    std::vector<int32_t> m(size_t(c->size()));
    const int32_t mine = test::world_rank();
    c->all_gather(&mine, 1, m.data());
    return std::vector<int>(m.begin(), m.end());
  };
  {
    // data = 4, mesh.expert_parallel = 2: expert groups {0, 1}, {2, 3}; replica groups {0, 2}, {1, 3}.
    Mesh mesh(MPI_COMM_WORLD, 1, 4, 1);
    const Placement p = model_sharding(mesh, placement_deck(8, ExpertAxis::Data, 2));
    REQUIRE(p.expert_group != nullptr);
    REQUIRE(p.replica_group != nullptr);
    CHECK(p.expert_rank() == r % 2);
    CHECK(p.expert_group->rank() == r % 2);
    CHECK(p.replica_group->rank() == r / 2);
    CHECK(members(p.expert_group) == std::vector<std::vector<int>>{{0, 1}, {0, 1}, {2, 3}, {2, 3}}[size_t(r)]);
    CHECK(members(p.replica_group) == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {0, 2}, {1, 3}}[size_t(r)]);
    CHECK(p.expert_shape(kM, 8, kH, Activation::Relu).e0 == std::vector<int>{0, 4, 0, 4}[size_t(r)]);
  }
  {
    // data = 2 x tensor = 2, 8 experts: P = 2 = data, the expert group is the data axis, no replicas.
    Mesh mesh(MPI_COMM_WORLD, 1, 2, 2);
    const Placement p = model_sharding(mesh, placement_deck(8, ExpertAxis::Data));
    CHECK(p.expert_group == &mesh.axis(Axis::Data));
    CHECK(p.replica_group == nullptr);
    CHECK(p.tensor == &mesh.axis(Axis::Tensor));
    CHECK(members(p.expert_group) == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {0, 2}, {1, 3}}[size_t(r)]);
    const ExpertShape s = p.expert_shape(kM, 8, kH, Activation::Relu);
    CHECK(s.e0 == std::vector<int>{0, 0, 4, 4}[size_t(r)]);
    CHECK(s.ffn.h0 == std::vector<int>{0, 8, 0, 8}[size_t(r)]);
  }
  {
    // Pipeline-MoE on pipe = 2 x tensor = 2: no expert group, experts over the tensor Comm.
    Mesh mesh(MPI_COMM_WORLD, 2, 1, 2);
    const Placement p = model_sharding(mesh, placement_deck(8, ExpertAxis::Tensor));
    CHECK(p.expert_parallel == 1);
    CHECK(p.replica_group == nullptr);
    CHECK(p.pipe_rank == r / 2);
    CHECK(members(p.tensor) == std::vector<std::vector<int>>{{0, 1}, {0, 1}, {2, 3}, {2, 3}}[size_t(r)]);
    CHECK(p.expert_shape(kM, 8, kH, Activation::Relu).e0 == std::vector<int>{0, 4, 0, 4}[size_t(r)]);
  }
}
