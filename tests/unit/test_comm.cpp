// Comm (MPI backend): every operation on every axis of every mesh shape of this world size,
// against a serial computation of the same result. Each rank derives every other rank's input
// from (world rank, index), so it can compute its expected output alone. Inputs are integers
// (integer-valued in the float types, below 2^24 for float), so sums are exact in any order and
// every comparison is exact equality.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <numeric>

#include "../test_util.hpp"
#include "../support/mesh_support.hpp"
#include "mesh/agree.hpp"
#include "mesh/mesh.hpp"
#include "mesh/mpi_comm.hpp"

using namespace meshmoe;

namespace {

const size_t kSizes[] = {0, 1, 7, 1000};

uint32_t mix(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t h = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u) * 0x85EBCA77u ^ (c + 0x165667B1u) * 0xC2B2AE3Du;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  return h;
}

// Input element i of world rank r (salt picks a block, a destination, ...). Small non-negative
// values for uint8 (a sum over 4 ranks stays < 256); wide values of both signs for the wider
// types, so that a wrong MPI datatype of the same width (int64 read as double) cannot pass.
template <class T>
T value(int r, size_t i, int salt = 0) {
  const int64_t v = int64_t(mix(uint32_t(r), uint32_t(i), uint32_t(salt)) % 61) - 30;  // -30..30
  if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, char>) return T(v + 30);
  else if constexpr (std::is_same_v<T, float>) return T(v * 1000 + r);         // |x| < 2^24: exact
  else if constexpr (std::is_same_v<T, int32_t>) return T(v * (1 << 20) + r);  // sums of 4 fit
  else if constexpr (std::is_same_v<T, double>) return T(v * (int64_t(1) << 40) + r);  // exact < 2^53
  else return T(v * (int64_t(1) << 56) / 16 + r);                               // int64
}

template <class T>
T combine(T a, T b, Op op) {
  switch (op) {
    case Op::Sum: return T(a + b);
    case Op::Max: return a > b ? a : b;
    case Op::Min: return a < b ? a : b;
  }
  return a;
}

// value(member, i, salt) reduced over the group's members, in member order.
template <class T>
T reduced(const std::vector<int>& members, size_t i, int salt, Op op) {
  T r = value<T>(members[0], i, salt);
  for (size_t k = 1; k < members.size(); ++k) r = combine(r, value<T>(members[k], i, salt), op);
  return r;
}

// Entries sent from world rank src to world rank dst by the variable all-to-all: 0..n, often 0.
size_t v_count(int src, int dst, size_t n) { return n == 0 ? 0 : mix(uint32_t(src), uint32_t(dst), 77u) % (n + 1); }

