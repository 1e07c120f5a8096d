// MpiComm's shared-memory path (mesh/shm_collectives.hpp): sums of non-integer floats against a
// serial sum in rank order computed here from every rank's inputs (bitwise), on every axis of
// every mesh of this world; sizes below and above the threshold, odd sizes, rounds of a small slot,
// zero blocks; the MPI path against it (bitwise with 2 ranks, within rounding with more); one
// buffer beyond the default 64 MiB slot.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <numeric>

#include "../test_util.hpp"
#include "../support/mesh_support.hpp"
#include "core/philox.hpp"
#include "mesh/mesh.hpp"

using namespace meshmoe;

namespace {

// 64 random bits for (world rank r, element i, salt), from the project's counter-based generator.
uint64_t bits64(int r, size_t i, int salt) {
  const std::array<uint32_t, 4> w = Rng{uint64_t(r), uint32_t(salt), 0, RngPurpose::Test}.bits(i);
  return uint64_t(w[0]) << 32 | w[1];
}

// Element i of world rank r: uniform in [-1, 1) with every mantissa bit used, so that the order
// of the additions shows in the result.
template <class T>
T value(int r, size_t i, int salt = 0) {
  constexpr int bits = std::is_same_v<T, float> ? 24 : 53;
  const uint64_t h = bits64(r, i, salt) >> (64 - bits);
  return T(std::ldexp(double(h), 1 - bits) - 1.0);
}

// Sum over the members of value(member, i), added in member order in T.
template <class T>
T rank_order_sum(const std::vector<int>& members, size_t i, int salt) {
  T acc = value<T>(members[0], i, salt);
  for (size_t k = 1; k < members.size(); ++k) acc += value<T>(members[k], i, salt);
  return acc;
}

// Small thresholds, so that a few thousand elements take the window in several rounds.
ShmSettings small_slots() {
  ShmSettings s;
  s.min_bytes = 1024;
  s.slot_bytes = 4096 + 12;  // not a multiple of the block size of any round
  return s;
}

template <class F>
void for_each_axis(const ShmSettings& settings, F&& body) {
  const int me = test::world_rank();
  for (const MeshShape& s : test::all_mesh_shapes(test::world_size())) {
    Mesh mesh(MPI_COMM_WORLD, s.pipe, s.data, s.tensor);
    mesh.set_shm(settings);
    for (Axis a : kAxes) {
      INFO(s.str() << ", " << axis_name(a) << " axis");
      body(static_cast<MpiComm&>(mesh.axis(a)), s.group_of(a, me));
    }
  }
}

// Counts with zero blocks: rank r's block is empty for every third r, others uneven.
std::vector<size_t> counts_with_zeros(size_t p, size_t n) {
  std::vector<size_t> c(p);
  for (size_t r = 0; r < p; ++r) c[r] = r % 3 == 1 ? 0 : n + 37 * r;
  return c;
}

}  // namespace

TEST_CASE("shm: a group of one node takes the shared-memory path", "[comm][mpi][shm]") {
  Mesh mesh(MPI_COMM_WORLD, 1, test::world_size(), 1);
  auto& data = static_cast<MpiComm&>(mesh.axis(Axis::Data));
  CHECK(data.shm_active() == (test::world_size() > 1));
  ShmSettings off;
  off.enabled = false;
  mesh.set_shm(off);
  CHECK_FALSE(data.shm_active());
}

TEMPLATE_TEST_CASE("shm: all_reduce sums in rank order, below and above the threshold, in rounds", "[comm][mpi][shm]",
                   float, double) {
  using T = TestType;
  const int me = test::world_rank();
  for_each_axis(small_slots(), [&](MpiComm& c, const std::vector<int>& members) {
    // 1024 bytes is the threshold: 255 floats / 127 doubles stay on MPI.
    for (size_t n : {size_t(1024 / sizeof(T)) - 1, size_t(1024 / sizeof(T)), size_t(1001), size_t(12345), size_t(3)})
      for (int salt : {0, 1}) {
        INFO("n=" << n << " salt=" << salt);
        std::vector<T> buf(n), expected(n);
        for (size_t i = 0; i < n; ++i) buf[i] = value<T>(me, i, salt), expected[i] = rank_order_sum<T>(members, i, salt);
        c.all_reduce(buf.data(), n, Op::Sum);
        if (n * sizeof(T) >= 1024 || members.size() <= 2) {
          CHECK(buf == expected);
        } else {  // MPI's order: within rounding
          for (size_t i = 0; i < n; ++i) REQUIRE(std::abs(double(buf[i]) - double(expected[i])) <= 4 * members.size() * std::numeric_limits<T>::epsilon());
        }
      }
  });
}

