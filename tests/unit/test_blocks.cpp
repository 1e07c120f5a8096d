// The blocks of today's MoE models (docs/ARCHITECTURE.md "Blocks"): RMSNorm, rotary positions and
// the leading dense layers, each against an independent oracle (SwiGLU is in test_layers_fd.cpp's
// activation and feed-forward cases beside the other activations).
//
// Finite differences: L = sum(r * y) for a fixed random r, central differences with h = 1e-6 in
// double, |analytic - numeric| <= 1e-6 max(1, |numeric|) (test_layers_fd.cpp's convention).
// Forward oracles: naive loops in double, 1e-12 absolute (the same formula, double rounding only).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/attention.hpp"
#include "model/layernorm.hpp"
#include "model/rope.hpp"
#include "model/shape_table.hpp"
#include "model/transformer.hpp"
#include "../test_util.hpp"

using namespace meshmoe;

namespace {

constexpr double kFdStep = 1e-6, kFdTol = 1e-6;

std::vector<double> random_vec(size_t n, std::mt19937& gen, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of loss() w.r.t. every element of `value` (n of them) against `analytic`.
void check_fd(const std::string& what, const std::function<double()>& loss, double* value,
              const std::vector<double>& analytic) {
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < analytic.size(); ++i) {
    const double w0 = value[i];
    value[i] = w0 + kFdStep;
    const double lp = loss();
    value[i] = w0 - kFdStep;
    const double lm = loss();
    value[i] = w0;
    const double num = (lp - lm) / (2 * kFdStep);
    const double err = std::abs(analytic[i] - num) / std::max(1.0, std::abs(num));
    if (err > worst) worst = err, worst_i = i;
  }
  INFO(what << "[" << worst_i << "]: worst relative error " << worst);
  CHECK(worst <= kFdTol);
}

// Every parameter of `store` perturbed, so gains are not 1.
void perturb(ParamStore<double>& store, std::mt19937& gen) {
  std::uniform_real_distribution<double> u(-0.3, 0.3);
  for (size_t i = 0; i < store.size(); ++i) store.weights()[i] += u(gen);
}

void check_params_fd(ParamStore<double>& store, const std::function<double()>& loss) {
  for (const ParamInfo& p : store.infos())
    check_fd(p.name, loss, store.weights() + p.flat_offset,
             std::vector<double>(store.grads() + p.flat_offset, store.grads() + p.flat_offset + p.size));
}

StepContext train_ctx() {
  StepContext c;
  c.seed = 99;
  c.step = 3;
  return c;
}

// The rotate-half rotation of one head's vector v [D] at position p, written out as the Hugging
// Face Llama code states it: v * cos + rotate_half(v) * sin, rotate_half(v) = (-v[D/2:], v[:D/2]),
// with cos and sin of p * base^(-2i/D) repeated over both halves.
std::vector<double> rotate_half_oracle(const std::vector<double>& v, int p, double base) {
  const int D = int(v.size()), half = D / 2;
  std::vector<double> out(v.size());
  for (int d = 0; d < D; ++d) {
    const int i = d % half;
    const double angle = p * std::pow(base, -2.0 * i / D);
    const double rotated = d < half ? -v[size_t(d + half)] : v[size_t(d - half)];
    out[size_t(d)] = v[size_t(d)] * std::cos(angle) + rotated * std::sin(angle);
  }
  return out;
}

// Naive causal or bidirectional self-attention with rotary positions over the heads [h0, h0 + lh)
// of `a`'s weights (its local block, columns c of wq are head (c / D) - h0), as loops: q and k of
// every token projected, rotated by rotate_half_oracle at its position, then the softmax attention
// within each packed example, then wo. position/segment [N].
std::vector<double> naive_rope_attention(const std::vector<double>& x, const CausalSelfAttention<double>& a, int N,
                                         int T, const int32_t* segment, const int32_t* position, double base) {
  const int M = int(x.size()) / N, lh = a.local_heads(), D = M / a.num_heads(), A = lh * D;
  auto project = [&](const double* W, int n, int h) {
    std::vector<double> v(size_t(D), 0.0);
    for (int d = 0; d < D; ++d)
      for (int m = 0; m < M; ++m) v[size_t(d)] += x[size_t(n) * M + m] * W[size_t(m) * A + h * D + d];
    return v;
  };
  std::vector<double> att(size_t(N) * A, 0.0), y(size_t(N) * M, 0.0);
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < lh; ++h) {
      const int b = n / T, i = n % T;
      const auto q = rotate_half_oracle(project(a.wq.w, n, h), position[n], base);
      std::vector<double> s(size_t(T), 0.0);
      std::vector<bool> seen(size_t(T), false);
      double mx = -1e300;
      for (int j = 0; j < T; ++j) {
        const int m = b * T + j;
        if ((a.causal() && j > i) || segment[m] != segment[n]) continue;
        const auto k = rotate_half_oracle(project(a.wk.w, m, h), position[m], base);
        double qk = 0;
        for (int d = 0; d < D; ++d) qk += q[size_t(d)] * k[size_t(d)];
        s[size_t(j)] = qk / std::sqrt(double(D));
        seen[size_t(j)] = true;
        mx = std::max(mx, s[size_t(j)]);
      }
      double z = 0;
      for (int j = 0; j < T; ++j) z += (s[size_t(j)] = seen[size_t(j)] ? std::exp(s[size_t(j)] - mx) : 0.0);
      for (int j = 0; j < T; ++j) {
        if (!seen[size_t(j)]) continue;
        const auto v = project(a.wv.w, b * T + j, h);
        for (int d = 0; d < D; ++d) att[size_t(n) * A + h * D + d] += s[size_t(j)] / z * v[size_t(d)];
      }
    }
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < M; ++c)
      for (int k = 0; k < A; ++k) y[size_t(n) * M + c] += att[size_t(n) * A + k] * a.wo.w[size_t(k) * M + c];
  return y;
}

}  // namespace

