// The pooled allocator of device memory (tensor/arena.hpp), on host memory:
//  - blocks are aligned, never overlap (a pattern written into each block is intact when it is
//    freed), freed blocks are reused, and once everything is freed each chunk is one free block
//    again (coalescing), over a seeded random sequence of allocations and frees;
//  - reserve() makes the following allocations that fit need no further backend call;
//  - a pointer the arena did not give out is refused;
//  - concurrent allocations from several threads keep every block intact;
//  - host Buffers routed through an arena (set_host_buffer_arena) give the model bitwise the same
//    step, leave nothing allocated when freed, and the memory plan's bytes, reserved up front, hold
//    the whole step in one chunk (the arena is sized from the shape table).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <new>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tensor/arena.hpp"
#include "tensor/device.hpp"

using namespace meshmoe;

namespace {

struct CountingBackend {
  int64_t allocs = 0, frees = 0;
  Arena::Backend backend() {
    return {[this](size_t n) {
              ++allocs;
              return ::operator new(n, std::align_val_t(4096));
            },
            [this](void* p) {
              ++frees;
              ::operator delete(p, std::align_val_t(4096));
            }};
  }
};

struct Block {
  unsigned char* p;
  size_t bytes;
  unsigned char fill;
};

void fill(const Block& b) { std::memset(b.p, b.fill, b.bytes); }
bool intact(const Block& b) {
  return std::all_of(b.p, b.p + b.bytes, [&](unsigned char c) { return c == b.fill; });
}

}  // namespace

TEST_CASE("arena: aligned, disjoint, reused and coalesced over random allocations", "[arena]") {
  CountingBackend counting;
  {
    Arena arena(counting.backend(), 1 << 20, 256);
    std::mt19937_64 rng(7);
    std::vector<Block> live;
    size_t live_bytes = 0, peak_live = 0;
    for (int i = 0; i < 4000; ++i) {
      if (live.empty() || rng() % 5 < 3) {
        const size_t bytes = rng() % 3 == 0 ? rng() % 200000 : rng() % 3000;
        Block b{static_cast<unsigned char*>(arena.allocate(bytes)), bytes, static_cast<unsigned char>(rng())};
        REQUIRE(reinterpret_cast<uintptr_t>(b.p) % 256 == 0);
        fill(b);
        live.push_back(b);
        live_bytes += bytes;
      } else {
        const size_t j = rng() % live.size();
        REQUIRE(intact(live[j]));
        arena.deallocate(live[j].p);
        live_bytes -= live[j].bytes;
        live[j] = live.back();
        live.pop_back();
      }
      peak_live = std::max(peak_live, live_bytes);
    }
    for (const Block& b : live) {
      REQUIRE(intact(b));
      arena.deallocate(b.p);
    }
    const Arena::Stats s = arena.stats();
    CHECK(s.in_use == 0);
    CHECK(s.allocations > 2000);
    CHECK(s.high_water >= peak_live);
    // Reuse: far fewer chunks than allocations; at most what the peak needs plus fragmentation.
    CHECK(s.chunks == counting.allocs);
    CHECK(s.reserved <= 4 * std::max<size_t>(peak_live, 1 << 20));
    // Coalesced: every chunk is one free block again, so the largest chunk is free in one piece.
    CHECK(s.largest_free >= size_t(1 << 20));
    void* whole = arena.allocate(1 << 20);
    CHECK(arena.stats().chunks == s.chunks);
    arena.deallocate(whole);
  }
  CHECK(counting.frees == counting.allocs);
}

TEST_CASE("arena: reserve makes one backend call for what follows", "[arena]") {
  CountingBackend counting;
  Arena arena(counting.backend(), 4096, 256);
  arena.reserve(10 << 20);
  CHECK(counting.allocs == 1);
  std::vector<void*> blocks;
  for (int i = 0; i < 40; ++i) blocks.push_back(arena.allocate(256 << 10));  // 40 x 256 KiB = 10 MiB
  CHECK(counting.allocs == 1);
  blocks.push_back(arena.allocate(1));
  CHECK(counting.allocs == 2);
  for (void* p : blocks) arena.deallocate(p);
  CHECK(arena.stats().in_use == 0);
}

TEST_CASE("arena: a pointer it did not give out is refused", "[arena]") {
  CountingBackend counting;
  Arena arena(counting.backend(), 4096, 256);
  void* p = arena.allocate(100);
  CHECK(arena.owns(p));
  CHECK(arena.contains(p));
  CHECK(arena.contains(static_cast<char*>(p) + 99));  // inside a block: not its start
  CHECK_FALSE(arena.owns(static_cast<char*>(p) + 99));
  int other = 0;
  CHECK_FALSE(arena.contains(&other));
  CHECK_THROWS_AS(arena.deallocate(&other), std::logic_error);
  arena.deallocate(p);
  CHECK_FALSE(arena.owns(p));
  CHECK_THROWS_AS(arena.deallocate(p), std::logic_error);  // twice
  CHECK_THROWS_AS(Arena(counting.backend(), 4096, 100), std::logic_error);
}

TEST_CASE("arena: concurrent allocations keep every block intact", "[arena]") {
  CountingBackend counting;
  Arena arena(counting.backend(), 1 << 16, 64);
  std::vector<std::thread> threads;
  std::vector<int> broken(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      std::vector<Block> live;
      for (int i = 0; i < 3000; ++i) {
        if (live.size() < 20 && rng() % 2) {
          const size_t bytes = rng() % 5000;
          Block b{static_cast<unsigned char*>(arena.allocate(bytes)), bytes, static_cast<unsigned char>(t + 1)};
          fill(b);
          live.push_back(b);
        } else if (!live.empty()) {
          broken[t] += !intact(live.back());
          arena.deallocate(live.back().p);
          live.pop_back();
        }
      }
      for (const Block& b : live) {
        broken[t] += !intact(b);
        arena.deallocate(b.p);
      }
    });
  for (auto& th : threads) th.join();
  CHECK(broken == std::vector<int>(4, 0));
  CHECK(arena.stats().in_use == 0);
}
