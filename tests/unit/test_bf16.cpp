// model.precision = "bf16" (docs/ARCHITECTURE.md "Precision"): the rounding against hand-computed
// cases and an independent nearest-value search, the emulated GEMM against a float64 product of
// the rounded operands, and the router's fp32 arithmetic. The whole model against PyTorch is
// tests/scripts/model_vs_torch.sh (its *_bf16 cases); training and mesh invariance are
// tests/scripts/bf16_train.sh.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "../test_util.hpp"
#include "../support/model_support.hpp"
#include "model/moe/router.hpp"
#include "tensor/bf16.hpp"
#include "tensor/blas.hpp"
#include "test_moe_util.hpp"

using namespace meshmoe;

namespace {

float from_bits(uint32_t u) { return bits_float(u); }
uint32_t rounded_bits(uint32_t u) { return float_bits(round_bf16(from_bits(u))); }

// The nearest bf16 value to finite x, ties to the even one, found without bit arithmetic: the two
// bf16 values around x (truncation towards zero, and one bf16 step further out, 2^128 past the
// largest finite one, which is where IEEE rounding overflows to infinity), compared in double.
double nearest_bf16_oracle(float x) {
  const double v = std::fabs(double(x));
  if (v == 0) return x;
  int e = 0;
  std::frexp(v, &e);                                   // v = f 2^e, f in [0.5, 1)
  const double ulp = std::ldexp(1.0, std::max(e, -125) - 8);  // 8 significant bits; subnormals below 2^-126
  const double lo = std::floor(v / ulp) * ulp, hi = lo + ulp;
  double r;
  if (v - lo < hi - v) r = lo;
  else if (hi - v < v - lo) r = hi;
  else r = std::fmod(lo / ulp, 2.0) == 0 ? lo : hi;  // tie: the even significand
  if (r >= std::ldexp(1.0, 128)) r = std::numeric_limits<double>::infinity();
  return x < 0 ? -r : r;
}

}  // namespace

