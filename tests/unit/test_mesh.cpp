// Mesh: rank <-> coordinates, axis group membership, the plan text.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "../test_util.hpp"
#include "../support/mesh_support.hpp"
#include "mesh/mesh.hpp"

using namespace meshmoe;

namespace {

// Oracle for the rank layout: enumerate p, d, t with t innermost and count (DESIGN "The mesh").
std::vector<std::array<int, 3>> enumerate_coords(const MeshShape& s) {
  std::vector<std::array<int, 3>> out;
  for (int p = 0; p < s.pipe; ++p)
    for (int d = 0; d < s.data; ++d)
      for (int t = 0; t < s.tensor; ++t) out.push_back({p, d, t});
  return out;
}

std::string fmt_groups(const std::vector<std::vector<int>>& gs) {
  std::ostringstream os;
  for (const auto& g : gs) {
    os << " [";
    for (size_t i = 0; i < g.size(); ++i) os << (i ? " " : "") << g[i];
    os << "]";
  }
  return os.str();
}

}  // namespace

TEST_CASE("MeshShape: rank <-> coordinates follows pipe x data x tensor, tensor innermost", "[mesh]") {
  for (int world = 1; world <= 12; ++world) {
    const auto shapes = test::all_mesh_shapes(world);
    for (const MeshShape& s : shapes) {
      INFO(s.str());
      REQUIRE(s.size() == world);
      const auto expected = enumerate_coords(s);
      for (int r = 0; r < world; ++r) {
        CHECK(s.coords(r) == expected[size_t(r)]);
        CHECK(s.rank_of(expected[size_t(r)]) == r);
      }
    }
  }
  // Every factorisation is listed once: 4 = 1x1x4, 1x2x2, 1x4x1, 2x1x2, 2x2x1, 4x1x1.
  CHECK(test::all_mesh_shapes(4).size() == 6);
  CHECK(test::all_mesh_shapes(1).size() == 1);
  CHECK(test::all_mesh_shapes(8).size() == 10);
  CHECK(MeshShape{2, 3, 4}.coords(23) == std::array<int, 3>{1, 2, 3});
  CHECK(MeshShape{2, 3, 4}.coords(13) == std::array<int, 3>{1, 0, 1});
}

