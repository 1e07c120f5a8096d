// Ownership of the optimizer state with optim.shard_state (src/parallel/state_shards.hpp).
// Oracle for partition_whole_entries: every way of cutting a short list into contiguous runs,
// enumerated, whose smallest possible largest run the partition must reach.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "parallel/state_shards.hpp"

using namespace meshmoe;

namespace {

// The smallest largest-run over all cuts of sizes into at most `parts` contiguous runs.
size_t best_max_run(const std::vector<size_t>& sizes, int parts) {
  const size_t n = sizes.size();
  size_t best = SIZE_MAX;
  // Bit i of `cuts` set: a new run starts before entry i + 1.
  for (uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {
    if (__builtin_popcount(cuts) + 1 > parts) continue;
    size_t run = 0, worst = 0;
    for (size_t i = 0; i < n; ++i) {
      if (i > 0 && (cuts >> (i - 1) & 1u)) run = 0;
      run += sizes[i];
      worst = std::max(worst, run);
    }
    best = std::min(best, worst);
  }
  return best;
}

}  // namespace

TEST_CASE("state shards: contiguous runs in rank order whose largest is the smallest possible", "[state_shards]") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = 1 + rng() % 9;
    const int parts = 1 + int(rng() % 5);
    std::vector<size_t> sizes(n);
    for (auto& s : sizes) s = rng() % 4 == 0 ? rng() % 1000 : rng() % 20;  // a few large, zeros too
    INFO("trial " << trial << " n " << n << " parts " << parts);
    const std::vector<int> part = partition_whole_entries(sizes, parts);
    REQUIRE(part.size() == n);
    std::vector<size_t> load(size_t(parts), 0);
    for (size_t i = 0; i < n; ++i) {
      REQUIRE(part[i] >= 0);
      REQUIRE(part[i] < parts);
      if (i > 0) REQUIRE(part[i] >= part[i - 1]);  // contiguous, in rank order
      load[size_t(part[i])] += sizes[i];
    }
    CHECK(*std::max_element(load.begin(), load.end()) == best_max_run(sizes, parts));
  }
}

TEST_CASE("state shards: a GPT-2-like embedding makes the largest part, alone", "[state_shards]") {
  // An embedding of 31% of the parameters, then 12 equal blocks: on 4 ranks the embedding alone is
  // the largest part, on 2 the halves balance to within one block.
  std::vector<size_t> sizes = {3100, 10};
  for (int b = 0; b < 12; ++b) sizes.push_back(575);
  const auto p4 = partition_whole_entries(sizes, 4);
  std::vector<size_t> load(4, 0);
  for (size_t i = 0; i < sizes.size(); ++i) load[size_t(p4[i])] += sizes[i];
  CHECK(load[0] == 3100);
  CHECK(*std::max_element(load.begin(), load.end()) == 3100);
  CHECK(std::max({load[1], load[2], load[3]}) - std::min({load[1], load[2], load[3]}) <= 575);  // the rest: even
  const auto p2 = partition_whole_entries(sizes, 2);
  size_t first = 0;
  for (size_t i = 0; i < sizes.size(); ++i) first += p2[i] == 0 ? sizes[i] : 0;
  CHECK(first == 3110 + 3 * 575);  // 4835 and 5175 (one block more would make 5410 on rank 0)
}

TEST_CASE("state shards: entries split over data are every data rank's; the rest owned once", "[state_shards]") {
  ParamStore<float> store;
  ParamView<float> a, b, c, d;
  store.add("a", {4, 4}, InitKind::Zeros, 1, &a);
  store.add_block("experts", {4, 2, 2}, {2, 2, 2}, {0, 0, 0}, InitKind::Zeros, 1, &b).sharded_over = kShardData;
  store.add("c", {8}, InitKind::Zeros, 1, &c);
  store.add("d", {16}, InitKind::Zeros, 1, &d);
  store.allocate();
  const std::vector<int> owners = state_owners(store, 2);
  // replicated sizes 16, 8, 16: the best largest part is 24, filled from rank 0
  CHECK(owners == std::vector<int>{0, kEveryDataRank, 0, 1});
  CHECK(owned_entries(owners, 0) == std::vector<size_t>{0, 1, 2});
  CHECK(owned_entries(owners, 1) == std::vector<size_t>{1, 3});
  CHECK(state_owners(store, 1) == std::vector<int>{0, kEveryDataRank, 0, 0});
}