TEMPLATE_TEST_CASE("shm: reduce_scatterv in place with zero blocks and rounds", "[comm][mpi][shm]", float, double) {
  using T = TestType;
  const int me = test::world_rank();
  for_each_axis(small_slots(), [&](MpiComm& c, const std::vector<int>& members) {
    const size_t p = members.size(), r = size_t(c.rank());
    for (size_t n : {size_t(700), size_t(2049)}) {
      const std::vector<size_t> counts = counts_with_zeros(p, n);
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
      const size_t mine = std::accumulate(counts.begin(), counts.begin() + ptrdiff_t(r), size_t(0));
      INFO("n=" << n << " total=" << total);
      std::vector<T> buf(total), expected(counts[r]);
      for (size_t i = 0; i < total; ++i) buf[i] = value<T>(me, i, 5);
      for (size_t i = 0; i < counts[r]; ++i) expected[i] = rank_order_sum<T>(members, mine + i, 5);
      c.reduce_scatterv_in_place(buf.data(), counts, Op::Sum);
      CHECK(std::vector<T>(buf.begin() + ptrdiff_t(mine), buf.begin() + ptrdiff_t(mine + counts[r])) == expected);
    }
  });
}

TEMPLATE_TEST_CASE("shm: all_gatherv in place with zero blocks and rounds", "[comm][mpi][shm]", float, double, int64_t,
                   uint8_t) {
  using T = TestType;
  const int me = test::world_rank();
  for_each_axis(small_slots(), [&](MpiComm& c, const std::vector<int>& members) {
    const size_t p = members.size(), r = size_t(c.rank());
    for (size_t n : {size_t(900), size_t(5003)}) {
      const std::vector<size_t> counts = counts_with_zeros(p, n);
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
      INFO("n=" << n << " total=" << total);
      std::vector<T> buf(total, T(99)), expected(total);
      for (size_t j = 0, off = 0; j < p; off += counts[j++])
        for (size_t i = 0; i < counts[j]; ++i) {
          expected[off + i] = T(bits64(members[j], i, 9) % 97);
          if (j == r) buf[off + i] = T(bits64(me, i, 9) % 97);
        }
      c.all_gatherv_in_place(buf.data(), counts);
      CHECK(buf == expected);
    }
  });
}

TEST_CASE("shm: the MPI path gives the shared-memory path's sums (bitwise with 2 ranks)", "[comm][mpi][shm]") {
  const int me = test::world_rank();
  const size_t n = 300001;  // above the default threshold, odd
  std::vector<float> shm(n), mpi(n), scat_shm(n), scat_mpi(n);
  for (size_t i = 0; i < n; ++i) shm[i] = mpi[i] = scat_shm[i] = scat_mpi[i] = value<float>(me, i, 3);
  Mesh mesh(MPI_COMM_WORLD, 1, test::world_size(), 1);
  auto& data = static_cast<MpiComm&>(mesh.axis(Axis::Data));
  const size_t p = size_t(data.size()), r = size_t(data.rank());
  std::vector<size_t> counts(p, n / p);
  counts[0] += n % p;
  data.all_reduce(shm.data(), n);
  data.reduce_scatterv_in_place(scat_shm.data(), counts);
  ShmSettings off;
  off.enabled = false;
  mesh.set_shm(off);
  data.all_reduce(mpi.data(), n);
  data.reduce_scatterv_in_place(scat_mpi.data(), counts);
  const size_t mine = std::accumulate(counts.begin(), counts.begin() + ptrdiff_t(r), size_t(0));
  if (p <= 2) {
    CHECK(shm == mpi);
    CHECK(std::equal(scat_shm.begin() + ptrdiff_t(mine), scat_shm.begin() + ptrdiff_t(mine + counts[r]),
                     scat_mpi.begin() + ptrdiff_t(mine)));
  } else {
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += std::abs(shm[i] - mpi[i]) > 4 * float(p) * std::numeric_limits<float>::epsilon();
    CHECK(bad == 0);
  }
}

