// StagingRing (tensor/staging_ring.hpp), the bookkeeping of the GPU's pinned upload staging: room
// is handed out in order, and room that a queued copy still reads is handed out again only after
// waiting for that copy. Checked against a model of the device: each copy finishes only when
// waited for, and a copy reads its room at the moment it finishes.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "tensor/staging_ring.hpp"

using namespace meshmoe;

TEST_CASE("staging ring: room in order, reused only after the copies reading it", "[device]") {
  std::vector<uint64_t> waited;
  StagingRing ring(1024, [&](uint64_t t) { waited.push_back(t); });
  CHECK(ring.take(100) == size_t(0));  // rounded up to 256
  ring.issued(0);
  CHECK(ring.take(256) == size_t(256));
  ring.issued(1);
  CHECK(ring.take(512) == size_t(512));  // up to the end: nothing waited
  ring.issued(2);
  CHECK(waited.empty());
  CHECK(ring.take(300) == size_t(0));  // wraps: the two oldest copies read [0, 512)
  ring.issued(3);
  CHECK(waited == std::vector<uint64_t>{0, 1});
  CHECK(ring.take(1025) == std::nullopt);  // larger than the ring: the caller copies another way
  CHECK(ring.take(0) == std::nullopt);
  ring.all_done();
  CHECK(waited == std::vector<uint64_t>{0, 1, 2, 3});
  CHECK(ring.in_flight() == 0);
  CHECK(ring.take(1024) == size_t(0));
}

TEST_CASE("staging ring: no copy ever reads room rewritten before it finished (random sizes)", "[device]") {
  constexpr size_t kCap = 4096;
  std::vector<int64_t> owner(kCap, -1);  // which copy's bytes each byte of the ring holds
  std::map<uint64_t, std::pair<size_t, size_t>> pending;  // queued copies: room
  bool corrupted = false;
  StagingRing ring(kCap, [&](uint64_t t) {
    const auto [b, e] = pending.at(t);
    for (size_t i = b; i < e; ++i) corrupted |= owner[i] != int64_t(t);  // the copy reads its room now
    pending.erase(t);
  });
  std::mt19937_64 rng(7);
  for (uint64_t t = 0; t < 5000; ++t) {
    const size_t bytes = 1 + rng() % 1500;
    const auto at = ring.take(bytes);
    REQUIRE(at.has_value());
    REQUIRE(*at % StagingRing::kAlign == 0);
    REQUIRE(*at + bytes <= kCap);
    for (size_t i = *at; i < *at + bytes; ++i) owner[i] = int64_t(t);  // the host writes the room
    pending[t] = {*at, *at + bytes};
    ring.issued(t);
    if (rng() % 50 == 0) ring.all_done();  // a device_synchronize now and then
  }
  ring.all_done();
  CHECK(pending.empty());
  CHECK_FALSE(corrupted);
}