TEST_CASE("rmsnorm: forward oracle, finite differences, no bias, float vs double", "[layers][blocks]") {
  std::mt19937 gen(41);
  const int N = 70, M = 10;  // 70 rows: two chunks of the parameter gradient's partial sums
  const double eps = 1e-5;
  LayerNorm<double> ln(M, eps, NormKind::RmsNorm);
  ParamStore<double> store;
  ln.declare(store, "ln");
  REQUIRE(store.infos().size() == 1);  // gain only
  CHECK(store.infos()[0].name == "ln.gain");
  store.allocate();
  store.init(3, 1.0);
  perturb(store, gen);
  auto x = random_vec(size_t(N) * M, gen, -2, 2);
  auto r = random_vec(size_t(N) * M, gen);
  std::vector<double> y(x.size()), dx(x.size(), 0.0);
  const StepContext ctx = train_ctx();
  ln.forward(ctx, x.data(), y.data(), N);
  for (int n = 0; n < N; ++n) {
    double ms = 0;
    for (int m = 0; m < M; ++m) ms += x[size_t(n) * M + m] * x[size_t(n) * M + m] / M;
    for (int m = 0; m < M; ++m)
      CHECK(std::abs(y[size_t(n) * M + m] - x[size_t(n) * M + m] / std::sqrt(ms + eps) * ln.gain.w[m]) <= 1e-12);
  }
  store.zero_grad();
  ln.backward(ctx, r.data(), dx.data(), N);
  auto loss = [&] {
    ln.forward(ctx, x.data(), y.data(), N);
    return dot(r, y);
  };
  check_params_fd(store, loss);
  check_fd("x", loss, x.data(), dx);

  LayerNorm<float> lf(M, eps, NormKind::RmsNorm);
  ParamStore<float> sf;
  lf.declare(sf, "ln");
  sf.allocate();
  for (size_t i = 0; i < sf.size(); ++i) sf.weights()[i] = float(store.weights()[i]);
  std::vector<float> xf(x.begin(), x.end()), yf(x.size());
  std::vector<double> xd(xf.begin(), xf.end());
  lf.forward(ctx, xf.data(), yf.data(), N);
  ln.forward(ctx, xd.data(), y.data(), N);
  double worst = 0;
  for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::abs(double(yf[i]) - y[i]) / std::max(1.0, std::abs(y[i])));
  CHECK(worst <= 1e-5);
}

