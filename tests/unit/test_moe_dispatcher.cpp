// The token dispatchers (model/moe/token_dispatcher.hpp) on their own, in the spirit of
// Megatron-Core's dispatcher tests: with experts that double their rows and gates that sum to 1/2
// over a token's dispatched choices (unit gates, the experts' factor aside: it tells their output
// rows from their input rows), dispatch then combine returns the input, and the backward returns
// the output gradient as the input gradient, for each of the three dispatchers (local on any rank count;
// all-to-all over data and index-select over tensor on every data x tensor split of 2 and 4 ranks).
// Also: every expert-side row holds the input row of the token it names (an empty slot a zero
// row), the gate gradient is <dy, 2 x> of the token, the layer's one wait runs once per dispatch,
// and the shared experts' partial sums enter y and dx once (summed over tensor where index-select
// folds them into its all-reduces). The values are multiples of 1/8 and the gates 1/8, 1/4, 3/8 or
// 1/2, so every product and sum is exact and the checks are bitwise.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "../test_util.hpp"
#include "mesh/mesh.hpp"
#include "model/moe/token_dispatcher.hpp"
#include "test_moe_util.hpp"

using namespace meshmoe;
using namespace meshmoe::test;

namespace {

constexpr int kE = 8, kM = 6, kS = 16, kK = 2;
constexpr int kGroupsPerRank = 2;

// x and dy of global token g: multiples of 1/8 in [-2, 2].
double x_of(int64_t g, int m) { return double(int((g * 37 + m * 11) % 33) - 16) / 8.0; }
double dy_of(int64_t g, int m) { return double(int((g * 13 + m * 29 + 5) % 33) - 16) / 8.0; }
// The shared experts' output (or input gradient) partial sum of tensor rank t at token g.
double shared_of(int64_t g, int m, int t) { return double((t + 1) * int((g + 3 * m) % 5)) / 16.0; }

// The routing of global tokens [first, first + N) (groups of kS tokens from first, a multiple of
// kS), the same on every rank for the same token: two distinct experts per token, gates 1/4 + 1/4,
// 1/8 + 3/8, or 1/2 with the second choice dropped (half the time after it took a slot: an empty
// row below filled ones, moe.declined_takes_slot). C = the largest fill over every rank's groups
// (capacity routing, C < S), or S (dropless).
Routing<double> make_routing(int64_t first, int N, int64_t all_tokens, bool dropless) {
  struct Choice {
    int expert, slot;
    double gate;
  };
  std::vector<Choice> all(size_t(all_tokens) * kK);
  int C = 0;
  for (int64_t g0 = 0; g0 < all_tokens; g0 += kS) {
    std::vector<int> fill(kE, 0);
    for (int64_t g = g0; g < g0 + kS; ++g) {
      const int e1 = int((g * 5 + 3) % kE), e2 = (e1 + 1 + int((g * 7) % (kE - 1))) % kE;
      Choice* c = &all[size_t(g) * kK];
      c[0] = {e1, fill[e1]++, 0.25};
      switch (g % 4) {
        case 0: c[1] = {e2, fill[e2]++, 0.25}; break;
        case 1: c[0].gate = 0.125, c[1] = {e2, fill[e2]++, 0.375}; break;
        case 2: c[0].gate = 0.5, c[1] = {Routing<double>::kDropped, -1, 0.0}; break;
        default: c[0].gate = 0.5, c[1] = {Routing<double>::kDeclined, -1, 0.0}, ++fill[e2]; break;  // a hole
      }
    }
    C = std::max(C, *std::max_element(fill.begin(), fill.end()));
  }
  REQUIRE(C < kS);
  Routing<double> r;
  r.N = N, r.k = kK, r.S = kS, r.G = N / kS, r.C = dropless ? kS : C, r.E = kE;
  std::vector<int> expert, slot;
  std::vector<double> gate;
  for (size_t c = size_t(first) * kK; c < size_t(first + N) * kK; ++c) {
    expert.push_back(all[c].expert);
    slot.push_back(all[c].slot);
    gate.push_back(all[c].gate);
  }
  r.expert = Buffer<int>(expert.begin(), expert.end());
  r.slot = Buffer<int>(slot.begin(), slot.end());
  r.gate = Buffer<double>(gate.begin(), gate.end());
  return r;
}

// One forward and backward through the dispatcher with doubling experts; every check above.
void round_trip(TokenDispatcher<double>& d, const Mesh& mesh, int64_t first, int N, int64_t all_tokens, bool dropless,
                bool folded) {
  INFO((dropless ? "dropless (C = S)" : "capacity routing (C < S)"));
  const Routing<double> r = make_routing(first, N, all_tokens, dropless);
  const int t = mesh.coord(Axis::Tensor), Tn = mesh.extent(Axis::Tensor);
  StepContext ctx;
  ctx.token_offset = uint64_t(first);
  std::vector<double> x(size_t(N) * kM), dy(x.size()), shared(x.size()), y(x.size(), -1.0), dx(x.size(), 0.0);
  for (int n = 0; n < N; ++n)
    for (int m = 0; m < kM; ++m) {
      x[size_t(n) * kM + m] = x_of(first + n, m);
      dy[size_t(n) * kM + m] = dy_of(first + n, m);
      shared[size_t(n) * kM + m] = shared_of(first + n, m, t);
    }

  int waits = 0;
  d.dispatch(ctx, r, x.data(), [&] { ++waits; });
  CHECK(waits == 1);
  const ExpertRows<double> in = d.expert_input();
  const size_t rows = size_t(std::accumulate(in.count.begin(), in.count.end(), 0));
  int wrong = 0;
  for (size_t row = 0; row < rows; ++row)
    for (int m = 0; m < kM; ++m) wrong += in.x[row * kM + m] != (in.token[row] < 0 ? 0.0 : x_of(in.token[row], m));
  CHECK(wrong == 0);
  for (size_t i = 0; i < rows * kM; ++i) in.y[i] = 2 * in.x[i];  // the experts
  d.release_expert_input();
  d.combine(ctx, r, shared.data(), y.data());

  d.combine_backward(ctx, r, dy.data());
  const ExpertGradRows<double> grads = d.expert_grads();
  for (size_t i = 0; i < rows * kM; ++i) grads.dx[i] += 2 * grads.dy[i];
  d.release_expert_input();
  double* dxs = d.shared_input_grad(dx.data());
  for (size_t i = 0; i < dx.size(); ++i) dxs[i] += shared[i];
  d.dispatch_backward(ctx, r, dx.data());

  // What the shared experts add: this rank's part, or with index-select the sum over tensor.
  int bad_y = 0, bad_dx = 0, bad_dgate = 0;
  const double* dgate = d.gate_grad();
  for (int n = 0; n < N; ++n) {
    for (int m = 0; m < kM; ++m) {
      double s = 0;
      for (int u = 0; u < (folded ? Tn : 1); ++u) s += shared_of(first + n, m, folded ? u : t);
      bad_y += y[size_t(n) * kM + m] != x_of(first + n, m) + s;
      bad_dx += dx[size_t(n) * kM + m] != dy_of(first + n, m) + s;
    }
    for (int i = 0; i < kK; ++i) {
      const size_t c = size_t(n) * kK + size_t(i);
      double want = 0;
      if (r.expert[c] >= 0)
        for (int m = 0; m < kM; ++m) want += dy_of(first + n, m) * (2 * x_of(first + n, m));
      bad_dgate += dgate[c] != want;
    }
  }
  CHECK(bad_y == 0);
  CHECK(bad_dx == 0);
  CHECK(bad_dgate == 0);
}

// Every data x tensor split of the job's ranks that 8 experts divide over, each expert axis.
void check_dispatchers() {
  const int W = world_size();
  for (int D = 1; D <= W; ++D) {
    if (W % D != 0) continue;
    const int Tn = W / D;
    if (kE % D != 0 || kE % Tn != 0) continue;
    Mesh mesh(MPI_COMM_WORLD, 1, D, Tn);
    const int dr = mesh.coord(Axis::Data);
    for (const ExpertAxis axis : {ExpertAxis::Data, ExpertAxis::Tensor}) {
      TokenDispatcher<double> d(layer_placement(mesh, axis), kE, kM);
      const std::string want = axis == ExpertAxis::Data ? (D > 1 ? "all-to-all" : "local")
                                                        : (Tn > 1 ? "index-select" : "local");
      INFO("mesh data=" << D << " x tensor=" << Tn << ", expert_axis = "
                        << (axis == ExpertAxis::Data ? "data" : "tensor") << ", dispatcher " << want);
      CHECK(d.name() == want);
      const int N = kGroupsPerRank * kS;
      const int64_t first = int64_t(dr) * N, all_tokens = int64_t(D) * N;
      for (const bool dropless : {false, true, false})  // the room of the full layout, none, reused
        round_trip(d, mesh, first, N, all_tokens, dropless, d.folds_shared_partial_sums());
      CHECK(d.folds_shared_partial_sums() == (want == "index-select"));
    }
  }
}

}  // namespace

TEST_CASE("moe dispatchers: dispatch then combine with unit gates returns the input, forward and backward",
          "[moe][mpi]") {
  check_dispatchers();
}
