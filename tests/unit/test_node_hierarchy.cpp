// MpiComm's hierarchical all-reduce (mesh/node_hierarchy.hpp) for a group spanning nodes: the sum
// of every node's ranks in group order, then of the nodes in node order, bitwise against that
// serial sum computed here from every rank's inputs; below the threshold MPI; rounds of a small
// window, odd sizes, fewer elements than ranks; buffers in node-shared memory; the payload that
// crosses nodes. One copy of the weights per node (optim.shard_state): the owners' blocks
// all-gathered into every node's copy, and ParamStore's initialisation of it by each node's first
// rank. Nodes are cut from this machine's ranks by the test hook (consecutive ranks), or
// are real: tests/scripts/nodes_mesh.sh runs the "[nodes]" case on two fake nodes.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "../test_util.hpp"
#include "core/philox.hpp"
#include "mesh/mesh.hpp"
#include "mesh/node_hierarchy.hpp"
#include "model/params.hpp"

using namespace meshmoe;

namespace {

// Element i of world rank r: uniform in [-1, 1) with every mantissa bit used, so that the order
// of the additions shows in the result.
template <class T>
T value(int r, size_t i, int salt) {
  constexpr int bits = std::is_same_v<T, float> ? 24 : 53;
  const std::array<uint32_t, 4> w = Rng{uint64_t(r), uint32_t(salt), 0, RngPurpose::Test}.bits(i);
  const uint64_t h = (uint64_t(w[0]) << 32 | w[1]) >> (64 - bits);
  return T(std::ldexp(double(h), 1 - bits) - 1.0);
}

// The hierarchical order for `nodes` nodes of `per_node` consecutive ranks.
template <class T>
T node_order_sum(int nodes, int per_node, size_t i, int salt) {
  T total = 0;
  for (int k = 0; k < nodes; ++k) {
    T node = value<T>(k * per_node, i, salt);
    for (int l = 1; l < per_node; ++l) node += value<T>(k * per_node + l, i, salt);
    total = k == 0 ? node : total + node;
  }
  return total;
}

ShmSettings small_window(int ranks_per_node) {
  ShmSettings s;
  s.min_bytes = 1024;
  s.slot_bytes = 4096 + 12;  // rounds inside the node and chunks between nodes
  s.test_ranks_per_node = ranks_per_node;
  return s;
}

// Checks the all-reduces of one group cut into `nodes` x `per_node`.
template <class T>
void check_sums(MpiComm& c, int nodes, int per_node, bool resident) {
  const int me = c.rank();
  NodeHierarchy* h = c.hierarchy();
  REQUIRE(h != nullptr);
  REQUIRE(h->nodes() == nodes);
  REQUIRE(h->local_size() == per_node);
  for (size_t n : {size_t(1024 / sizeof(T)) - 1, size_t(1024 / sizeof(T)), size_t(1001), size_t(12345)})
    for (int salt : {0, 1}) {
      INFO("n=" << n << " salt=" << salt << (resident ? " node-shared" : ""));
      T* buf = nullptr;
      std::vector<T> own;
      if (resident) {
        buf = static_cast<T*>(c.node_shared_alloc(n * sizeof(T)));
        REQUIRE(buf != nullptr);
      } else {
        own.resize(n);
        buf = own.data();
      }
      std::vector<T> expected(n);
      for (size_t i = 0; i < n; ++i) buf[i] = value<T>(me, i, salt), expected[i] = node_order_sum<T>(nodes, per_node, i, salt);
      const size_t before = h->cross_node_bytes();
      c.all_reduce(buf, n, Op::Sum);
      if (n * sizeof(T) >= 1024) {
        CHECK(std::vector<T>(buf, buf + n) == expected);
        // Slice l of n / L elements; between nodes each rank sends all but its piece of the slice
        // and its piece to every other node: 2 (N - 1) / N of the slice when N divides it.
        const size_t slice = n / size_t(per_node) + (size_t(me % per_node) < n % size_t(per_node) ? 1 : 0);
        if (slice % size_t(nodes) == 0 && slice * sizeof(T) <= 4096)
          CHECK(h->cross_node_bytes() - before == 2 * (size_t(nodes) - 1) * slice / size_t(nodes) * sizeof(T));
        CHECK(h->cross_node_bytes() > before);
      } else {  // MPI's order: within rounding
        CHECK(h->cross_node_bytes() == before);
        for (size_t i = 0; i < n; ++i)
          REQUIRE(std::abs(double(buf[i]) - double(expected[i])) <= 4.0 * c.size() * std::numeric_limits<T>::epsilon());
      }
      if (resident) c.node_shared_free(buf);
    }
}

// One copy per node (node_shared_alloc_one) of a buffer of one block per rank, each rank writing
// its own: after a fence a node's copy holds the blocks of its own ranks only (zero elsewhere: one
// copy per node, not for the group), after node_copy_all_gather and a fence every block, bitwise,
// on every rank; each rank sends its block to the N - 1 other nodes, in rounds of the small window.
void check_node_copy(MpiComm& c, int nodes, int per_node) {
  const int me = c.rank(), p = c.size();
  NodeHierarchy* h = c.hierarchy();
  REQUIRE(h != nullptr);
  CHECK(c.node_rank() == me % per_node);
  std::vector<size_t> counts(static_cast<size_t>(p)), begin(static_cast<size_t>(p), 0);
  for (int r = 0; r < p; ++r) counts[size_t(r)] = r == 1 ? 0 : 700 + 37 * size_t(r);  // rank 1 owns nothing
  for (int r = 1; r < p; ++r) begin[size_t(r)] = begin[size_t(r) - 1] + counts[size_t(r) - 1];
  const size_t total = begin.back() + counts.back();
  auto* buf = static_cast<float*>(c.node_shared_alloc_one(total * sizeof(float)));
  REQUIRE(buf != nullptr);
  for (size_t i = 0; i < counts[size_t(me)]; ++i) buf[begin[size_t(me)] + i] = value<float>(me, i, 5);
  c.node_shared_fence();
  auto blocks_equal = [&](bool only_my_node) {
    bool ok = true;
    for (int r = 0; r < p; ++r) {
      const bool mine = r / per_node == me / per_node;
      for (size_t i = 0; i < counts[size_t(r)]; ++i)
        ok &= buf[begin[size_t(r)] + i] == (mine || !only_my_node ? value<float>(r, i, 5) : 0.0f);
    }
    return ok;
  };
  CHECK(blocks_equal(true));
  c.node_shared_fence();  // every rank has looked before any block arrives
  const size_t before = h->cross_node_bytes();
  c.node_copy_all_gather(buf, counts);
  c.node_shared_fence();
  CHECK(blocks_equal(false));
  CHECK(h->cross_node_bytes() - before == size_t(nodes - 1) * counts[size_t(me)] * sizeof(float));
  c.node_shared_free(buf);
}

// A ParamStore with one copy of the weights per node over `c`: each node's first rank initialises
// its node's copy, bitwise the private store's values on every rank.
void check_store_one_copy(MpiComm& c, int per_node) {
  auto entries = [](ParamStore<float>& s) {
    s.add("a.w", {33, 17}, InitKind::TruncNormal, 33.0, nullptr);
    s.add("b.g", {17}, InitKind::Ones, 1.0, nullptr);
    s.add("c.w", {1029}, InitKind::TruncNormal, 7.0, nullptr);
  };
  ParamStore<float> shared, own;
  entries(shared);
  entries(own);
  shared.allocate(&c, /*one_weight_copy=*/true);
  own.allocate();
  REQUIRE(shared.one_weight_copy());
  CHECK(shared.writes_all_weights() == (c.rank() % per_node == 0));
  shared.init(9, 1.0);
  own.init(9, 1.0);
  CHECK(std::vector<float>(shared.weights(), shared.weights() + shared.size()) ==
        std::vector<float>(own.weights(), own.weights() + own.size()));
}

// Whether `p` ranks make nodes of 2 ranks (an even number >= 4); else the case is skipped.
bool nodes_of_two(int p) {
  if (p >= 4 && p % 2 == 0) return true;
  WARN("skipped: needs an even number of ranks >= 4");
  return false;
}

}  // namespace