TEST_CASE("bf16 rounding: hand-computed cases", "[bf16]") {
  // 1 + 2^-8 is half-way between 1 and 1 + 2^-7 (0x3f80, 0x3f81): ties to the even 0x3f80.
  CHECK(rounded_bits(0x3f800000u) == 0x3f800000u);
  CHECK(rounded_bits(0x3f808000u) == 0x3f800000u);
  CHECK(rounded_bits(0x3f807fffu) == 0x3f800000u);  // just below half-way
  CHECK(rounded_bits(0x3f808001u) == 0x3f810000u);  // just above
  CHECK(round_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);
  // 1 + 3 2^-8 is half-way between 0x3f81 and 0x3f82: ties to the even 0x3f82 = 1 + 2^-6.
  CHECK(round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));
  CHECK(round_bf16(-(1.0f + 3 * std::ldexp(1.0f, -8))) == -(1.0f + std::ldexp(1.0f, -6)));
  CHECK(round_bf16(0.1f) == 0.10009765625f);  // 0x3dcccccd -> 0x3dcd (1.6015625 2^-4)
  CHECK(rounded_bits(0x80000000u) == 0x80000000u);  // -0 keeps its sign
  // Carry into the exponent: 2 - 2^-9 (0x3fffc000, above half-way between 0x3fff and 0x4000) -> 2.
  CHECK(round_bf16(2.0f - std::ldexp(1.0f, -9)) == 2.0f);

  // The largest finite bf16 (2 - 2^-7) 2^127 = 0x7f7f0000 stays; from the midpoint to 2^128 on,
  // values round to infinity (the midpoint itself too: the kept 0x7f7f is odd).
  const float largest = std::ldexp(2.0f - std::ldexp(1.0f, -7), 127);
  CHECK(float_bits(largest) == 0x7f7f0000u);
  CHECK(round_bf16(largest) == largest);
  CHECK(rounded_bits(0x7f7f7fffu) == 0x7f7f0000u);
  CHECK(std::isinf(round_bf16(from_bits(0x7f7f8000u))));
  CHECK(round_bf16(std::numeric_limits<float>::max()) == std::numeric_limits<float>::infinity());
  CHECK(round_bf16(-std::numeric_limits<float>::max()) == -std::numeric_limits<float>::infinity());
  CHECK(rounded_bits(0x7f7e8000u) == 0x7f7e0000u);  // a tie below: to the even 0x7f7e
  CHECK(round_bf16(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(round_bf16(-std::numeric_limits<float>::infinity()) == -std::numeric_limits<float>::infinity());

  // NaN stays NaN, also a signalling NaN whose payload lies only in the dropped 16 bits (plain
  // rounding would carry it into infinity or truncate it to one), with its sign.
  CHECK(std::isnan(round_bf16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(round_bf16(from_bits(0x7f800001u))));
  CHECK(std::isnan(round_bf16(from_bits(0x7fffffffu))));
  CHECK(rounded_bits(0xff800001u) >> 31 == 1u);
  CHECK(std::isnan(round_bf16(from_bits(0xff800001u))));

  // Subnormals: the smallest bf16 subnormal is 0x0001 = 2^-133; half of it (0x00008000) ties to
  // the even 0, a hair more rounds up; 1.5 of it ties to the even 0x0002; the largest fp32
  // subnormal rounds up to the smallest normal 2^-126.
  CHECK(rounded_bits(0x00000001u) == 0u);
  CHECK(rounded_bits(0x00008000u) == 0u);
  CHECK(rounded_bits(0x00008001u) == 0x00010000u);
  CHECK(round_bf16(from_bits(0x00008001u)) == std::ldexp(1.0f, -133));
  CHECK(rounded_bits(0x00018000u) == 0x00020000u);
  CHECK(rounded_bits(0x00028000u) == 0x00020000u);
  CHECK(rounded_bits(0x007fffffu) == 0x00800000u);
  CHECK(round_bf16(from_bits(0x007fffffu)) == std::numeric_limits<float>::min());
  CHECK(rounded_bits(0x807fffffu) == 0x80800000u);
}

TEST_CASE("bf16 rounding equals the nearest bf16 value, ties to even, over random bit patterns", "[bf16]") {
  std::mt19937 rng(20240611u);
  int64_t checked = 0, ties = 0;
  for (int i = 0; i < 400000; ++i) {
    uint32_t u = rng();
    if (i % 4 == 1) u = (u & 0xffff0000u) | 0x8000u;  // exact ties
    const float x = from_bits(u);
    if (std::isnan(x)) {
      REQUIRE(std::isnan(round_bf16(x)));
      continue;
    }
    const float r = round_bf16(x);
    if (std::isinf(x)) {
      REQUIRE(r == x);
      continue;
    }
    INFO("bits " << std::hex << u);
    REQUIRE((float_bits(r) & 0xffffu) == 0u);
    REQUIRE(double(r) == nearest_bf16_oracle(x));
    ++checked;
    ties += (u & 0xffffu) == 0x8000u;
  }
  CHECK(checked > 390000);
  CHECK(ties > 90000);
}

TEST_CASE("bf16 GEMM emulation equals a float64 product of the rounded operands", "[bf16]") {
  std::mt19937 rng(7u);
  std::normal_distribution<float> normal(0.f, 1.f);
  const test::GemmPrecisionScope bf16(Precision::Bf16);
  for (int variant = 0; variant < 8; ++variant) {
    const bool ta = variant & 1, tb = variant & 2, padded = variant & 4;
    const int M = 37, N = 23, K = 61;
    const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
    const int lda = a_cols + (padded ? 5 : 0), ldb = b_cols + (padded ? 3 : 0), ldc = N + (padded ? 2 : 0);
    // Magnitudes over many binades, so the rounding acts on every exponent.
    auto fill = [&](std::vector<float>& v) {
      for (float& x : v) x = normal(rng) * std::ldexp(1.0f, int(rng() % 17) - 8);
    };
    std::vector<float> A(size_t(a_rows) * lda), B(size_t(b_rows) * ldb), C(size_t(M) * ldc);
    fill(A), fill(B), fill(C);
    const std::vector<float> A0 = A, B0 = B, C0 = C;
    const float alpha = 0.75f, beta = padded ? 0.5f : 0.0f;
    gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
    CHECK(A == A0);  // the operands are rounded in copies
    CHECK(B == B0);
    double worst = 0, worst_unrounded = 0;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double exact = 0, magnitude = 0, unrounded = 0;
        for (int k = 0; k < K; ++k) {
          const float a = ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k];
          const float b = tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j];
          const double p = double(round_bf16(a)) * double(round_bf16(b));
          exact += p;
          magnitude += std::fabs(p);
          unrounded += double(a) * double(b);
        }
        const double c0 = double(C0[size_t(i) * ldc + j]);
        exact = alpha * exact + beta * c0;
        unrounded = alpha * unrounded + beta * c0;
        const double scale = alpha * magnitude + std::fabs(beta * c0);
        const double got = C[size_t(i) * ldc + j];
        worst = std::max(worst, std::fabs(got - exact) / scale);
        worst_unrounded = std::max(worst_unrounded, std::fabs(got - unrounded) / scale);
      }
    INFO("trans_a " << ta << " trans_b " << tb << " padded " << padded);
    // fp32 sums of K = 61 exact products: error at most K u relative to the sum of magnitudes
    // (u = 2^-24), in practice far less.
    CHECK(worst <= 1e-6);
    CHECK(worst_unrounded > 1e-4);  // the operands were rounded: not the fp32 product
    // Padding between the rows of C is untouched.
    if (padded)
      for (int i = 0; i < M; ++i)
        for (int j = N; j < ldc; ++j) CHECK(C[size_t(i) * ldc + j] == C0[size_t(i) * ldc + j]);
  }
}