TEST_CASE("shm: a buffer beyond the default 64 MiB slot, in two rounds", "[comm][mpi][shm]") {
  const int me = test::world_rank();
  Mesh mesh(MPI_COMM_WORLD, 1, test::world_size(), 1);
  const std::vector<int> members = MeshShape{1, test::world_size(), 1}.group_of(Axis::Data, me);
  const size_t n = (size_t(64) << 20) / sizeof(float) + 4099;  // one rank's slot holds all blocks' pieces
  std::vector<float> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = value<float>(me, i, 11);
  mesh.axis(Axis::Data).all_reduce(buf.data(), n);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += buf[i] != rank_order_sum<float>(members, i, 11);
  CHECK(bad == 0);
}

// Buffers in node-shared memory (Comm::node_shared_alloc) take the resident path: each rank sums
// its block from the peers' memory. Oracle as above (a serial sum in rank order, bitwise), for
// sub-ranges at an offset into the memory, uneven blocks with zeros, float and double.
TEMPLATE_TEST_CASE("shm: buffers in node-shared memory sum and gather in place", "[comm][mpi][shm]", float, double) {
  using T = TestType;
  const int me = test::world_rank();
  for_each_axis(small_slots(), [&](MpiComm& c, const std::vector<int>& members) {
    const size_t p = members.size(), r = size_t(c.rank());
    const size_t n = 5000, at = 13;  // elements, and the buffer's offset in the shared memory
    T* shared = static_cast<T*>(c.node_shared_alloc((n + at) * sizeof(T)));
    REQUIRE((shared != nullptr) == (p > 1));
    if (!shared) return;
    CHECK(std::all_of(shared, shared + n + at, [](T x) { return x == T(0); }));
    T* buf = shared + at;
    for (size_t i = 0; i < n; ++i) buf[i] = value<T>(me, i, 21);
    c.all_reduce(buf, n, Op::Sum);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += buf[i] != rank_order_sum<T>(members, i, 21);
    CHECK(bad == 0);

    const std::vector<size_t> counts = counts_with_zeros(p, 700);
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
    const size_t mine = std::accumulate(counts.begin(), counts.begin() + ptrdiff_t(r), size_t(0));
    REQUIRE(total <= n);
    for (size_t i = 0; i < total; ++i) buf[i] = value<T>(me, i, 22);
    c.reduce_scatterv_in_place(buf, counts, Op::Sum);
    bad = 0;
    for (size_t i = 0; i < counts[r]; ++i) bad += buf[mine + i] != rank_order_sum<T>(members, mine + i, 22);
    CHECK(bad == 0);

    for (size_t i = 0; i < total; ++i) buf[i] = T(-1);
    for (size_t i = 0; i < counts[r]; ++i) buf[mine + i] = T(bits64(me, i, 23) % 97);
    c.all_gatherv_in_place(buf, counts);
    bad = 0;
    for (size_t j = 0, off = 0; j < p; off += counts[j++])
      for (size_t i = 0; i < counts[j]; ++i) bad += buf[off + i] != T(bits64(members[j], i, 23) % 97);
    CHECK(bad == 0);
    c.node_shared_free(shared);
  });
}

// A buffer node-shared on some ranks only (or at different offsets) must not take the resident
// path anywhere: the ranks agree first, and all take the slots. Also: memory freed and taken again.
TEST_CASE("shm: a buffer node-shared on some ranks only sums through the slots", "[comm][mpi][shm]") {
  const int me = test::world_rank();
  Mesh mesh(MPI_COMM_WORLD, 1, test::world_size(), 1);
  mesh.set_shm(small_slots());
  auto& data = static_cast<MpiComm&>(mesh.axis(Axis::Data));
  const std::vector<int> members = MeshShape{1, test::world_size(), 1}.group_of(Axis::Data, me);
  const size_t n = 3001;
  for (int round = 0; round < 2; ++round) {
    float* shared = static_cast<float*>(data.node_shared_alloc((n + 8) * sizeof(float)));
    if (!shared) {
      CHECK(test::world_size() == 1);
      return;
    }
    std::vector<float> own(n);
    for (int mode = 0; mode < 2; ++mode) {
      INFO("round " << round << (mode == 0 ? ": rank 0 private" : ": offsets differ by rank"));
      float* buf = mode == 0 ? (me == 0 ? own.data() : shared) : shared + (me % 2);
      for (size_t i = 0; i < n; ++i) buf[i] = value<float>(me, i, 31 + mode);
      data.all_reduce(buf, n, Op::Sum);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) bad += buf[i] != rank_order_sum<float>(members, i, 31 + mode);
      CHECK(bad == 0);
    }
    data.node_shared_free(shared);
  }
}