TEST_CASE("rope: the rotation is rotate-half's, and the inverse undoes it", "[layers][blocks]") {
  std::mt19937 gen(42);
  const int N = 6, heads = 3, D = 8, ld = heads * D + 5;  // strided rows
  const double base = 10000;
  const std::vector<int32_t> position{0, 1, 2, 0, 7, 3};
  auto x = random_vec(size_t(N) * ld, gen);
  std::vector<double> y = x;
  rope_rotate(y.data(), N, heads, D, ld, position.data(), 6, base, false);
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < heads; ++h) {
      const std::vector<double> v(x.begin() + n * ld + h * D, x.begin() + n * ld + (h + 1) * D);
      const auto want = rotate_half_oracle(v, position[size_t(n)], base);
      for (int d = 0; d < D; ++d) CHECK(std::abs(y[size_t(n) * ld + h * D + d] - want[size_t(d)]) <= 1e-15);
    }
  for (int n = 0; n < N; ++n)  // the padding columns are left alone
    for (int c = heads * D; c < ld; ++c) CHECK(y[size_t(n) * ld + c] == x[size_t(n) * ld + c]);
  rope_rotate(y.data(), N, heads, D, ld, position.data(), 6, base, true);
  for (size_t i = 0; i < x.size(); ++i) CHECK(std::abs(y[i] - x[i]) <= 1e-15);
  // Without positions: n % T.
  std::vector<double> a = x, b = x;
  const std::vector<int32_t> mod{0, 1, 2, 0, 1, 2};
  rope_rotate(a.data(), N, heads, D, ld, nullptr, 3, base, false);
  rope_rotate(b.data(), N, heads, D, ld, mod.data(), 3, base, false);
  CHECK(a == b);
}

TEST_CASE("rope attention: forward oracle, finite differences, packed positions, causal and bidirectional",
          "[layers][blocks]") {
  std::mt19937 gen(43);
  const int M = 12, H = 3, T = 5, B = 2, N = B * T;
  const double base = 50;
  // Row 0 holds three examples (positions restart), row 1 one.
  const std::vector<int32_t> segment{0, 0, 1, 2, 2, /**/ 0, 0, 0, 0, 0};
  const std::vector<int32_t> position{0, 1, 0, 0, 1, /**/ 0, 1, 2, 3, 4};
  for (bool causal : {true, false}) {
    INFO((causal ? "causal" : "bidirectional"));
    CausalSelfAttention<double> att(attention_shape(M, H, whole(H)), 0.0, 17, causal, base);
    ParamStore<double> store;
    att.declare(store, "attn");
    store.allocate();
    store.init(13, 1.0);
    perturb(store, gen);
    auto x = random_vec(size_t(N) * M, gen);
    auto r = random_vec(size_t(N) * M, gen);
    std::vector<double> y(x.size()), dx(x.size(), 0.0);
    StepContext ctx = train_ctx();
    ctx.segment = segment.data();
    ctx.position = position.data();
    att.forward(ctx, x.data(), y.data(), N, T);
    const auto want = naive_rope_attention(x, att, N, T, segment.data(), position.data(), base);
    for (size_t i = 0; i < y.size(); ++i) CHECK(std::abs(y[i] - want[i]) <= 1e-12);
    // Rotary positions are relative: every example's positions shifted alike leave the output; a
    // change of the distances between tokens does not.
    const std::vector<int32_t> shifted{3, 4, 1, 5, 6, /**/ 2, 3, 4, 5, 6};
    std::vector<double> y_shifted(x.size());
    StepContext shifted_ctx = ctx;
    shifted_ctx.position = shifted.data();
    att.forward(shifted_ctx, x.data(), y_shifted.data(), N, T);
    for (size_t i = 0; i < y.size(); ++i) CHECK(std::abs(y_shifted[i] - y[i]) <= 1e-12);
    const std::vector<int32_t> swapped{1, 0, 0, 0, 1, /**/ 0, 1, 2, 3, 4};
    const auto other = naive_rope_attention(x, att, N, T, segment.data(), swapped.data(), base);
    double moved = 0;
    for (int m = 0; m < M; ++m) moved += std::abs(other[size_t(M + m)] - y[size_t(M + m)]);  // token 1
    CHECK(moved > 1e-6);
    store.zero_grad();
    att.backward(ctx, r.data(), dx.data(), N);
    auto loss = [&] {
      att.forward(ctx, x.data(), y.data(), N, T);
      return dot(r, y);
    };
    check_params_fd(store, loss);
    check_fd("x", loss, x.data(), dx);
  }
}