TEST_CASE("hier: one copy of the weights per node, the owners' blocks all-gathered between the nodes' copies",
          "[comm][mpi][hier]") {
  const int p = test::world_size();
  if (!nodes_of_two(p)) return;
  Mesh mesh(MPI_COMM_WORLD, 1, p, 1);
  mesh.set_shm(small_window(2));
  auto& data = static_cast<MpiComm&>(mesh.axis(Axis::Data));
  check_node_copy(data, p / 2, 2);
  check_store_one_copy(data, 2);
}

TEMPLATE_TEST_CASE("hier: all_reduce over nodes of 2 ranks sums each node, then the nodes, in order", "[comm][mpi][hier]",
                   float, double) {
  const int p = test::world_size();
  if (!nodes_of_two(p)) return;
  Mesh mesh(MPI_COMM_WORLD, 1, p, 1);
  mesh.set_shm(small_window(2));
  auto& data = static_cast<MpiComm&>(mesh.axis(Axis::Data));
  CHECK_FALSE(data.shm_active());  // a group on several nodes has no one window
  check_sums<TestType>(data, p / 2, 2, /*resident=*/false);
  check_sums<TestType>(data, p / 2, 2, /*resident=*/true);
}

TEST_CASE("hier: one node, uneven nodes or one rank per node keep the other paths", "[comm][mpi][hier]") {
  const int p = test::world_size();
  if (p < 4) {
    WARN("skipped: needs 4 ranks or more");
    return;
  }
  for (int per_node : {p, p - 1, 1}) {  // one node; nodes of p - 1 and 1 ranks; one rank each
    INFO("ranks per node " << per_node);
    Mesh mesh(MPI_COMM_WORLD, 1, p, 1);
    mesh.set_shm(small_window(per_node));
    auto& data = static_cast<MpiComm&>(mesh.axis(Axis::Data));
    CHECK(data.hierarchy() == nullptr);
  }
  ShmSettings off = small_window(2);
  off.enabled = false;
  Mesh mesh(MPI_COMM_WORLD, 1, p, 1);
  mesh.set_shm(off);
  CHECK(static_cast<MpiComm&>(mesh.axis(Axis::Data)).hierarchy() == nullptr);
}

// Real nodes (the ranks MPI sees on other hosts): run by tests/scripts/nodes_mesh.sh under
// tools/fake-nodes.sh with MESHMOE_TEST_NODES=2, where a fallback to one node fails.
TEST_CASE("hier: the nodes MPI sees", "[nodes]") {
  const char* want = std::getenv("MESHMOE_TEST_NODES");
  if (!want) {
    WARN("skipped: set MESHMOE_TEST_NODES to the number of nodes the job spans");
    return;
  }
  const int nodes = std::atoi(want), p = test::world_size();
  REQUIRE(nodes >= 2);
  REQUIRE(p % nodes == 0);
  Mesh mesh(MPI_COMM_WORLD, 1, p, 1);
  ShmSettings s = small_window(0);
  mesh.set_shm(s);
  auto& data = static_cast<MpiComm&>(mesh.axis(Axis::Data));
  check_sums<float>(data, nodes, p / nodes, false);
  check_sums<double>(data, nodes, p / nodes, true);
  check_node_copy(data, nodes, p / nodes);
  check_store_one_copy(data, p / nodes);
}