TEST_CASE("MeshShape: axis groups partition the ranks and differ only along their axis", "[mesh]") {
  SECTION("worked examples") {
    const MeshShape s{1, 2, 2};
    CHECK(s.groups(Axis::Data) == std::vector<std::vector<int>>{{0, 2}, {1, 3}});
    CHECK(s.groups(Axis::Tensor) == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
    CHECK(s.groups(Axis::Pipe) == std::vector<std::vector<int>>{{0}, {1}, {2}, {3}});
    const MeshShape c{2, 2, 2};
    CHECK(c.groups(Axis::Pipe) == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
    CHECK(c.groups(Axis::Data) == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
    CHECK(c.groups(Axis::Tensor) == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
    CHECK(c.group_of(Axis::Data, 5) == std::vector<int>{5, 7});
  }
  SECTION("every shape up to 12 ranks") {
    for (int world = 1; world <= 12; ++world)
      for (const MeshShape& s : test::all_mesh_shapes(world))
        for (Axis a : kAxes) {
          INFO(s.str() << " axis " << axis_name(a));
          const auto gs = s.groups(a);
          CHECK(gs.size() == size_t(world / s.extent(a)));
          std::multiset<int> seen;
          for (const auto& g : gs) {
            REQUIRE(g.size() == size_t(s.extent(a)));
            for (size_t i = 0; i < g.size(); ++i) {
              seen.insert(g[i]);
              auto c0 = s.coords(g[0]), ci = s.coords(g[i]);
              CHECK(ci[size_t(a)] == int(i));  // member order = coordinate = axis rank
              c0[size_t(a)] = ci[size_t(a)] = 0;
              CHECK(c0 == ci);  // same coordinates on the other axes
              CHECK(s.group_of(a, g[i]) == g);
            }
          }
          std::multiset<int> all;
          for (int r = 0; r < world; ++r) all.insert(r);
          CHECK(seen == all);
        }
  }
}

TEST_CASE("Mesh: communicators match the coordinates on every shape of this world", "[mesh][mpi]") {
  const int me = test::world_rank(), world = test::world_size();
  for (const MeshShape& s : test::all_mesh_shapes(world)) {
    INFO(s.str());
    Mesh built(MPI_COMM_WORLD, s.pipe, s.data, s.tensor);
    Mesh mesh = std::move(built);  // movable; the communicators move with it
    CHECK(mesh.rank() == me);
    CHECK(mesh.world_comm().size() == world);
    CHECK(mesh.shape() == s);
    int cmp = MPI_UNEQUAL;
    MPI_Comm_compare(mesh.world(), MPI_COMM_WORLD, &cmp);
    CHECK(cmp == MPI_CONGRUENT);  // a duplicate: same ranks, separate message space
    CHECK(mesh.world_comm().rank() == me);
    for (Axis a : kAxes) {
      INFO("axis " << axis_name(a));
      Comm& c = mesh.axis(a);
      CHECK(mesh.coord(a) == s.coords(me)[size_t(a)]);
      CHECK(mesh.extent(a) == s.extent(a));
      CHECK(c.size() == s.extent(a));
      CHECK(c.rank() == mesh.coord(a));
      std::vector<int32_t> members(size_t(c.size()));
      const int32_t mine = me;
      c.all_gather(&mine, 1, members.data());
      const auto expected = s.group_of(a, me);
      CHECK(std::vector<int>(members.begin(), members.end()) == expected);
    }
  }
}

TEST_CASE("MeshShape: expert groups and replica groups split the data groups (expert replicas)", "[mesh]") {
  SECTION("worked example: data = 4, expert groups of 2") {
    const MeshShape s{1, 4, 2};  // data groups [0 2 4 6] and [1 3 5 7]
    CHECK(s.expert_groups(2) == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
    CHECK(s.replica_groups(2) == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
    CHECK(s.expert_groups(4) == s.groups(Axis::Data));
    CHECK(s.replica_groups(1) == s.groups(Axis::Data));
  }
  SECTION("every shape up to 12 ranks and every P dividing data") {
    for (int world = 1; world <= 12; ++world)
      for (const MeshShape& s : test::all_mesh_shapes(world))
        for (int P = 1; P <= s.data; ++P) {
          if (s.data % P != 0) continue;
          INFO(s.str() << " P " << P);
          const auto experts = s.expert_groups(P), replicas = s.replica_groups(P);
          CHECK(experts.size() == size_t(world / P));
          CHECK(replicas.size() == size_t(world / (s.data / P)));
          for (const auto& g : experts) {
            REQUIRE(g.size() == size_t(P));
            const auto d0 = s.coords(g[0]);
            for (size_t i = 0; i < g.size(); ++i) {
              const auto c = s.coords(g[i]);
              CHECK(c[1] == d0[1] + int(i));  // consecutive data ranks
              CHECK(c[1] / P == d0[1] / P);
              CHECK((c[0] == d0[0] && c[2] == d0[2]));
            }
          }
          for (const auto& g : replicas) {
            REQUIRE(g.size() == size_t(s.data / P));
            const auto d0 = s.coords(g[0]);
            for (size_t i = 0; i < g.size(); ++i) {
              const auto c = s.coords(g[i]);
              CHECK(c[1] == d0[1] + int(i) * P);  // the same position in every expert group
              CHECK((c[0] == d0[0] && c[2] == d0[2]));
            }
          }
        }
  }
}

TEST_CASE("Mesh: expert and replica group communicators match MeshShape's groups", "[mesh][mpi]") {
  const int me = test::world_rank(), world = test::world_size();
  for (const MeshShape& s : test::all_mesh_shapes(world))
    for (int P = 1; P <= s.data; ++P) {
      if (s.data % P != 0) continue;
      INFO(s.str() << " P " << P);
      Mesh mesh(MPI_COMM_WORLD, s.pipe, s.data, s.tensor);
      const Mesh::ExpertComms c = mesh.expert_comms(P);
      CHECK(mesh.expert_comms(P).group == c.group);  // made once
      const int d = mesh.coord(Axis::Data);
      CHECK(c.group->rank() == d % P);
      CHECK(c.replicas->rank() == d / P);
      for (const auto& [comm, groups] : {std::pair{c.group, s.expert_groups(P)}, std::pair{c.replicas, s.replica_groups(P)}}) {
        std::vector<int32_t> members(size_t(comm->size()));
        const int32_t mine = me;
        comm->all_gather(&mine, 1, members.data());
        const std::vector<int> got(members.begin(), members.end());
        CHECK(std::find(groups.begin(), groups.end(), got) != groups.end());
      }
    }
}

TEST_CASE("Mesh: a shape that does not match the world is an InputError on every rank", "[mesh][mpi]") {
  const int world = test::world_size();
  CHECK_THROWS_AS(Mesh(MPI_COMM_WORLD, 1, world + 1, 1), InputError);
  CHECK_THROWS_AS(Mesh(MPI_COMM_WORLD, 0, world, 1), InputError);
  CHECK_THROWS_AS(Mesh(MPI_COMM_WORLD, 1, world, -1), InputError);
  CHECK_THROWS_WITH(Mesh(MPI_COMM_WORLD, 2, world, 1),
                    Catch::Contains("ranks, but the job has " + std::to_string(world)));
  // The world is still usable afterwards (nobody is stuck in a half-made collective).
  Mesh ok(MPI_COMM_WORLD, 1, world, 1);
  ok.world_comm().barrier();
}

TEST_CASE("Mesh::describe: shape, each rank's coordinates and host, the axis groups", "[mesh][mpi]") {
  const int me = test::world_rank(), world = test::world_size();
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  for (const MeshShape& s : test::all_mesh_shapes(world)) {
    INFO(s.str());
    Mesh mesh(MPI_COMM_WORLD, s.pipe, s.data, s.tensor);
    const std::string text = mesh.describe();
    if (me != 0) {
      CHECK(text.empty());
      continue;
    }
    // Expected text built from the formula; the test job runs on one host.
    std::ostringstream os;
    os << "mesh: pipe=" << s.pipe << " x data=" << s.data << " x tensor=" << s.tensor << " = " << world << " ranks\n";
    for (int r = 0; r < world; ++r) {
      const auto c = enumerate_coords(s)[size_t(r)];
      os << "rank " << r << "  host " << std::string(host, size_t(len)) << "  pipe " << c[0] << " data " << c[1]
         << " tensor " << c[2] << "\n";
    }
    for (Axis a : kAxes) os << axis_name(a) << " groups:" << fmt_groups(s.groups(a)) << "\n";
    CHECK(text == os.str());
  }
  if (world == 4 && me == 0) {
    Mesh mesh(MPI_COMM_WORLD, 1, 2, 2);
    const std::string text = mesh.describe();
    CHECK_THAT(text, Catch::Contains("mesh: pipe=1 x data=2 x tensor=2 = 4 ranks\n"));
    CHECK_THAT(text, Catch::Contains("  pipe 0 data 1 tensor 1\n"));
    CHECK_THAT(text, Catch::Contains("data groups: [0 2] [1 3]\n"));
    CHECK_THAT(text, Catch::Contains("tensor groups: [0 1] [2 3]\n"));
  } else if (world == 4) {
    Mesh mesh(MPI_COMM_WORLD, 1, 2, 2);
    CHECK(mesh.describe().empty());
  }
}

TEST_CASE("format_ranks: every rank up to 16, else the first 6, the last 2 and the count", "[mesh]") {
  std::vector<int> r(16);
  for (int i = 0; i < 16; ++i) r[size_t(i)] = 2 * i;
  CHECK(format_ranks({}) == "");
  CHECK(format_ranks({5}) == "5");
  CHECK(format_ranks(r) == "0 2 4 6 8 10 12 14 16 18 20 22 24 26 28 30");
  r.push_back(32);
  CHECK(format_ranks(r) == "0 2 4 6 8 10 ... 30 32 (17 ranks)");
  std::vector<int> all(2048);
  for (int i = 0; i < 2048; ++i) all[size_t(i)] = i;
  CHECK(format_ranks(all) == "0 1 2 3 4 5 ... 2046 2047 (2048 ranks)");
}