TEST_CASE("bf16 precision: gemm_fp32 and the double GEMM do not round, the model's gemm does", "[bf16]") {
  const int M = 3, N = 4, K = 5;
  std::vector<float> A(M * K), B(K * N), C32(M * N), Cm(M * N);
  for (int i = 0; i < M * K; ++i) A[size_t(i)] = 1.0f + float(i) / 7.0f;
  for (int i = 0; i < K * N; ++i) B[size_t(i)] = 0.5f - float(i) / 11.0f;
  std::vector<float> plain(M * N);
  matmul(false, false, M, N, K, A.data(), B.data(), plain.data());  // Fp32: the default
  CHECK(gemm_precision() == Precision::Fp32);
  {
    const test::GemmPrecisionScope bf16(Precision::Bf16);
    matmul_fp32(false, false, M, N, K, A.data(), B.data(), C32.data());
    matmul(false, false, M, N, K, A.data(), B.data(), Cm.data());
    std::vector<double> Ad(A.begin(), A.end()), Bd(B.begin(), B.end()), Cd(M * N), Cd_fp32(M * N);
    matmul(false, false, M, N, K, Ad.data(), Bd.data(), Cd.data());
    matmul_fp32(false, false, M, N, K, Ad.data(), Bd.data(), Cd_fp32.data());
    CHECK(Cd == Cd_fp32);
  }
  CHECK(gemm_precision() == Precision::Fp32);  // the scope restored it
  CHECK(C32 == plain);
  CHECK(Cm != plain);
}