// Runs body(mesh, shape, axis, comm, members) for every shape of this world and every axis;
// members[j] = world rank of axis rank j (from the formula, which test_mesh checks).
template <class F>
void for_each_axis(F&& body) {
  const int me = test::world_rank();
  for (const MeshShape& s : test::all_mesh_shapes(test::world_size())) {
    Mesh mesh(MPI_COMM_WORLD, s.pipe, s.data, s.tensor);
    for (Axis a : kAxes) {
      INFO(s.str() << ", " << axis_name(a) << " axis");
      body(mesh.axis(a), s.group_of(a, me));
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("Comm: all_reduce sum/max/min in place", "[comm][mpi]", float, double, int32_t, int64_t,
                   uint8_t) {
  using T = TestType;
  const int me = test::world_rank();
  for_each_axis([&](Comm& c, const std::vector<int>& members) {
    for (size_t n : kSizes)
      for (Op op : {Op::Sum, Op::Max, Op::Min}) {
        INFO("n=" << n << " op=" << test::op_name(op));
        std::vector<T> buf(n), expected(n);
        for (size_t i = 0; i < n; ++i) {
          buf[i] = value<T>(me, i);
          expected[i] = reduced<T>(members, i, 0, op);
        }
        c.all_reduce(buf.data(), n, op);
        CHECK(buf == expected);
      }
  });
}

TEMPLATE_TEST_CASE("Comm: broadcast from every root", "[comm][mpi]", float, double, int32_t, int64_t, uint8_t, char) {
  using T = TestType;
  const int me = test::world_rank();
  for_each_axis([&](Comm& c, const std::vector<int>& members) {
    for (size_t n : kSizes)
      for (int root = 0; root < c.size(); ++root) {
        INFO("n=" << n << " root=" << root);
        std::vector<T> buf(n), expected(n);
        for (size_t i = 0; i < n; ++i) {
          buf[i] = value<T>(me, i);
          expected[i] = value<T>(members[size_t(root)], i);
        }
        c.broadcast(buf.data(), n, root);
        CHECK(buf == expected);
      }
  });
}

// Comm::broadcast_string and the MPI_Comm form of mesh/agree.hpp: the root's string, whatever the
// receivers held before (longer, shorter, empty), NUL bytes included.
TEST_CASE("Comm: broadcast_string from every root", "[comm][mpi]") {
  const int me = test::world_rank();
  const auto text = [](int r, size_t n) {
    std::string s(n + size_t(r) * 5, '\0');
    for (size_t i = 0; i < s.size(); ++i) s[i] = char(value<uint8_t>(r, i) * 3);
    return s;
  };
  for_each_axis([&](Comm& c, const std::vector<int>& members) {
    const MPI_Comm mpi = dynamic_cast<MpiComm&>(c).mpi();
    for (size_t n : kSizes)
      for (int root = 0; root < c.size(); ++root) {
        INFO("n=" << n << " root=" << root);
        const std::string expected = text(members[size_t(root)], n);
        CHECK(c.broadcast_string(text(me, n), root) == expected);
        CHECK(broadcast_string(text(me, n), root, mpi) == expected);
      }
  });
}

TEMPLATE_TEST_CASE("Comm: all_gather in rank order", "[comm][mpi]", float, double, int32_t, int64_t, uint8_t) {
  using T = TestType;
  const int me = test::world_rank();
  for_each_axis([&](Comm& c, const std::vector<int>& members) {
    const size_t p = members.size();
    for (size_t n : kSizes) {
      INFO("n=" << n);
      std::vector<T> send(n), recv(p * n, T(99)), expected(p * n);
      for (size_t i = 0; i < n; ++i) send[i] = value<T>(me, i);
      for (size_t j = 0; j < p; ++j)
        for (size_t i = 0; i < n; ++i) expected[j * n + i] = value<T>(members[j], i);
      c.all_gather(send.data(), n, recv.data());
      CHECK(recv == expected);
    }
  });
}

TEMPLATE_TEST_CASE("Comm: reduce_scatter gives rank r block r reduced", "[comm][mpi]", float, double, int32_t, int64_t,
                   uint8_t) {
  using T = TestType;
  const int me = test::world_rank();
  for_each_axis([&](Comm& c, const std::vector<int>& members) {
    const size_t p = members.size(), r = size_t(c.rank());
    for (size_t n : kSizes)
      for (Op op : {Op::Sum, Op::Max}) {
        INFO("n=" << n << " op=" << test::op_name(op));
        // Block j of rank k's input: value(k, i, salt = j).
        std::vector<T> send(p * n), recv(n, T(99)), expected(n);
        for (size_t j = 0; j < p; ++j)
          for (size_t i = 0; i < n; ++i) send[j * n + i] = value<T>(me, i, int(j));
        for (size_t i = 0; i < n; ++i) expected[i] = reduced<T>(members, i, int(r), op);
        test::reduce_scatter(c, send.data(), recv.data(), n, op);
        CHECK(recv == expected);
      }
  });
}

// Uneven block sizes, zeros included, that differ per block: counts[j] of block j (the same on
// every rank of the group).
std::vector<size_t> uneven_counts(size_t p, size_t n) {
  std::vector<size_t> counts(p);
  for (size_t j = 0; j < p; ++j) counts[j] = n == 0 ? 0 : (j % 3 == 1 ? 0 : n + 3 * j);
  return counts;
}

TEMPLATE_TEST_CASE("Comm: reduce_scatterv in place leaves rank r's block reduced in place", "[comm][mpi]", float,
                   double, int32_t, int64_t) {
  using T = TestType;
  const int me = test::world_rank();
  for_each_axis([&](Comm& c, const std::vector<int>& members) {
    const size_t p = members.size(), r = size_t(c.rank());
    for (size_t n : kSizes)
      for (Op op : {Op::Sum, Op::Max}) {
        INFO("n=" << n << " op=" << test::op_name(op));
        const std::vector<size_t> counts = uneven_counts(p, n);
        const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
        const size_t mine = std::accumulate(counts.begin(), counts.begin() + ptrdiff_t(r), size_t(0));
        // Element i of the whole buffer on rank k: value(k, i, salt = 5).
        std::vector<T> buf(total), expected(counts[r]);
        for (size_t i = 0; i < total; ++i) buf[i] = value<T>(me, i, 5);
        for (size_t i = 0; i < counts[r]; ++i) expected[i] = reduced<T>(members, mine + i, 5, op);
        c.reduce_scatterv_in_place(buf.data(), counts, op);
        CHECK(std::vector<T>(buf.begin() + ptrdiff_t(mine), buf.begin() + ptrdiff_t(mine + counts[r])) == expected);
      }
  });
}

TEMPLATE_TEST_CASE("Comm: all_gatherv in place gives every rank every block", "[comm][mpi]", float, double, int64_t,
                   uint8_t) {
  using T = TestType;
  const int me = test::world_rank();
  for_each_axis([&](Comm& c, const std::vector<int>& members) {
    const size_t p = members.size(), r = size_t(c.rank());
    for (size_t n : kSizes) {
      INFO("n=" << n);
      const std::vector<size_t> counts = uneven_counts(p, n);
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
      // Block j comes from rank j: value(members[j], i); this rank's other blocks start as junk.
      std::vector<T> buf(total, T(99)), expected(total);
      for (size_t j = 0, off = 0; j < p; off += counts[j++])
        for (size_t i = 0; i < counts[j]; ++i) {
          expected[off + i] = value<T>(members[j], i);
          if (j == r) buf[off + i] = value<T>(me, i);
        }
      c.all_gatherv_in_place(buf.data(), counts);
      CHECK(buf == expected);
    }
  });
}

TEMPLATE_TEST_CASE("Comm: all_to_all with equal blocks", "[comm][mpi]", float, double, int32_t, int64_t, uint8_t,
                   char) {
  using T = TestType;
  const int me = test::world_rank();
  for_each_axis([&](Comm& c, const std::vector<int>& members) {
    const size_t p = members.size(), r = size_t(c.rank());
    for (size_t n : kSizes) {
      INFO("n=" << n);
      // Block j of rank k's input is meant for axis rank j: value(k, i, salt = j).
      std::vector<T> send(p * n), recv(p * n, T(99)), expected(p * n);
      for (size_t j = 0; j < p; ++j)
        for (size_t i = 0; i < n; ++i) {
          send[j * n + i] = value<T>(me, i, int(j));
          expected[j * n + i] = value<T>(members[j], i, int(r));
        }
      c.all_to_all(send.data(), recv.data(), n);
      CHECK(recv == expected);
    }
  });
}

TEMPLATE_TEST_CASE("Comm: all_to_allv with random uneven counts, zeros included", "[comm][mpi]", float, int64_t,
                   uint8_t) {
  using T = TestType;
  const int me = test::world_rank();
  for_each_axis([&](Comm& c, const std::vector<int>& members) {
    const size_t p = members.size();
    for (size_t n : kSizes) {
      INFO("n=" << n);
      std::vector<size_t> send_counts(p), expected_counts(p);
      std::vector<T> send, expected;
      for (size_t j = 0; j < p; ++j) {
        send_counts[j] = v_count(me, members[j], n);
        for (size_t i = 0; i < send_counts[j]; ++i) send.push_back(value<T>(me, i, members[j]));
        expected_counts[j] = v_count(members[j], me, n);
        for (size_t i = 0; i < expected_counts[j]; ++i) expected.push_back(value<T>(members[j], i, me));
      }
      // The three forms one after another (no SECTIONs: Catch runs a section once per pass, not
      // once per loop iteration).
      CHECK(c.exchange_counts(send_counts) == expected_counts);
      {  // counts exchanged inside, into a vector
        std::vector<T> recv{T(5)};
        CHECK(c.all_to_allv(send.data(), std::span<const size_t>(send_counts), recv) == expected_counts);
        CHECK(recv == expected);
      }
      {  // counts exchanged inside, into a buffer with room to spare (left untouched)
        std::vector<T> recv(expected.size() + 3, T(99));
        CHECK(c.all_to_allv(send.data(), std::span<const size_t>(send_counts), recv.data(), recv.size()) ==
              expected_counts);
        std::vector<T> head(recv.begin(), recv.begin() + long(expected.size()));
        CHECK(head == expected);
        CHECK(std::all_of(recv.begin() + long(expected.size()), recv.end(), [](T x) { return x == T(99); }));
      }
      {  // counts known on both sides
        std::vector<T> recv(expected.size(), T(99));
        c.all_to_allv(send.data(), std::span<const size_t>(send_counts), recv.data(),
                      std::span<const size_t>(expected_counts));
        CHECK(recv == expected);
      }
    }
  });
}

TEMPLATE_TEST_CASE("Comm: permute (collective permute) and send_recv", "[comm][mpi]", float, int32_t, int64_t,
                   uint8_t) {
  using T = TestType;
  const int me = test::world_rank();
  for_each_axis([&](Comm& c, const std::vector<int>& members) {
    const int p = c.size(), r = c.rank();
    for (size_t n : kSizes) {
      for (int shift = 0; shift < p; ++shift) {  // a ring shifted by `shift` (0: to self)
        INFO("n=" << n << " shift=" << shift);
        const int dest = (r + shift) % p, source = (r - shift + p) % p;
        std::vector<T> send(n), recv(n, T(99)), expected(n);
        for (size_t i = 0; i < n; ++i) {
          send[i] = value<T>(me, i);
          expected[i] = value<T>(members[size_t(source)], i);
        }
        c.permute(send.data(), recv.data(), n, dest, source);
        CHECK(recv == expected);
      }
      {  // a pipeline step: rank r -> r + 1; the ends send or receive nothing
        INFO("n=" << n << " chain");
        const int dest = r + 1 < p ? r + 1 : kNoRank, source = r > 0 ? r - 1 : kNoRank;
        std::vector<T> send(n), recv(n, T(99)), expected(n, T(99));
        for (size_t i = 0; i < n; ++i) {
          send[i] = value<T>(me, i);
          if (source != kNoRank) expected[i] = value<T>(members[size_t(source)], i);
        }
        c.permute(send.data(), recv.data(), n, dest, source);
        CHECK(recv == expected);
      }
      {  // send_recv with different sizes each way: rank k sends n + k elements
        INFO("n=" << n << " send_recv");
        const int dest = (r + 1) % p, source = (r - 1 + p) % p;
        std::vector<T> send(n + size_t(r)), recv(n + size_t(source), T(99)), expected(recv.size());
        for (size_t i = 0; i < send.size(); ++i) send[i] = value<T>(me, i, 3);
        for (size_t i = 0; i < recv.size(); ++i) expected[i] = value<T>(members[size_t(source)], i, 3);
        test::send_recv(c, send.data(), send.size(), dest, recv.data(), recv.size(), source);
        CHECK(recv == expected);
      }
    }
  });
}

TEST_CASE("Comm: send/recv pairs with tags", "[comm][mpi]") {
  const int me = test::world_rank();
  for_each_axis([&](Comm& c, const std::vector<int>& members) {
    const int p = c.size(), r = c.rank();
    for (size_t n : kSizes) {
      INFO("n=" << n);
      // Pairs (0,1), (2,3), ...: the even rank sends two tagged messages then receives one reply.
      const int partner = r ^ 1;
      if (partner >= p) continue;
      const int who = members[size_t(partner)];
      if (r % 2 == 0) {
        std::vector<double> a(n);
        std::vector<int64_t> b(n + 1), reply(n, -1), expected(n);
        for (size_t i = 0; i < n; ++i) a[i] = value<double>(me, i, 1);
        for (size_t i = 0; i <= n; ++i) b[i] = value<int64_t>(me, i, 2);
        for (size_t i = 0; i < n; ++i) expected[i] = value<int64_t>(who, i, 4);
        c.send(a.data(), a.size(), partner, 11);
        c.send(b.data(), b.size(), partner, 12);
        c.recv(reply.data(), reply.size(), partner, 13);
        CHECK(reply == expected);
      } else {
        std::vector<double> a(n, -1), ea(n);
        std::vector<int64_t> b(n + 1, -1), eb(n + 1), reply(n);
        for (size_t i = 0; i < n; ++i) ea[i] = value<double>(who, i, 1);
        for (size_t i = 0; i <= n; ++i) eb[i] = value<int64_t>(who, i, 2);
        for (size_t i = 0; i < n; ++i) reply[i] = value<int64_t>(me, i, 4);
        c.recv(a.data(), a.size(), partner, 11);
        c.recv(b.data(), b.size(), partner, 12);
        c.send(reply.data(), reply.size(), partner, 13);
        CHECK(a == ea);
        CHECK(b == eb);
      }
    }
    c.barrier();
  });
}

TEST_CASE("Comm: misuse raises Error with a message, on every rank alike", "[comm][mpi]") {
  const int world = test::world_size();
  Mesh mesh(MPI_COMM_WORLD, 1, world, 1);
  Comm& c = mesh.axis(Axis::Data);
  std::vector<float> buf(4);
  std::vector<size_t> wrong(size_t(world) + 1, 0);
  CHECK_THROWS_WITH(c.exchange_counts(wrong), Catch::Contains("expected one per rank"));
  std::vector<float> out;
  CHECK_THROWS_AS(c.all_to_allv(buf.data(), std::span<const size_t>(wrong), out), Error);
  CHECK_THROWS_WITH(c.broadcast(buf.data(), 4, world), Catch::Contains("outside the group"));
  CHECK_THROWS_WITH(c.permute(buf.data(), buf.data(), 1, -2, 0), Catch::Contains("outside the group"));
  // Counts above INT_MAX are refused before any transfer (no buffer is touched).
  CHECK_THROWS_WITH(c.all_reduce(static_cast<float*>(nullptr), size_t(INT_MAX) + 1), Catch::Contains("INT_MAX"));
  CHECK_THROWS_WITH(c.all_to_all(static_cast<const float*>(nullptr), static_cast<float*>(nullptr), size_t(1) << 31),
                    Catch::Contains("INT_MAX"));
  // A receive buffer that is too small for the counts: every rank receives one element from
  // each rank and offers room for none.
  std::vector<size_t> ones(size_t(world), 1);
  std::vector<float> send(size_t(world), 1.f), recv(1);
  CHECK_THROWS_WITH(c.all_to_allv(send.data(), std::span<const size_t>(ones), recv.data(), 0),
                    Catch::Contains("buffer holds 0"));
  // A message of the wrong length: rank 0 sends 3 elements to itself, posts a receive of 2 / 4.
  if (c.rank() == 0) {
    Comm& self = mesh.axis(Axis::Pipe);  // size 1 here: a self-message
    std::vector<int32_t> three{1, 2, 3}, got(4);
    MPI_Request req;  // a nonblocking self-send, so the failing receive cannot block it
    MPI_Isend(three.data(), 3, MPI_INT32_T, 0, 21, static_cast<MpiComm&>(self).mpi(), &req);
    CHECK_THROWS_WITH(self.recv(got.data(), 4, 0, 21), Catch::Contains("expected 4 elements"));
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
  c.barrier();
}

TEST_CASE("Comm: the mesh's world comm reduces over all ranks", "[comm][mpi]") {
  const int world = test::world_size(), me = test::world_rank();
  Mesh mesh(MPI_COMM_WORLD, 1, 1, world);
  int64_t x = me + 1;
  mesh.world_comm().all_reduce(&x, 1, Op::Sum);
  CHECK(x == int64_t(world) * (world + 1) / 2);
  double y = me;
  mesh.world_comm().all_reduce(&y, 1, Op::Max);
  CHECK(y == double(world - 1));
}

TEST_CASE("comm: isend lets every rank send before it receives (a ring), then wait_sends", "[comm][mpi]") {
  const int world = test::world_size(), me = test::world_rank();
  Mesh mesh(MPI_COMM_WORLD, 1, world, 1);
  Comm& c = mesh.axis(Axis::Data);
  // Large enough to exceed MPI's eager limit, so a blocking send here would wait for its receive.
  const size_t n = 1 << 18;
  std::vector<double> out(n), in(n, -1.0);
  for (size_t i = 0; i < n; ++i) out[i] = double(me) * 1e6 + double(i);
  const int next = (me + 1) % world, prev = (me + world - 1) % world;
  c.isend(out.data(), n, next, 7);
  c.recv(in.data(), n, prev, 7);
  c.wait_sends();
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok = ok && in[i] == double(prev) * 1e6 + double(i);
  CHECK(ok);
}
