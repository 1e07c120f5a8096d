// Dense Transformer layers: every backward against central finite differences in double, every
// forward against a naive loop oracle, and float forward against double forward.
//
// Finite differences: L = sum(r * y) for a fixed random r; h = 1e-6;
// tolerance |analytic - numeric| <= 1e-6 * max(1, |numeric|)  (model conventions).
// Float vs double forward: |y_float - y_double| <= 1e-5 * max(1, |y_double|) per element.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "model/activation.hpp"
#include "model/attention.hpp"
#include "model/cross_attention.hpp"
#include "model/cross_entropy.hpp"
#include "model/cross_entropy_bodies.hpp"
#include "model/dropout.hpp"
#include "model/embedding.hpp"
#include "model/layernorm.hpp"
#include "model/mlp.hpp"
#include "tensor/launch.hpp"
#include "tensor/launch_rows.hpp"
#include "train/distill.hpp"

using namespace meshmoe;

namespace {

constexpr double kFdStep = 1e-6;
constexpr double kFdTol = 1e-6;     // relative to max(1, |numeric|)
constexpr double kFloatTol = 1e-5;  // relative to max(1, |double|)

std::vector<double> random_vec(size_t n, std::mt19937& gen, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

// Perturbs every weight so gains are not exactly 1 and biases not 0 (a stronger check).
template <typename T>
void perturb(ParamStore<T>& store, std::mt19937& gen, double amp = 0.3) {
  std::uniform_real_distribution<double> u(-amp, amp);
  for (size_t i = 0; i < store.size(); ++i) store.weights()[i] += T(u(gen));
}

struct FdTensor {
  std::string name;
  double* value;
  std::vector<double> analytic;  // copied after backward
};

// Central differences of loss() on (a subset of >= 60 elements of) every tensor.
void check_fd(const std::function<double()>& loss, std::vector<FdTensor>& tensors, std::mt19937& gen,
              size_t max_per_tensor = 60) {
  for (auto& t : tensors) {
    const size_t n = t.analytic.size();
    std::vector<size_t> idx(n);
    for (size_t i = 0; i < n; ++i) idx[i] = i;
    if (n > max_per_tensor) {
      std::shuffle(idx.begin(), idx.end(), gen);
      idx.resize(max_per_tensor);
    }
    double worst = 0, worst_a = 0, worst_n = 0;
    size_t worst_i = 0;
    for (size_t i : idx) {
      const double w0 = t.value[i];
      t.value[i] = w0 + kFdStep;
      const double lp = loss();
      t.value[i] = w0 - kFdStep;
      const double lm = loss();
      t.value[i] = w0;
      const double num = (lp - lm) / (2 * kFdStep);
      const double err = std::abs(t.analytic[i] - num) / std::max(1.0, std::abs(num));
      if (err >= worst) worst = err, worst_a = t.analytic[i], worst_n = num, worst_i = i;
    }
    INFO(t.name << "[" << worst_i << "]: analytic " << worst_a << " numeric " << worst_n);
    CHECK(worst <= kFdTol);
  }
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// FdTensor entries for every parameter of a store (analytic = current grads).
std::vector<FdTensor> param_tensors(ParamStore<double>& store) {
  std::vector<FdTensor> out;
  for (const auto& p : store.infos()) {
    FdTensor t{p.name, store.weights() + p.flat_offset, {}};
    t.analytic.assign(store.grads() + p.flat_offset, store.grads() + p.flat_offset + p.size);
    out.push_back(std::move(t));
  }
  return out;
}

void check_close_float(const std::vector<float>& f, const std::vector<double>& d, const char* what) {
  REQUIRE(f.size() == d.size());
  double worst = 0;
  for (size_t i = 0; i < f.size(); ++i)
    worst = std::max(worst, std::abs(double(f[i]) - d[i]) / std::max(1.0, std::abs(d[i])));
  INFO(what << ": worst relative float-double difference " << worst);
  CHECK(worst <= kFloatTol);
}

// Builds float and double copies of a layer with identical parameters (the double store gets the
// float values, so only the arithmetic differs).
template <typename Make>
auto twin(Make make, std::mt19937& gen) {
  auto lf = make(float{});
  auto ld = make(double{});
  auto sf = std::make_unique<ParamStore<float>>();
  auto sd = std::make_unique<ParamStore<double>>();
  lf->declare(*sf, "l");
  ld->declare(*sd, "l");
  sf->allocate();
  sd->allocate();
  sf->init(7, 1.0);
  perturb(*sf, gen);
  for (size_t i = 0; i < sf->size(); ++i) sd->weights()[i] = double(sf->weights()[i]);
  return std::make_tuple(std::move(lf), std::move(ld), std::move(sf), std::move(sd));
}

std::vector<float> to_float(const std::vector<double>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = float(v[i]);
  return f;
}
std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

StepContext train_ctx(uint64_t token_offset = 0) {
  StepContext c;
  c.seed = 99;
  c.step = 3;
  c.training = true;
  c.token_offset = token_offset;
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST_CASE("gelu matches the erf form and its derivative", "[layers]") {
  // Reference values of 0.5 x (1 + erf(x / sqrt 2)) (torch.nn.functional.gelu) to 1e-15.
  CHECK(std::abs(gelu(1.0) - 0.8413447460685429) <= 1e-15);
  CHECK(std::abs(gelu(-0.5) - -0.15426876936299347) <= 1e-15);
  for (double x : {-3.0, -1.2, -0.1, 0.0, 0.4, 2.5}) {
    const double num = (gelu(x + kFdStep) - gelu(x - kFdStep)) / (2 * kFdStep);
    CHECK(std::abs(gelu_grad(x) - num) <= kFdTol * std::max(1.0, std::abs(num)));
  }
}

TEST_CASE("activation backward matches finite differences", "[layers]") {
  std::mt19937 gen(1);
  const int N = 5, H = 7;
  for (Activation a : {Activation::Relu, Activation::Gelu, Activation::Geglu, Activation::Swiglu}) {
    INFO(option_name(a));
    const int W = activation_in_width(a, H);
    auto pre = random_vec(size_t(N) * W, gen, -2, 2);
    auto r = random_vec(size_t(N) * H, gen);
    std::vector<double> h(size_t(N) * H), dpre(pre.size());
    activation_backward(a, pre.data(), r.data(), dpre.data(), N, H);
    std::vector<FdTensor> t{{"pre", pre.data(), dpre}};
    auto loss = [&] {
      activation_forward(a, pre.data(), h.data(), N, H);
      return dot(r, h);
    };
    check_fd(loss, t, gen, 1000);
  }
}

namespace {
// The keep decision for one element, as model/dropout.hpp states it: Philox block g * ceil(C / 4) +
// c / 4 of the dropout stream, lane c % 4, at least the rate.
bool dropout_keeps(const Rng& rng, double rate, uint64_t global_token, int c, int C) {
  const uint64_t per_token = (uint64_t(C) + 3) / 4;
  return rng.uniform_double(global_token * per_token + uint64_t(c / 4), c % 4) >= rate;
}
}  // namespace

TEST_CASE("dropout: deterministic, keyed by global token, rate respected", "[layers]") {
  const int N = 64, C = 30;
  const double rate = 0.25;
  Dropout<double> d(rate, 5);
  std::vector<double> x(size_t(N) * C, 1.0), y2(x.size(), 1.0);
  StepContext ctx = train_ctx(100);
  d.forward(ctx, x.data(), N, C);
  // The same elements are dropped when the tokens are split over two "ranks".
  Dropout<double> d2(rate, 5);
  StepContext c1 = train_ctx(100), c2 = train_ctx(100 + N / 2);
  d2.forward(c1, y2.data(), N / 2, C);
  d2.forward(c2, y2.data() + size_t(N / 2) * C, N / 2, C);
  CHECK(x == y2);
  size_t dropped = 0;
  const Rng rng{ctx.seed, ctx.step, 5, RngPurpose::Dropout};
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      const double v = x[size_t(n) * C + c];
      const bool keep = dropout_keeps(rng, rate, 100 + n, c, C);
      CHECK(v == (keep ? 1.0 / (1.0 - rate) : 0.0));
      dropped += !keep;
    }
  // 1920 Bernoulli(0.25) draws: mean 480, sd 19; +-5 sd
  CHECK(dropped > 480 - 95);
  CHECK(dropped < 480 + 95);
  // backward applies the same mask; eval is the identity
  std::vector<double> g(x.size(), 1.0);
  d.backward(ctx, g.data(), N, C);
  CHECK(g == x);
  StepContext eval = ctx;
  eval.training = false;
  std::vector<double> e(x.size(), 1.0);
  d.forward(eval, e.data(), N, C);
  CHECK(e == std::vector<double>(x.size(), 1.0));
}

// ---------------------------------------------------------------------------------------------
TEST_CASE("layernorm: forward oracle, finite differences, float vs double", "[layers]") {
  std::mt19937 gen(2);
  const int N = 6, M = 10;
  const double eps = 1e-5;
  auto [lf, ld, sf, sd] = twin([&](auto t) { return std::make_unique<LayerNorm<decltype(t)>>(M, eps); }, gen);
  auto x = random_vec(size_t(N) * M, gen, -2, 2);
  auto r = random_vec(size_t(N) * M, gen);
  std::vector<double> y(x.size()), dx(x.size(), 0.0);
  StepContext ctx = train_ctx();
  ld->forward(ctx, x.data(), y.data(), N);
  // oracle
  for (int n = 0; n < N; ++n) {
    double mean = 0, var = 0;
    for (int m = 0; m < M; ++m) mean += x[n * M + m] / M;
    for (int m = 0; m < M; ++m) var += (x[n * M + m] - mean) * (x[n * M + m] - mean) / M;
    for (int m = 0; m < M; ++m) {
      const double ref = (x[n * M + m] - mean) / std::sqrt(var + eps) * ld->gain.w[m] + ld->bias.w[m];
      CHECK(std::abs(y[n * M + m] - ref) <= 1e-12);  // same formula, double rounding only
    }
  }
  ld->backward(ctx, r.data(), dx.data(), N);
  auto tensors = param_tensors(*sd);
  tensors.push_back({"x", x.data(), dx});
  check_fd([&] { ld->forward(ctx, x.data(), y.data(), N); return dot(r, y); }, tensors, gen);

  auto xf = to_float(x);
  std::vector<float> yf(xf.size());
  lf->forward(ctx, xf.data(), yf.data(), N);
  ld->forward(ctx, to_double(xf).data(), y.data(), N);
  check_close_float(yf, y, "layernorm");
}

// ---------------------------------------------------------------------------------------------
TEST_CASE("embedding and output head: finite differences, tied and untied", "[layers]") {
  std::mt19937 gen(3);
  const int V = 11, Tmax = 6, M = 8, T = 5, B = 3, N = B * T;
  std::vector<int32_t> tokens(N);
  std::uniform_int_distribution<int> tok(0, V - 1);
  for (auto& t : tokens) t = tok(gen);
  tokens[3] = tokens[7] = 2;  // a repeated token: its gradient rows must add up
  // Packed examples: positions within each example, restarting (ctx.position).
  const std::vector<int32_t> packed_position{0, 1, 0, 1, 2, /**/ 0, 1, 2, 3, 0, /**/ 0, 0, 1, 2, 3};

  for (auto [tied, packed] : {std::pair{true, false}, {false, false}, {true, true}}) {
    INFO((tied ? "tied" : "untied") << (packed ? ", packed" : ""));
    StepContext ctx = train_ctx();
    if (packed) ctx.position = packed_position.data();
    auto pos = [&](int n) { return packed ? packed_position[size_t(n)] : n % T; };
    Embedding<double> emb(V, Tmax, M);
    OutputHead<double> head(V, M);
    ParamStore<double> store;
    emb.declare(store, "emb");
    head.declare(store, "head", tied ? &emb.wte : nullptr);
    CHECK(head.tied() == tied);
    CHECK(store.infos().size() == (tied ? 2u : 3u));
    store.allocate();
    store.init(11, 1.0);
    perturb(store, gen);
    auto r = random_vec(size_t(N) * V, gen);
    std::vector<double> x(size_t(N) * M), logits(size_t(N) * V), dx(x.size(), 0.0);
    auto loss = [&] {
      emb.forward(ctx, tokens.data(), x.data(), N, T);
      head.forward(ctx, x.data(), logits.data(), N);
      return dot(r, logits);
    };
    loss();
    // oracle: logits[n, v] = sum_m (wte[tok] + wpe[position])[m] * W[v, m]
    const double* W = tied ? emb.wte.w : head.wout.w;
    for (int n = 0; n < N; ++n)
      for (int v = 0; v < V; ++v) {
        double s = 0;
        for (int m = 0; m < M; ++m) s += (emb.wte.w[tokens[n] * M + m] + emb.wpe.w[pos(n) * M + m]) * W[v * M + m];
        CHECK(std::abs(logits[n * V + v] - s) <= 1e-12);
      }
    store.zero_grad();
    head.backward(ctx, r.data(), dx.data(), N);
    // input gradient of the head alone (x held fixed)
    std::vector<FdTensor> xt{{"x", x.data(), dx}};
    const auto x0 = x;
    check_fd([&] { head.forward(ctx, x.data(), logits.data(), N); return dot(r, logits); }, xt, gen, 1000);
    x = x0;
    emb.backward(ctx, dx.data(), N);
    auto tensors = param_tensors(store);
    check_fd(loss, tensors, gen, 1000);
  }
  Embedding<double> emb(V, Tmax, M);
  ParamStore<double> store;
  emb.declare(store, "emb");
  store.allocate();
  std::vector<double> x(size_t(N) * M);
  std::vector<int32_t> bad = tokens;
  bad[4] = V;
  StepContext ctx = train_ctx();
  CHECK_THROWS_AS(emb.forward(ctx, bad.data(), x.data(), N, T), Error);
  CHECK_THROWS_AS(emb.forward(ctx, tokens.data(), x.data(), N, Tmax + 1), Error);
  std::vector<int32_t> bad_position = packed_position;
  bad_position[3] = T;  // beyond the sequence
  ctx.position = bad_position.data();
  CHECK_THROWS_AS(emb.forward(ctx, tokens.data(), x.data(), N, T), Error);
}

TEST_CASE("embedding and output head: float vs double", "[layers]") {
  std::mt19937 gen(4);
  const int V = 13, Tmax = 8, M = 16, T = 8, N = 16;
  std::vector<int32_t> tokens(N);
  for (int n = 0; n < N; ++n) tokens[n] = (n * 5) % V;
  auto [ef, ed, sf, sd] = twin([&](auto t) { return std::make_unique<Embedding<decltype(t)>>(V, Tmax, M); }, gen);
  StepContext ctx = train_ctx();
  std::vector<float> xf(size_t(N) * M), lf(size_t(N) * V);
  std::vector<double> xd(xf.size()), ld(lf.size());
  ef->forward(ctx, tokens.data(), xf.data(), N, T);
  ed->forward(ctx, tokens.data(), xd.data(), N, T);
  check_close_float(xf, xd, "embedding");
  OutputHead<float> hf(V, M);
  OutputHead<double> hd(V, M);
  hf.declare(*sf, "h", &ef->wte);  // tied: no new parameter
  hd.declare(*sd, "h", &ed->wte);
  hf.forward(ctx, xf.data(), lf.data(), N);
  hd.forward(ctx, to_double(xf).data(), ld.data(), N);
  check_close_float(lf, ld, "output head");
}

// ---------------------------------------------------------------------------------------------
namespace {
// Naive attention: loops only, no gemm (independent of the layers' indexing). Queries from xq
// (B rows of Tq tokens), keys and values from xkv (B rows of Tk tokens). Query i sees key j when
// (causal: j <= i) and, with segment ids, qseg[b*Tq + i] == kseg[b*Tk + j]; a query that sees no
// key gets a zero attention output.
std::vector<double> naive_attention_qkv(const std::vector<double>& xq, int Tq, const std::vector<double>& xkv, int Tk,
                                        const ParamView<double>& wq, const ParamView<double>& wk,
                                        const ParamView<double>& wv, const ParamView<double>& wo, int B, int M, int H,
                                        bool causal, const int32_t* qseg, const int32_t* kseg) {
  const int D = M / H;
  auto proj = [&](const std::vector<double>& x, const double* W, int n, int c) {
    double s = 0;
    for (int m = 0; m < M; ++m) s += x[n * M + m] * W[m * M + c];
    return s;
  };
  std::vector<double> att(size_t(B) * Tq * M, 0.0), y(size_t(B) * Tq * M, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < Tq; ++i) {
        std::vector<double> s(Tk, 0.0);
        double mx = -1e300;
        auto seen = [&](int j) { return (!causal || j <= i) && (!qseg || kseg[b * Tk + j] == qseg[b * Tq + i]); };
        for (int j = 0; j < Tk; ++j) {
          if (!seen(j)) continue;
          double q_k = 0;
          for (int d = 0; d < D; ++d) q_k += proj(xq, wq.w, b * Tq + i, h * D + d) * proj(xkv, wk.w, b * Tk + j, h * D + d);
          s[j] = q_k / std::sqrt(double(D));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int j = 0; j < Tk; ++j) z += (s[j] = seen(j) ? std::exp(s[j] - mx) : 0.0);
        if (z == 0) continue;
        for (int d = 0; d < D; ++d)
          for (int j = 0; j < Tk; ++j)
            att[(b * Tq + i) * M + h * D + d] += s[j] / z * proj(xkv, wv.w, b * Tk + j, h * D + d);
      }
  for (int n = 0; n < B * Tq; ++n)
    for (int c = 0; c < M; ++c)
      for (int k = 0; k < M; ++k) y[n * M + c] += att[n * M + k] * wo.w[k * M + c];
  return y;
}

// Naive self-attention of x [N, M] (causal as the layer is); segment [N] or null.
std::vector<double> naive_attention(const std::vector<double>& x, const CausalSelfAttention<double>& a, int N,
                                    int T, int M, int H, const int32_t* segment = nullptr) {
  return naive_attention_qkv(x, T, x, T, a.wq, a.wk, a.wv, a.wo, N / T, M, H, a.causal(), segment, segment);
}

// Declares a layer's parameters in `store`, initialised from `seed` and perturbed.
template <class Layer>
void declare_perturbed(Layer& layer, ParamStore<double>& store, const std::string& prefix, uint64_t seed,
                       std::mt19937& gen) {
  layer.declare(store, prefix);
  store.allocate();
  store.init(seed, 1.0);
  perturb(store, gen);
}

// y = attention(x) (no dropout) equals the naive loops' to 1e-12.
void check_against_naive(CausalSelfAttention<double>& att, const StepContext& ctx, const std::vector<double>& x,
                         std::vector<double>& y, int N, int T, int M, int H) {
  att.forward(ctx, x.data(), y.data(), N, T);
  const auto ref = naive_attention(x, att, N, T, M, H, ctx.segment);
  for (size_t i = 0; i < y.size(); ++i) CHECK(std::abs(y[i] - ref[i]) <= 1e-12);
}

// Backward of L = r . attention(x), then finite differences of every weight and of x.
void check_self_attention_fd(CausalSelfAttention<double>& att, ParamStore<double>& store, const StepContext& ctx,
                             std::vector<double>& x, const std::vector<double>& r, int N, int T, std::mt19937& gen) {
  std::vector<double> y(x.size()), dx(x.size(), 0.0);
  att.forward(ctx, x.data(), y.data(), N, T);
  att.backward(ctx, r.data(), dx.data(), N);
  auto tensors = param_tensors(store);
  tensors.push_back({"x", x.data(), dx});
  check_fd([&] { att.forward(ctx, x.data(), y.data(), N, T); return dot(r, y); }, tensors, gen);
}
}  // namespace

TEST_CASE("attention: forward oracle and finite differences with and without dropout, packed examples", "[layers]") {
  std::mt19937 gen(5);
  const int M = 12, H = 3, T = 5, B = 2, N = B * T;
  // Packed: row 0 holds three examples (token 2 alone in its own), row 1 one.
  const std::vector<int32_t> segment{0, 0, 1, 2, 2, /**/ 0, 0, 0, 0, 0};
  for (auto [rate, packed] : {std::pair{0.0, false}, {0.3, false}, {0.0, true}, {0.3, true}}) {
    INFO("dropout " << rate << (packed ? ", packed" : ""));
    CausalSelfAttention<double> att(M, H, rate, 17);
    ParamStore<double> store;
    declare_perturbed(att, store, "attn", 13, gen);
    auto x = random_vec(size_t(N) * M, gen);
    auto r = random_vec(size_t(N) * M, gen);
    std::vector<double> y(x.size());
    StepContext ctx = train_ctx(40);
    if (packed) ctx.segment = segment.data();
    if (rate == 0.0) {
      check_against_naive(att, ctx, x, y, N, T, M, H);
    }
    if (rate == 0.0 && packed) {
      // The oracle can tell: without the segments the outputs of token 2 differ.
      CHECK(std::abs(naive_attention(x, att, N, T, M, H)[2 * M] - y[2 * M]) > 1e-6);
      // Token 2, alone in its example, attends only to itself: moving every other token leaves it.
      std::vector<double> x2 = x, y2(x.size());
      for (size_t i = 0; i < x2.size(); ++i)
        if (i / M != 2) x2[i] += 0.5;
      att.forward(ctx, x2.data(), y2.data(), N, T);
      for (int m = 0; m < M; ++m) CHECK(y2[size_t(2) * M + m] == y[size_t(2) * M + m]);
    }
    att.forward(ctx, x.data(), y.data(), N, T);
    if (rate > 0) CHECK(std::count(y.begin(), y.end(), 0.0) > 0);
    check_self_attention_fd(att, store, ctx, x, r, N, T, gen);
  }
}

TEST_CASE("attention: head blocks sum to the full layer (tensor-parallel layout)", "[layers]") {
  std::mt19937 gen(6);
  const int M = 12, H = 3, T = 4, N = 8;
  auto x = random_vec(size_t(N) * M, gen);
  auto r = random_vec(size_t(N) * M, gen);
  StepContext ctx = train_ctx();
  auto run = [&](int h0, int lh, std::vector<double>& y, std::vector<double>& dx, ParamStore<double>& store,
                 std::unique_ptr<CausalSelfAttention<double>>& a) {
    a = std::make_unique<CausalSelfAttention<double>>(M, H, 0.0, 1, h0, lh);
    a->declare(store, "attn");
    store.allocate();
    store.init(21, 1.0);  // init by logical index: a block gets the full layer's values
    y.assign(x.size(), 0.0);
    dx.assign(x.size(), 0.0);
    a->forward(ctx, x.data(), y.data(), N, T);
    a->backward(ctx, r.data(), dx.data(), N);
  };
  std::vector<double> yf, dxf, y0, dx0, y1, dx1;
  ParamStore<double> sf, s0, s1;
  std::unique_ptr<CausalSelfAttention<double>> af, a0, a1;
  run(0, -1, yf, dxf, sf, af);
  run(0, 1, y0, dx0, s0, a0);
  run(1, 2, y1, dx1, s1, a1);
  CHECK(a1->sharded());
  CHECK(s1.infos()[0].local_shape == std::vector<int64_t>{M, 8});
  CHECK(s1.infos()[3].offset == std::vector<int64_t>{4, 0});
  for (size_t i = 0; i < yf.size(); ++i) {
    CHECK(std::abs(y0[i] + y1[i] - yf[i]) <= 1e-12);
    CHECK(std::abs(dx0[i] + dx1[i] - dxf[i]) <= 1e-12);
  }
  // the block's weight gradient is the corresponding block of the full gradient: wq columns [4, 12)
  for (int m = 0; m < M; ++m)
    for (int c = 0; c < 8; ++c) CHECK(std::abs(a1->wq.g[m * 8 + c] - af->wq.g[m * M + 4 + c]) <= 1e-12);
}

TEST_CASE("attention: float vs double", "[layers]") {
  std::mt19937 gen(7);
  const int M = 32, H = 4, T = 16, N = 32;
  auto [af, ad, sf, sd] = twin(
      [&](auto t) { return std::make_unique<CausalSelfAttention<decltype(t)>>(M, H, 0.1, 3); }, gen);
  auto xf = to_float(random_vec(size_t(N) * M, gen));
  std::vector<float> yf(xf.size());
  std::vector<double> yd(xf.size());
  StepContext ctx = train_ctx();
  af->forward(ctx, xf.data(), yf.data(), N, T);
  ad->forward(ctx, to_double(xf).data(), yd.data(), N, T);
  check_close_float(yf, yd, "attention");
  CHECK_THROWS_AS(CausalSelfAttention<float>(10, 3, 0.0, 0), InputError);
}

namespace {
// Grouped-query attention written out as the Hugging Face Llama/Mixtral code states it: k, v
// projected to kv heads, query head h reading key/value head h / (H / KV) (repeat_kv); causal,
// within the segments of `segment` (or null), no rope. x [N, M], wq, wo [M, M], wk, wv [M, KV D].
std::vector<double> naive_grouped_attention(const std::vector<double>& x, const double* wq, const double* wk,
                                            const double* wv, const double* wo, int N, int T, int M, int H, int KV,
                                            const int32_t* segment) {
  const int D = M / H, W = KV * D, group = H / KV;
  auto proj = [&](const double* w, int cols, int n, int c) {
    double a = 0;
    for (int m = 0; m < M; ++m) a += x[size_t(n) * M + m] * w[size_t(m) * cols + c];
    return a;
  };
  std::vector<double> att(size_t(N) * M, 0.0), y(size_t(N) * M, 0.0);
  for (int b = 0; b < N / T; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        const int qi = b * T + i, kvh = h / group;
        std::vector<double> s(size_t(i) + 1, 0.0);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          if (segment && segment[b * T + j] != segment[qi]) continue;
          for (int d = 0; d < D; ++d) s[size_t(j)] += proj(wq, M, qi, h * D + d) * proj(wk, W, b * T + j, kvh * D + d);
          s[size_t(j)] /= std::sqrt(double(D));
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = 0;
        for (int j = 0; j <= i; ++j) {
          const bool sees = !segment || segment[b * T + j] == segment[qi];
          s[size_t(j)] = sees ? std::exp(s[size_t(j)] - mx) : 0.0;
          z += s[size_t(j)];
        }
        for (int d = 0; d < D; ++d)
          for (int j = 0; j <= i; ++j) att[size_t(qi) * M + h * D + d] += s[size_t(j)] / z * proj(wv, W, b * T + j, kvh * D + d);
      }
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < M; ++c)
      for (int k = 0; k < M; ++k) y[size_t(n) * M + c] += att[size_t(n) * M + k] * wo[size_t(k) * M + c];
  return y;
}
}  // namespace

TEST_CASE("grouped-query attention: forward oracle and finite differences, kv_heads 1 and 2 of 4", "[layers][gqa]") {
  std::mt19937 gen(31);
  const int M = 16, H = 4, T = 5, B = 2, N = B * T;
  const std::vector<int32_t> segment{0, 0, 1, 1, 1, /**/ 0, 0, 0, 0, 0};
  for (const int KV : {1, 2})
    for (const double rope : {0.0, 10000.0}) {
      INFO("kv_heads " << KV << (rope > 0 ? ", rope" : ""));
      CausalSelfAttention<double> att(attention_shape(M, H, whole(H), KV), 0.0, 17, true, rope);
      REQUIRE(att.shape().grouped());
      ParamStore<double> store;
      declare_perturbed(att, store, "attn", 13, gen);
      CHECK(store.infos()[1].logical_shape == std::vector<int64_t>{M, KV * M / H});
      auto x = random_vec(size_t(N) * M, gen);
      auto r = random_vec(size_t(N) * M, gen);
      std::vector<double> y(x.size());
      StepContext ctx = train_ctx(40);
      ctx.segment = segment.data();
      if (rope == 0) {
        att.forward(ctx, x.data(), y.data(), N, T);
        const auto ref = naive_grouped_attention(x, att.wq.w, att.wk.w, att.wv.w, att.wo.w, N, T, M, H, KV, segment.data());
        for (size_t i = 0; i < y.size(); ++i) CHECK(std::abs(y[i] - ref[i]) <= 1e-12);
      }
      check_self_attention_fd(att, store, ctx, x, r, N, T, gen);
    }
}

TEST_CASE("grouped-query attention: key/value heads split or replicated over tensor sum to the full layer", "[layers][gqa]") {
  std::mt19937 gen(32);
  const int M = 16, H = 4, T = 4, N = 8, D = M / H;
  auto x = random_vec(size_t(N) * M, gen);
  auto r = random_vec(size_t(N) * M, gen);
  StepContext ctx = train_ctx();
  struct Rank {
    std::unique_ptr<CausalSelfAttention<double>> a;
    ParamStore<double> store;
    std::vector<double> y, dx;
  };
  auto run = [&](int KV, Split heads, Rank& k) {
    k.a = std::make_unique<CausalSelfAttention<double>>(attention_shape(M, H, heads, KV), 0.0, 1, true, 10000.0);
    k.a->declare(k.store, "attn");
    k.store.allocate();
    k.store.init(21, 1.0);  // init by logical index: a block gets the full layer's values
    k.y.assign(x.size(), 0.0);
    k.dx.assign(x.size(), 0.0);
    k.a->forward(ctx, x.data(), k.y.data(), N, T);
    k.a->backward(ctx, r.data(), k.dx.data(), N);
  };
  for (const int KV : {2, 1}) {  // 2 of 4 over 2 ranks: split; 1: replicated
    INFO("kv_heads " << KV);
    Rank full, t0, t1;
    run(KV, whole(H), full);
    run(KV, split_evenly(H, 0, 2), t0);
    run(KV, split_evenly(H, 1, 2), t1);
    const AttentionShape& s1 = t1.a->shape();
    CHECK(s1.kv_sharded() == (KV == 2));
    CHECK(s1.kv_replicated() == (KV == 1));
    CHECK(s1.kv0 == (KV == 2 ? 1 : 0));
    CHECK(t1.store.infos()[1].local_shape == std::vector<int64_t>{M, D});
    CHECK(t1.store.infos()[1].sharded_over == (KV == 2 ? kShardTensor : kShardNone));
    for (size_t i = 0; i < full.y.size(); ++i) {
      CHECK(std::abs(t0.y[i] + t1.y[i] - full.y[i]) <= 1e-12);
      CHECK(std::abs(t0.dx[i] + t1.dx[i] - full.dx[i]) <= 1e-12);
    }
    // wk's gradient: rank 1's block is the full gradient's columns [kv0 D, (kv0 + 1) D) when split;
    // replicated (no tensor hook here), the two ranks' partial gradients sum to the full one.
    for (int m = 0; m < M; ++m)
      for (int c = 0; c < D; ++c) {
        const double full_g = full.a->wk.g[m * KV * D + s1.kv0 * D + c];
        if (KV == 2) CHECK(std::abs(t1.a->wk.g[m * D + c] - full_g) <= 1e-12);
        else CHECK(std::abs(t0.a->wk.g[m * D + c] + t1.a->wk.g[m * D + c] - full_g) <= 1e-12);
      }
  }
}

TEST_CASE("fused attention: forward oracle and finite differences, packed examples, rope, kv_heads 2 of 4", "[layers][fused]") {
  std::mt19937 gen(33);
  const int M = 16, H = 4, T = 19, B = 2, N = B * T;  // T over one 16-row tile
  std::vector<int32_t> segment(N, 0);
  for (int i = 7; i < T; ++i) segment[size_t(i)] = i < 17 ? 1 : 2;  // row 0: three examples, row 1: one
  for (const bool causal : {true, false})
    for (const auto& [KV, rope, rate] : {std::tuple{4, 0.0, 0.0}, {2, 10000.0, 0.0}, {4, 0.0, 0.3}}) {
      INFO((causal ? "causal" : "bidirectional") << ", kv_heads " << KV << (rope > 0 ? ", rope" : "") << ", dropout " << rate);
      CausalSelfAttention<double> att(attention_shape(M, H, whole(H), KV), rate, 17, causal, rope);
      att.set_kernel(AttentionKernel::Fused);
      ParamStore<double> store;
      declare_perturbed(att, store, "attn", 13, gen);
      auto x = random_vec(size_t(N) * M, gen);
      auto r = random_vec(size_t(N) * M, gen);
      StepContext ctx = train_ctx(40);
      ctx.segment = segment.data();
      std::vector<double> y(x.size());
      if (rope == 0 && KV == H && rate == 0) check_against_naive(att, ctx, x, y, N, T, M, H);
      check_self_attention_fd(att, store, ctx, x, r, N, T, gen);
    }
}

TEST_CASE("bidirectional attention: forward oracle and finite differences, packed examples, tensor blocks", "[layers]") {
  std::mt19937 gen(15);
  const int M = 12, H = 3, T = 5, B = 2, N = B * T;
  const std::vector<int32_t> segment{0, 0, 1, 1, 1, /**/ 0, 0, 0, 0, 0};
  for (auto [rate, packed] : {std::pair{0.0, false}, {0.0, true}, {0.3, true}}) {
    INFO("dropout " << rate << (packed ? ", packed" : ""));
    CausalSelfAttention<double> att(M, H, rate, 17, 0, -1, /*causal=*/false);
    CHECK_FALSE(att.causal());
    ParamStore<double> store;
    declare_perturbed(att, store, "attn", 13, gen);
    auto x = random_vec(size_t(N) * M, gen);
    auto r = random_vec(size_t(N) * M, gen);
    std::vector<double> y(x.size());
    StepContext ctx = train_ctx(40);
    if (packed) ctx.segment = segment.data();
    if (rate == 0.0) {
      check_against_naive(att, ctx, x, y, N, T, M, H);
      // Token 2 sees the later token 4 of its example, but not token 1 of the other example.
      std::vector<double> x2 = x, y2(x.size());
      for (int m = 0; m < M; ++m) x2[size_t(4) * M + m] += 0.5;
      att.forward(ctx, x2.data(), y2.data(), N, T);
      CHECK(std::abs(y2[size_t(2) * M] - y[size_t(2) * M]) > 1e-6);
      x2 = x;
      for (int m = 0; m < M; ++m) x2[size_t(1) * M + m] += 0.5;
      att.forward(ctx, x2.data(), y2.data(), N, T);
      for (int m = 0; m < M; ++m) CHECK((y2[size_t(2) * M + m] == y[size_t(2) * M + m]) == packed);
    }
    check_self_attention_fd(att, store, ctx, x, r, N, T, gen);
  }
  // Head blocks sum to the full layer.
  auto x = random_vec(size_t(N) * M, gen);
  auto r = random_vec(size_t(N) * M, gen);
  StepContext ctx = train_ctx();
  ctx.segment = segment.data();
  std::vector<double> ysum(x.size(), 0.0), dxsum(x.size(), 0.0), yf(x.size()), dxf(x.size(), 0.0);
  for (auto [h0, lh] : {std::pair{0, 1}, {1, 2}, {0, -1}}) {
    CausalSelfAttention<double> a(M, H, 0.0, 1, h0, lh, false);
    ParamStore<double> store;
    a.declare(store, "attn");
    store.allocate();
    store.init(21, 1.0);
    std::vector<double> y(x.size()), dx(x.size(), 0.0);
    a.forward(ctx, x.data(), y.data(), N, T);
    a.backward(ctx, r.data(), dx.data(), N);
    for (size_t i = 0; i < y.size(); ++i) (lh < 0 ? yf[i] : ysum[i]) += y[i], (lh < 0 ? dxf[i] : dxsum[i]) += dx[i];
  }
  for (size_t i = 0; i < yf.size(); ++i) {
    CHECK(std::abs(ysum[i] - yf[i]) <= 1e-12);
    CHECK(std::abs(dxsum[i] - dxf[i]) <= 1e-12);
  }
}

namespace {
std::vector<double> naive_cross_attention(const std::vector<double>& x, int Tq, const std::vector<double>& enc, int Tk,
                                          const CrossAttention<double>& a, int B, int M, int H, const int32_t* qseg,
                                          const int32_t* kseg) {
  return naive_attention_qkv(x, Tq, enc, Tk, a.wq, a.wk, a.wv, a.wo, B, M, H, false, qseg, kseg);
}
}  // namespace

TEST_CASE("cross attention: forward oracle and finite differences of weights, decoder and encoder inputs", "[layers]") {
  std::mt19937 gen(25);
  const int M = 12, H = 3, Tq = 5, Tk = 6, B = 2, N = B * Tq, Nk = B * Tk;
  // Row 0: two examples on each side. Row 1: decoder example 1 has no encoder tokens (its
  // queries see nothing: zero output), the last encoder token is in no decoder example.
  const std::vector<int32_t> qseg{0, 0, 0, 1, 1, /**/ 0, 0, 0, 1, 1};
  const std::vector<int32_t> kseg{0, 0, 1, 1, 1, 1, /**/ 0, 0, 0, 0, 0, 2};
  for (auto [rate, packed] : {std::pair{0.0, false}, {0.0, true}, {0.3, true}}) {
    INFO("dropout " << rate << (packed ? ", packed" : ""));
    CrossAttention<double> att(attention_shape(M, H, whole(H)), rate, 19);
    ParamStore<double> store;
    declare_perturbed(att, store, "cross", 14, gen);
    auto x = random_vec(size_t(N) * M, gen);
    auto enc = random_vec(size_t(Nk) * M, gen);
    auto r = random_vec(size_t(N) * M, gen);
    std::vector<double> y(x.size()), dx(x.size(), 0.0), denc(enc.size(), 0.0);
    StepContext ctx = train_ctx(40);
    const int32_t* ks = packed ? kseg.data() : nullptr;
    if (packed) ctx.segment = qseg.data();
    if (rate == 0.0) {
      att.forward(ctx, x.data(), Tq, enc.data(), Tk, ks, y.data(), N);
      const auto ref = naive_cross_attention(x, Tq, enc, Tk, att, B, M, H, ctx.segment, ks);
      for (size_t i = 0; i < y.size(); ++i) CHECK(std::abs(y[i] - ref[i]) <= 1e-12);
      if (packed) {
        for (int m = 0; m < M; ++m) CHECK(y[size_t(Tq + 3) * M + m] == 0.0);
        // Decoder token 0 sees encoder tokens 0, 1 only: moving encoder token 2 leaves it, moving 1 does not.
        std::vector<double> e2 = enc, y2(y.size());
        for (int m = 0; m < M; ++m) e2[size_t(2) * M + m] += 0.5;
        att.forward(ctx, x.data(), Tq, e2.data(), Tk, ks, y2.data(), N);
        for (int m = 0; m < M; ++m) CHECK(y2[m] == y[m]);
        e2 = enc;
        for (int m = 0; m < M; ++m) e2[size_t(1) * M + m] += 0.5;
        att.forward(ctx, x.data(), Tq, e2.data(), Tk, ks, y2.data(), N);
        CHECK(std::abs(y2[0] - y[0]) > 1e-6);
      }
    }
    att.forward(ctx, x.data(), Tq, enc.data(), Tk, ks, y.data(), N);
    if (rate > 0) CHECK(std::count(y.begin(), y.end(), 0.0) > 0);
    att.backward(ctx, r.data(), dx.data(), denc.data(), N);
    auto tensors = param_tensors(store);
    tensors.push_back({"x", x.data(), dx});
    tensors.push_back({"enc", enc.data(), denc});
    check_fd([&] { att.forward(ctx, x.data(), Tq, enc.data(), Tk, ks, y.data(), N); return dot(r, y); }, tensors, gen);
  }
}

TEST_CASE("cross attention: head blocks sum to the full layer; float vs double", "[layers]") {
  std::mt19937 gen(26);
  const int M = 12, H = 3, Tq = 4, Tk = 3, B = 2, N = B * Tq, Nk = B * Tk;
  const std::vector<int32_t> qseg{0, 0, 1, 1, /**/ 0, 0, 0, 0};
  const std::vector<int32_t> kseg{0, 1, 1, /**/ 0, 0, 0};
  auto x = random_vec(size_t(N) * M, gen);
  auto enc = random_vec(size_t(Nk) * M, gen);
  auto r = random_vec(size_t(N) * M, gen);
  StepContext ctx = train_ctx();
  ctx.segment = qseg.data();
  std::vector<double> ysum(x.size(), 0.0), dxsum(x.size(), 0.0), dencsum(enc.size(), 0.0);
  std::vector<double> yf(x.size()), dxf(x.size(), 0.0), dencf(enc.size(), 0.0);
  for (auto [h0, lh] : {std::pair{0, 1}, {1, 2}, {0, 3}}) {
    CrossAttention<double> a(attention_shape(M, H, {h0, lh}), 0.0, 1);
    CHECK(a.sharded() == (lh != H));
    ParamStore<double> store;
    a.declare(store, "cross");
    store.allocate();
    store.init(22, 1.0);
    std::vector<double> y(x.size()), dx(x.size(), 0.0), denc(enc.size(), 0.0);
    a.forward(ctx, x.data(), Tq, enc.data(), Tk, kseg.data(), y.data(), N);
    a.backward(ctx, r.data(), dx.data(), denc.data(), N);
    const bool full = lh == H;
    for (size_t i = 0; i < y.size(); ++i) (full ? yf[i] : ysum[i]) += y[i], (full ? dxf[i] : dxsum[i]) += dx[i];
    for (size_t i = 0; i < enc.size(); ++i) (full ? dencf[i] : dencsum[i]) += denc[i];
  }
  for (size_t i = 0; i < yf.size(); ++i) {
    CHECK(std::abs(ysum[i] - yf[i]) <= 1e-12);
    CHECK(std::abs(dxsum[i] - dxf[i]) <= 1e-12);
  }
  for (size_t i = 0; i < dencf.size(); ++i) CHECK(std::abs(dencsum[i] - dencf[i]) <= 1e-12);

  auto [af, ad, sf, sd] = twin(
      [&](auto t) { return std::make_unique<CrossAttention<decltype(t)>>(attention_shape(M, H, whole(H)), 0.1, 3); },
      gen);
  auto xf = to_float(x), ef = to_float(enc);
  std::vector<float> yfl(xf.size());
  std::vector<double> yd(xf.size());
  af->forward(ctx, xf.data(), Tq, ef.data(), Tk, kseg.data(), yfl.data(), N);
  ad->forward(ctx, to_double(xf).data(), Tq, to_double(ef).data(), Tk, kseg.data(), yd.data(), N);
  check_close_float(yfl, yd, "cross attention");
}

// ---------------------------------------------------------------------------------------------
TEST_CASE("mlp: forward oracle and finite differences for relu, gelu, geglu, swiglu with dropout", "[layers]") {
  std::mt19937 gen(8);
  const int M = 8, Hd = 10, N = 7;
  for (Activation act : {Activation::Relu, Activation::Gelu, Activation::Geglu, Activation::Swiglu})
    for (double rate : {0.0, 0.25}) {
      INFO(option_name(act) << " dropout " << rate);
      MLP<double> mlp(M, Hd, act, rate, 9);
      ParamStore<double> store;
      mlp.declare(store, "mlp");
      store.allocate();
      store.init(5, 1.0);
      perturb(store, gen);
      CHECK(store.infos()[0].logical_shape ==
            (activation_gated(act) ? std::vector<int64_t>{M, 2, Hd} : std::vector<int64_t>{M, Hd}));
      auto x = random_vec(size_t(N) * M, gen);
      auto r = random_vec(size_t(N) * M, gen);
      std::vector<double> y(x.size()), dx(x.size(), 0.0);
      StepContext ctx = train_ctx(1000);
      if (rate == 0.0) {
        mlp.forward(ctx, x.data(), y.data(), N);
        const int W = activation_in_width(act, Hd);
        for (int n = 0; n < N; ++n) {
          std::vector<double> pre(W, 0.0), h(Hd);
          for (int j = 0; j < W; ++j)
            for (int m = 0; m < M; ++m) pre[j] += x[n * M + m] * mlp.w_in.w[m * W + j];
          for (int j = 0; j < Hd; ++j) {
            const double g = 0.5 * pre[j] * (1 + std::erf(pre[j] / std::sqrt(2.0)));
            const double silu = pre[j] / (1 + std::exp(-pre[j]));  // x sigmoid(x)
            h[j] = act == Activation::Relu   ? std::max(0.0, pre[j])
                   : act == Activation::Gelu ? g
                   : act == Activation::Geglu ? g * pre[Hd + j]
                                              : silu * pre[Hd + j];
          }
          for (int c = 0; c < M; ++c) {
            double s = 0;
            for (int j = 0; j < Hd; ++j) s += h[j] * mlp.w_out.w[j * M + c];
            CHECK(std::abs(y[n * M + c] - s) <= 1e-12);
          }
        }
      }
      mlp.forward(ctx, x.data(), y.data(), N);
      mlp.backward(ctx, r.data(), dx.data(), N);
      auto tensors = param_tensors(store);
      tensors.push_back({"x", x.data(), dx});
      check_fd([&] { mlp.forward(ctx, x.data(), y.data(), N); return dot(r, y); }, tensors, gen);
    }
}

TEST_CASE("mlp: hidden blocks sum to the full layer (tensor-parallel layout)", "[layers]") {
  std::mt19937 gen(9);
  const int M = 6, Hd = 8, N = 5;
  auto x = random_vec(size_t(N) * M, gen);
  auto r = random_vec(size_t(N) * M, gen);
  StepContext ctx = train_ctx();
  for (Activation act : {Activation::Relu, Activation::Geglu, Activation::Swiglu}) {
    INFO(option_name(act));
    std::vector<std::vector<double>> ys, dxs;
    for (auto [h0, lh] : {std::pair{0, -1}, {0, 3}, {3, 5}}) {
      MLP<double> mlp(M, Hd, act, 0.0, 1, h0, lh);
      ParamStore<double> store;
      mlp.declare(store, "mlp");
      store.allocate();
      store.init(31, 1.0);
      std::vector<double> y(x.size()), dx(x.size(), 0.0);
      mlp.forward(ctx, x.data(), y.data(), N);
      mlp.backward(ctx, r.data(), dx.data(), N);
      ys.push_back(y);
      dxs.push_back(dx);
    }
    for (size_t i = 0; i < x.size(); ++i) {
      CHECK(std::abs(ys[1][i] + ys[2][i] - ys[0][i]) <= 1e-12);
      CHECK(std::abs(dxs[1][i] + dxs[2][i] - dxs[0][i]) <= 1e-12);
    }
  }
}

TEST_CASE("mlp: float vs double", "[layers]") {
  std::mt19937 gen(10);
  const int M = 32, Hd = 64, N = 24;
  for (Activation act : {Activation::Relu, Activation::Gelu, Activation::Geglu, Activation::Swiglu}) {
    INFO(option_name(act));
    auto [mf, md, sf, sd] =
        twin([&](auto t) { return std::make_unique<MLP<decltype(t)>>(M, Hd, act, 0.1, 4); }, gen);
    auto xf = to_float(random_vec(size_t(N) * M, gen));
    std::vector<float> yf(xf.size());
    std::vector<double> yd(xf.size());
    StepContext ctx = train_ctx();
    mf->forward(ctx, xf.data(), yf.data(), N);
    md->forward(ctx, to_double(xf).data(), yd.data(), N);
    check_close_float(yf, yd, "mlp");
  }
}

// ---------------------------------------------------------------------------------------------
TEST_CASE("cross entropy: masked, weighted, finite differences, stable", "[layers]") {
  std::mt19937 gen(11);
  const int N = 9, V = 7;
  auto logits = random_vec(size_t(N) * V, gen, -3, 3);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (3 * n + 1) % V;
  std::vector<double> mask(N, 1.0);
  mask[2] = mask[5] = 0.0;
  targets[5] = -1;  // ignored where masked
  const double weight = 1.0 / 13.0;
  StepContext ctx = train_ctx();
  CrossEntropy<double> ce;
  const double loss = ce.forward(ctx, logits.data(), targets.data(), mask.data(), N, V, weight);
  double ref = 0;
  for (int n = 0; n < N; ++n) {
    if (mask[n] == 0) {
      CHECK(ce.per_token_loss()[n] == 0.0);
      continue;
    }
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(logits[n * V + v]);
    const double tl = std::log(z) - logits[n * V + targets[n]];
    CHECK(std::abs(ce.per_token_loss()[n] - tl) <= 1e-12);
    ref += tl;
  }
  CHECK(std::abs(loss - weight * ref) <= 1e-12);
  CHECK(ce.count() == 7.0);
  std::vector<double> dlogits(logits.size());
  ce.backward(ctx, logits.data(), dlogits.data(), N);
  for (int v = 0; v < V; ++v) CHECK(dlogits[2 * V + v] == 0.0);
  std::vector<FdTensor> t{{"logits", logits.data(), dlogits}};
  CrossEntropy<double> ce2;
  check_fd([&] { return ce2.forward(ctx, logits.data(), targets.data(), mask.data(), N, V, weight); }, t, gen, 1000);
  // in place
  auto inplace = logits;
  ce.forward(ctx, inplace.data(), targets.data(), mask.data(), N, V, weight);
  ce.backward(ctx, inplace.data(), inplace.data(), N);
  for (size_t i = 0; i < inplace.size(); ++i) CHECK(std::abs(inplace[i] - dlogits[i]) <= 1e-15);

  // huge logits: finite, and equal to the shifted problem (logsumexp is shift invariant)
  std::vector<float> big(size_t(N) * V), small(big.size());
  for (size_t i = 0; i < big.size(); ++i) {
    small[i] = float(logits[i]);
    big[i] = small[i] + 1000.0f;
  }
  CrossEntropy<float> cf;
  const auto maskf = to_float(mask);
  const double lb = cf.forward(ctx, big.data(), targets.data(), maskf.data(), N, V, 1.0);
  const double ls = cf.forward(ctx, small.data(), targets.data(), maskf.data(), N, V, 1.0);
  CHECK(std::isfinite(lb));
  CHECK(std::abs(lb - ls) <= 1e-3 * ls);  // float rounding of x+1000 is ~6e-5 per logit
  CHECK(std::abs(ls - ref) <= kFloatTol * ref);  // float vs double forward
  targets[0] = V;
  CHECK_THROWS_AS(ce.forward(ctx, logits.data(), targets.data(), mask.data(), N, V, weight), Error);
}

// ---------------------------------------------------------------------------------------------
// Distillation's soft-target cross-entropy (Switch section 4.2): per token
// (1 - alpha) CE(target) + alpha CE(p), CE(p) = -sum_v p_v log softmax(logits)_v. The oracle writes
// CE(p) through log-softmax (not the layer's lse * sum p - sum p l form). Tolerances: 1e-12 for
// the double forward, kFdTol for finite differences, kFloatTol for float vs double, and bitwise
// where alpha = 0 must be the plain cross-entropy.
TEST_CASE("soft-target cross entropy: oracle, finite differences, alpha = 0 is the plain loss", "[layers][distill]") {
  std::mt19937 gen(12);
  const int N = 9, V = 7;
  auto logits = random_vec(size_t(N) * V, gen, -3, 3);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (2 * n + 3) % V;
  std::vector<double> mask(N, 1.0);
  mask[1] = mask[6] = 0.0;
  targets[6] = -1;  // ignored where masked
  const double weight = 1.0 / 11.0;
  // The teacher's probabilities (rows of a softmax), and rows that do not sum to 1 (the layer's
  // gradient is exact for any p).
  auto teacher = random_vec(size_t(N) * V, gen, -2, 2);
  std::vector<double> probs(teacher.size()), loose(teacher.size());
  for (int n = 0; n < N; ++n) {
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(teacher[n * V + v]);
    for (int v = 0; v < V; ++v) probs[n * V + v] = std::exp(teacher[n * V + v]) / z;
    for (int v = 0; v < V; ++v) loose[n * V + v] = 0.3 * std::exp(teacher[n * V + v]) / z + 0.1 * (v % 3);
  }
  StepContext ctx = train_ctx();
  for (const bool normalised : {true, false}) {
    const std::vector<double>& p = normalised ? probs : loose;
    for (const double alpha : {0.0, 0.25, 1.0}) {
      INFO("alpha " << alpha << (normalised ? " probabilities" : " rows not summing to 1"));
      CrossEntropy<double> ce;
      const double loss = ce.forward(ctx, logits.data(), targets.data(), mask.data(), N, V, weight, p.data(), alpha);
      double ref = 0;
      for (int n = 0; n < N; ++n) {
        if (mask[n] == 0) {
          CHECK(ce.per_token_loss()[n] == 0.0);
          CHECK(ce.per_token_soft_loss()[n] == 0.0);
          continue;
        }
        double z = 0;
        for (int v = 0; v < V; ++v) z += std::exp(logits[n * V + v]);
        const double hard = std::log(z) - logits[n * V + targets[n]];
        double soft = 0;
        for (int v = 0; v < V; ++v) soft -= p[n * V + v] * std::log(std::exp(logits[n * V + v]) / z);
        CHECK(std::abs(ce.per_token_loss()[n] - hard) <= 1e-12);
        CHECK(std::abs(ce.per_token_soft_loss()[n] - soft) <= 1e-12);
        ref += (1 - alpha) * hard + alpha * soft;
      }
      CHECK(std::abs(loss - weight * ref) <= 1e-12 * std::max(1.0, std::abs(weight * ref)));
      std::vector<double> dlogits(logits.size());
      ce.backward(ctx, logits.data(), dlogits.data(), N);
      for (int v = 0; v < V; ++v) CHECK(dlogits[1 * V + v] == 0.0);
      std::vector<FdTensor> t{{"logits", logits.data(), dlogits}};
      CrossEntropy<double> ce2;
      check_fd([&] { return ce2.forward(ctx, logits.data(), targets.data(), mask.data(), N, V, weight, p.data(), alpha); },
               t, gen, 1000);
      // in place, as the Transformer calls it
      auto inplace = logits;
      ce.forward(ctx, inplace.data(), targets.data(), mask.data(), N, V, weight, p.data(), alpha);
      ce.backward(ctx, inplace.data(), inplace.data(), N);
      for (size_t i = 0; i < inplace.size(); ++i) CHECK(inplace[i] == dlogits[i]);
      // float vs double
      CrossEntropy<float> cf;
      const auto lf = to_float(logits), pf = to_float(p), mf = to_float(mask);
      const double lossf = cf.forward(ctx, lf.data(), targets.data(), mf.data(), N, V, weight, pf.data(), alpha);
      CHECK(std::abs(lossf - loss) <= kFloatTol * std::abs(loss));
      std::vector<float> df(lf.size());
      cf.backward(ctx, lf.data(), df.data(), N);
      check_close_float(df, dlogits, "soft-target dlogits");
    }
  }
  // alpha = 0 with soft targets is bitwise the plain cross-entropy (float, the training type):
  // `distill` with distill.alpha = 0 trains exactly as `train --init-from` does.
  const auto lf = to_float(logits), pf = to_float(probs), mf = to_float(mask);
  CrossEntropy<float> plain, mixed;
  const double l0 = plain.forward(ctx, lf.data(), targets.data(), mf.data(), N, V, weight);
  const double l1 = mixed.forward(ctx, lf.data(), targets.data(), mf.data(), N, V, weight, pf.data(), 0.0);
  CHECK(l0 == l1);
  std::vector<float> d0(lf.size()), d1(lf.size());
  plain.backward(ctx, lf.data(), d0.data(), N);
  mixed.backward(ctx, lf.data(), d1.data(), N);
  CHECK(d0 == d1);
  CHECK(plain.per_token_soft_loss().empty());
}

// forward_with_gradient (the loss's gradient in the forward's row pass) against forward then
// backward in place: bitwise the same loss, per-token losses and dlogits, plain and with soft
// targets, on rows long enough for the host threads, and with the loops reversed.
template <typename T>
void check_forward_with_gradient(bool reversed) {
  std::mt19937 gen(17);
  const int N = 23, V = 1601;
  std::vector<T> logits(size_t(N) * V), probs(logits.size()), mask(N, T(1));
  std::uniform_real_distribution<double> u(-4, 4);
  for (auto& x : logits) x = T(u(gen));
  for (int64_t n = 0; n < N; ++n) SoftmaxRow<T>{logits.data(), probs.data(), V}(n, HostLanes{});
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (7 * n + 3) % V;
  mask[4] = mask[11] = T(0);
  targets[11] = -1;
  const StepContext ctx = train_ctx();
  set_host_loop_reversed(reversed);
  set_host_loop_threads(2);
  for (const T* soft : {(const T*)nullptr, (const T*)probs.data()}) {
    CrossEntropy<T> two_passes, one_pass;
    auto d2 = logits, d1 = logits;
    const double l2 = two_passes.forward(ctx, d2.data(), targets.data(), mask.data(), N, V, 0.03, soft, 0.4);
    two_passes.backward(ctx, d2.data(), d2.data(), N);
    const double l1 = one_pass.forward_with_gradient(ctx, d1.data(), targets.data(), mask.data(), N, V, 0.03, soft, 0.4);
    one_pass.backward(ctx, d1.data(), d1.data(), N);  // a no-op: the gradient is there
    CHECK(l1 == l2);
    CHECK(std::ranges::equal(one_pass.per_token_loss(), two_passes.per_token_loss()));
    CHECK(std::ranges::equal(one_pass.per_token_soft_loss(), two_passes.per_token_soft_loss()));
    CHECK(d1 == d2);
    CHECK(d1 != logits);
    std::vector<T> other(logits.size());
    CHECK_THROWS_AS(one_pass.backward(ctx, d1.data(), other.data(), N), std::logic_error);
  }
  set_host_loop_threads(1);
  set_host_loop_reversed(false);
}

TEST_CASE("cross entropy: forward_with_gradient is forward then backward, bit for bit", "[layers][distill]") {
  check_forward_with_gradient<float>(false);
  check_forward_with_gradient<float>(true);
  check_forward_with_gradient<double>(false);
}

TEST_CASE("softmax rows: the teacher's probabilities", "[layers][distill]") {
  std::mt19937 gen(13);
  const int N = 5, V = 11;
  auto logits = random_vec(size_t(N) * V, gen, -4, 4);
  logits[3] += 800;  // a huge logit: still finite, and that row one-hot to rounding
  std::vector<double> probs(logits.size());
  for (int64_t n = 0; n < N; ++n) SoftmaxRow<double>{logits.data(), probs.data(), V}(n, HostLanes{});
  for (int n = 0; n < N; ++n) {
    double z = 0, mx = logits[n * V];
    for (int v = 0; v < V; ++v) mx = std::max(mx, logits[n * V + v]);
    for (int v = 0; v < V; ++v) z += std::exp(logits[n * V + v] - mx);
    double sum = 0;
    for (int v = 0; v < V; ++v) {
      CHECK(std::abs(probs[n * V + v] - std::exp(logits[n * V + v] - mx) / z) <= 1e-15);
      sum += probs[n * V + v];
    }
    CHECK(std::abs(sum - 1) <= 1e-14);
  }
  CHECK(probs[3] == 1.0);
}

TEST_CASE("distill: the share of the teacher's gain the student keeps", "[distill]") {
  // Switch Table 6: T5-Base -1.636, Switch-Base -1.444, distilled -1.580 (neg. log perplexity) -> 29%
  CHECK(std::abs(preserved_fraction(1.444, 1.580, 1.636) - (1.636 - 1.580) / (1.636 - 1.444)) <= 1e-15);
  CHECK(std::abs(preserved_fraction(1.444, 1.580, 1.636) - 0.2917) <= 1e-4);
  CHECK(preserved_fraction(1.0, 2.0, 2.0) == 0.0);  // the baseline's loss: nothing kept
  CHECK(preserved_fraction(1.0, 1.0, 2.0) == 1.0);  // the teacher's loss: all of it
  CHECK(preserved_fraction(1.0, 1.0, 1.0) != preserved_fraction(1.0, 1.0, 1.0));  // no gain: NaN
  // A teacher "better" by evaluation noise (here 1e-5 nats on 2.3) gave "keeps 11097.1%": NaN
  // below kMinTeacherGain of the baseline's loss, a share just above it.
  CHECK(std::isnan(preserved_fraction(2.3, 2.2, 2.3 + 1e-5)));
  CHECK(std::isnan(preserved_fraction(2.3, 2.2, 2.3 / (1 - 0.9 * kMinTeacherGain))));
  CHECK(std::isfinite(preserved_fraction(2.0, 2.0, 2.0 / (1 - 2 * kMinTeacherGain))));
  CHECK(std::isnan(preserved_fraction(2.0, 1.9, 1.5)));  // a worse teacher
}