TEST_CASE("bf16 precision: the router's GEMMs and softmax stay fp32", "[bf16][moe]") {
  // A router under model.precision = bf16 gives bitwise the fp32 router's probabilities, routing,
  // input gradient and weight gradient; with its GEMM operands rounded the probabilities would
  // move (checked: the inputs and weights are not bf16 values).
  const MoeOptions opt = test::small_moe(RouterKind::Top2);
  const int N = 16, M = opt.d_model, E = opt.num_experts;
  const std::vector<double> xd = test::normal_vector(size_t(N) * M, 5);
  const std::vector<float> x(xd.begin(), xd.end());
  const std::vector<double> gd = test::normal_vector(size_t(N) * 2, 6);
  const std::vector<float> dgate(gd.begin(), gd.end());
  struct Result {
    std::vector<float> probs, dx, dwg;
    std::vector<int> decisions;
  };
  auto run = [&](Precision p) {
    const test::GemmPrecisionScope scope(p);
    ParamStore<float> store;
    Router<float> router(opt);
    router.declare(store, "r");
    store.allocate();
    store.init(3, 1.0);
    int not_bf16 = 0;
    for (size_t i = 0; i < size_t(M) * E; ++i) not_bf16 += round_bf16(router.wg.w[i]) != router.wg.w[i];
    CHECK(not_bf16 > M * E / 2);
    StepContext ctx;
    ctx.seed = 1, ctx.step = 2;
    test::route_and_read_totals(router, ctx, x.data(), N);
    Result r;
    r.probs.assign(router.probs().begin(), router.probs().end());
    r.decisions = test::decisions(router.routing());
    r.dx.assign(size_t(N) * M, 0.f);
    store.zero_grad();
    router.backward(ctx, dgate.data(), r.dx.data(), N, 0.3, 0.01);
    r.dwg.assign(router.wg.g, router.wg.g + size_t(M) * E);
    // What the probabilities would be with rounded operands: they differ.
    std::vector<float> xr(x.size()), wr(size_t(M) * E), logits(size_t(N) * E);
    for (size_t i = 0; i < x.size(); ++i) xr[i] = round_bf16(x[i]);
    for (size_t i = 0; i < wr.size(); ++i) wr[i] = round_bf16(router.wg.w[i]);
    std::vector<float> exact(size_t(N) * E);
    matmul_fp32(false, false, N, E, M, xr.data(), wr.data(), logits.data());
    matmul_fp32(false, false, N, E, M, x.data(), router.wg.w, exact.data());
    CHECK(logits != exact);
    return r;
  };
  const Result a = run(Precision::Fp32), b = run(Precision::Bf16);
  CHECK(a.probs == b.probs);
  CHECK(a.decisions == b.decisions);
  CHECK(a.dx == b.dx);
  CHECK(a.dwg == b.dwg);
}

TEST_CASE("bf16 precision: an MoE layer's experts round, its router does not", "[bf16][moe]") {
  const MoeOptions opt = test::small_moe(RouterKind::Top2);
  const int N = 16, M = opt.d_model;
  const std::vector<double> xd = test::normal_vector(size_t(N) * M, 9);
  const std::vector<float> x(xd.begin(), xd.end());
  auto run = [&](Precision p, std::vector<float>& probs) {
    const test::GemmPrecisionScope scope(p);
    test::MoeHarness<float> h(opt, 4);
    std::vector<float> y(x.size());
    StepContext ctx;
    h.layer->forward(ctx, x.data(), y.data(), N);
    probs.assign(h.layer->router.probs().begin(), h.layer->router.probs().end());
    return y;
  };
  std::vector<float> p32, p16;
  const std::vector<float> y32 = run(Precision::Fp32, p32), y16 = run(Precision::Bf16, p16);
  CHECK(p32 == p16);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < y32.size(); ++i) {
    worst = std::max(worst, double(std::fabs(y32[i] - y16[i])));
    scale = std::max(scale, double(std::fabs(y32[i])));
  }
  // Rounded operands move the output by about 2^-9 relative per operand, not more than 2^-6.
  CHECK(worst > 1e-4 * scale);
  CHECK(worst < std::ldexp(1.0, -6) * scale);
}