TEST_CASE("rope attention: head blocks sum to the full layer (tensor-parallel layout)", "[layers][blocks]") {
  std::mt19937 gen(44);
  const int M = 12, H = 3, T = 4, N = 8;
  auto x = random_vec(size_t(N) * M, gen);
  auto r = random_vec(size_t(N) * M, gen);
  const StepContext ctx = train_ctx();  // no positions: n % T
  std::vector<std::vector<double>> ys, dxs;
  for (auto [h0, lh] : {std::pair{0, 3}, {0, 1}, {1, 2}}) {
    CausalSelfAttention<double> a(attention_shape(M, H, {h0, lh}), 0.0, 1, true, 10000);
    ParamStore<double> store;
    a.declare(store, "attn");
    store.allocate();
    store.init(21, 1.0);  // by logical index: a block gets the full layer's values
    std::vector<double> y(x.size()), dx(x.size(), 0.0);
    a.forward(ctx, x.data(), y.data(), N, T);
    a.backward(ctx, r.data(), dx.data(), N);
    ys.push_back(y);
    dxs.push_back(dx);
  }
  for (size_t i = 0; i < x.size(); ++i) {
    CHECK(std::abs(ys[1][i] + ys[2][i] - ys[0][i]) <= 1e-12);
    CHECK(std::abs(dxs[1][i] + dxs[2][i] - dxs[0][i]) <= 1e-12);
  }
}

TEST_CASE("blocks: the shape table follows model.norm, model.position and moe.first_dense", "[shapes][blocks]") {
  Config c;
  c.model.num_layers = 4;
  c.model.seq_len = 8;
  c.model.d_model = 16;
  c.model.num_heads = 2;
  c.model.norm = NormKind::RmsNorm;
  c.model.position = PositionKind::Rope;
  c.model.activation = Activation::Swiglu;
  c.moe.every = 1;
  c.moe.first_dense = 2;
  c.moe.group_size = 8;
  c.optim.batch_size = 2;
  const ShapeTable table(c, 30, MeshShape{}, RankCoords{}, true);
  std::vector<std::string> names;
  for (const ParamInfo& p : table.params()) names.push_back(p.name);
  auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  CHECK(has("embed.wte"));
  CHECK_FALSE(has("embed.wpe"));
  CHECK(has("blocks.0.ln1.gain"));
  CHECK_FALSE(has("blocks.0.ln1.bias"));
  CHECK_FALSE(has("ln_f.bias"));
  CHECK(has("blocks.0.mlp.w_in"));
  CHECK(has("blocks.1.mlp.w_in"));
  CHECK_FALSE(has("blocks.1.moe.router.wg"));
  CHECK(has("blocks.2.moe.router.wg"));
  CHECK(has("blocks.3.moe.router.wg"));
  CHECK(table.model().num_moe_layers() == 2);
  for (const ParamInfo& p : table.params())
    if (p.name == "blocks.2.moe.experts.w_in") CHECK(p.logical_shape == std::vector<int64_t>{8, 16, 2, 512});
  // The model registers exactly the table (Transformer checks it) and runs.
  Transformer<double> model(c, 30);
  CHECK(model.params().infos().size() == table.params().size());
}