// One copy for the group (Comm::node_shared_alloc_one, the weights of a sharded run): every rank
// sees the same memory, zeroed; what each rank writes to its part before node_shared_fence every
// rank reads after it, and none of it lands in a rank's own node-shared memory; it frees among
// other node-shared memory.
TEST_CASE("shm: one copy of memory for the group, written in parts and fenced", "[comm][mpi][shm]") {
  const int me = test::world_rank();
  Mesh mesh(MPI_COMM_WORLD, 1, test::world_size(), 1);
  mesh.set_shm(small_slots());
  auto& data = static_cast<MpiComm&>(mesh.axis(Axis::Data));
  const std::vector<int> members = MeshShape{1, test::world_size(), 1}.group_of(Axis::Data, me);
  const size_t p = members.size(), r = size_t(data.rank()), n = 10007;
  float* own = static_cast<float*>(data.node_shared_alloc(n * sizeof(float)));
  float* one = static_cast<float*>(data.node_shared_alloc_one(n * sizeof(float)));
  REQUIRE((one != nullptr) == (p > 1));
  if (!one) {
    data.node_shared_fence();  // a barrier without node-shared memory
    return;
  }
  CHECK(std::all_of(one, one + n, [](float x) { return x == 0.0f; }));
  data.node_shared_fence();  // no rank writes before every rank has read the zeros
  for (size_t i = r; i < n; i += p) one[i] = float(bits64(int(r), i, 51) % 1000);  // rank r: every p-th value
  data.node_shared_fence();
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += one[i] != float(bits64(int(i % p), i, 51) % 1000);
  CHECK(bad == 0);
  // The peers' writes landed in the one copy, not in this rank's own node-shared memory.
  CHECK(std::all_of(own, own + n, [](float x) { return x == 0.0f; }));
  data.node_shared_fence();  // every rank has read before the copy is freed
  data.node_shared_free(one);
  data.node_shared_free(own);
}

// Without room in Open MPI's backing directory for the window (here: a directory that does not
// exist), a group keeps MPI's collectives and private memory, on every rank alike, instead of
// failing in MPI_Win_allocate_shared or dying of SIGBUS on a full tmpfs.
TEST_CASE("shm: no room in the backing directory: MPI's collectives, private memory", "[comm][mpi][shm]") {
  const char* before = std::getenv("OMPI_MCA_osc_sm_backing_directory");
  const std::string saved = before ? before : "";
  setenv("OMPI_MCA_osc_sm_backing_directory", "/nonexistent/meshmoe-test", 1);
  {
    const int me = test::world_rank();
    Mesh mesh(MPI_COMM_WORLD, 1, test::world_size(), 1);
    auto& data = static_cast<MpiComm&>(mesh.axis(Axis::Data));
    CHECK_FALSE(data.shm_active());
    CHECK(data.node_shared_alloc(4096) == nullptr);
    const std::vector<int> members = MeshShape{1, test::world_size(), 1}.group_of(Axis::Data, me);
    const size_t n = 300001;  // above the default threshold
    std::vector<float> buf(n);
    for (size_t i = 0; i < n; ++i) buf[i] = value<float>(me, i, 41);
    data.all_reduce(buf.data(), n);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i)
      bad += std::abs(buf[i] - rank_order_sum<float>(members, i, 41)) > 4 * float(members.size()) * std::numeric_limits<float>::epsilon();
    CHECK(bad == 0);
  }
  if (before) setenv("OMPI_MCA_osc_sm_backing_directory", saved.c_str(), 1);
  else unsetenv("OMPI_MCA_osc_sm_backing_directory");
}
