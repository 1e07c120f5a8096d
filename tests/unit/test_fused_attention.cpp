// The fused attention (model/fused_attention.hpp): its tiles against a plain loop in double, the
// layer with model.attention_kernel = "fused" against the plain layer in fp32 and bf16, bitwise
// determinism (twice, host loops reversed, threads, the deferred host device), and with a GPU
// ([cuda]) the kernels (tile and tensor cores) against the host and bitwise twice. Its finite differences are in
// test_layers_fd.cpp with the other attention cases.
//
// Tolerances (u = 2^-24 for fp32, 2^-53 for fp64, u_b = 2^-8 for a bf16 rounding):
//  - every value here is a chain of at most three sums (S, then O or dP, then dS's products) of at
//    most n = max(T, D) terms, each computed in another order by the two paths; a sum of n terms in
//    any order is within n u of the sum of its terms' magnitudes (Higham, gamma_n), and with inputs
//    in [-1, 1] and a softmax in between, those magnitudes stay below 4 max(1, |value|) for these
//    shapes (the softmax's weights sum to 1; |dS| <= 2 max|dP|). So the two paths agree to
//    2 x 3 x 4 n u = 24 n u of max(1, the tensor's largest magnitude), elementwise: 24 x 64 x 2^-53
//    < 2e-13 in double, 24 x 64 x 2^-24 < 1e-4 in fp32 at T = 64 (n u used with the case's own n).
//  - bf16: both paths round P and dS (the plain path once normalised, the fused one per tile before
//    the rescaling), and the layer's GEMMs round q, k, v, dO alike in both; one rounding of a factor
//    changes a product by at most u_b of its magnitude, so each path is within 3 u_b (P, then dS
//    through dP's chain) of the unrounded sums and the two within 6 u_b, which the same factor 4
//    takes to 24 u_b < 0.1 of max(1, largest magnitude), elementwise; the fp32 part is far below.
//  - the tensor-core kernels against the host's bf16 tiles: both read the same bf16 q, k, v, dO
//    (rounded alike from the same fp32 values) and round the same intermediates (P per key tile
//    with the same running maximum, dS) from fp32 values that differ only by sums in other orders
//    (the tensor cores' inside each 16-term chunk), so one such rounding may land on the
//    neighbouring bf16 value; each path is within 3 u_b of its own unrounded sums as above, so
//    the two within the same 24 u_b. lse rounds nothing past the operands: the fp32 bound 24 n u.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/attention.hpp"
#include "model/attention_core.hpp"
#include "model/fused_attention.hpp"
#include "model/fused_attention_bodies.hpp"
#include "model/layer_shapes.hpp"
#include "test_util.hpp"

using namespace meshmoe;
using meshmoe::test::GemmPrecisionScope;
using meshmoe::test::HostLoopsReversed;

namespace {

// Values in [-1, 1] that fp32 holds exactly (so fp32 and double runs start from the same inputs).
template <typename T>
std::vector<T> random_values(size_t n, std::mt19937& gen) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> v(n);
  for (auto& x : v) x = T(float(u(gen)));
  return v;
}

// Packed examples of random lengths (1 to 12 tokens) in each of B sequences of T tokens.
std::vector<int32_t> random_segments(int B, int T, std::mt19937& gen) {
  std::uniform_int_distribution<int> len(1, 12);
  std::vector<int32_t> seg(size_t(B) * T);
  for (int b = 0; b < B; ++b) {
    int id = 0, left = len(gen);
    for (int i = 0; i < T; ++i, --left) {
      if (left == 0) ++id, left = len(gen);
      seg[size_t(b) * T + i] = id;
    }
  }
  return seg;
}

// The largest |a - b| against tol x max(1, max|b|).
template <typename A, typename B>
void check_close(const std::string& what, const std::vector<A>& a, const std::vector<B>& b, double tol) {
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  INFO(what << ": max |difference| " << worst << ", bound " << tol * scale);
  CHECK(worst <= tol * scale);
}

// The plain loop: S, P with the masks, O = P V, and from dO: dP = dO V^T, dS = P (dP - rowsum(P dP)),
// dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO; all in double, one (b, h) pair at a time.
struct LoopAttention {
  std::vector<double> O, dq, dk, dv;
};
LoopAttention loop_attention(const FusedAttentionShape& s, const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, const std::vector<double>& dO) {
  const int T = s.Tq, D = s.D;
  const int64_t A = int64_t(s.heads_l) * D;
  const double scale = 1 / std::sqrt(double(D));
  LoopAttention r{std::vector<double>(q.size()), std::vector<double>(q.size()), std::vector<double>(q.size()),
                  std::vector<double>(q.size())};
  auto x = [&](const std::vector<double>& m, int b, int i, int h, int d) { return m[(int64_t(b) * T + i) * A + h * D + d]; };
  auto at = [&](int b, int i, int h, int d) { return (int64_t(b) * T + i) * A + h * D + d; };
  std::vector<double> P(size_t(T) * T), dS(size_t(T) * T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.heads_l; ++h) {
      for (int i = 0; i < T; ++i) {
        double mx = -INFINITY;
        for (int j = 0; j < T; ++j) {
          const bool sees = (!s.causal || j <= i) && (!s.segment || s.segment[b * T + j] == s.segment[b * T + i]);
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += x(q, b, i, h, d) * x(k, b, j, h, d);
          P[size_t(i) * T + j] = sees ? scale * dot : -INFINITY;
          mx = std::max(mx, P[size_t(i) * T + j]);
        }
        double z = 0;
        for (int j = 0; j < T; ++j) z += P[size_t(i) * T + j] = std::exp(P[size_t(i) * T + j] - mx);
        for (int j = 0; j < T; ++j) P[size_t(i) * T + j] /= z;
        double row = 0;
        for (int j = 0; j < T; ++j) {
          double dp = 0;
          for (int d = 0; d < D; ++d) dp += x(dO, b, i, h, d) * x(v, b, j, h, d);
          dS[size_t(i) * T + j] = dp;
          row += P[size_t(i) * T + j] * dp;
        }
        for (int j = 0; j < T; ++j) dS[size_t(i) * T + j] = P[size_t(i) * T + j] * (dS[size_t(i) * T + j] - row);
      }
      for (int i = 0; i < T; ++i)
        for (int j = 0; j < T; ++j)
          for (int d = 0; d < D; ++d) {
            r.O[at(b, i, h, d)] += P[size_t(i) * T + j] * x(v, b, j, h, d);
            r.dq[at(b, i, h, d)] += scale * dS[size_t(i) * T + j] * x(k, b, j, h, d);
            r.dk[at(b, j, h, d)] += scale * dS[size_t(i) * T + j] * x(q, b, i, h, d);
            r.dv[at(b, j, h, d)] += P[size_t(i) * T + j] * x(dO, b, i, h, d);
          }
    }
  return r;
}

template <typename T>
struct FusedRun {
  std::vector<T> O, lse, delta, dq, dk, dv;
};
template <typename T>
FusedRun<T> run_fused(const FusedAttentionShape& s, const std::vector<T>& q, const std::vector<T>& k,
                      const std::vector<T>& v, const std::vector<T>& dO) {
  FusedRun<T> r{std::vector<T>(q.size()), std::vector<T>(size_t(s.B) * s.heads_l * s.Tq),
                std::vector<T>(size_t(s.B) * s.heads_l * s.Tq), std::vector<T>(q.size()), std::vector<T>(q.size()),
                std::vector<T>(q.size())};
  fused_attention_forward(s, q.data(), k.data(), v.data(), r.O.data(), r.lse.data());
  fused_attention_backward(s, q.data(), k.data(), v.data(), r.O.data(), r.lse.data(), dO.data(), r.delta.data(),
                           r.dq.data(), r.dk.data(), r.dv.data());
  return r;
}

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
template <typename T>
bool bitwise_equal(const FusedRun<T>& a, const FusedRun<T>& b) {
  return bitwise_equal(a.O, b.O) && bitwise_equal(a.lse, b.lse) && bitwise_equal(a.dq, b.dq) &&
         bitwise_equal(a.dk, b.dk) && bitwise_equal(a.dv, b.dv);
}

struct CoreCase {
  int B, heads, D, T;
  bool causal, packed;
};
const CoreCase kCoreCases[] = {
    {2, 3, 8, 37, true, true},    // T not a multiple of the tile, packed examples
    {1, 2, 16, 16, true, false},  // one tile exactly
    {2, 1, 4, 5, true, true},     // T below one tile
    {1, 2, 8, 64, true, true},    // four tiles
    {2, 2, 8, 23, false, true},   // bidirectional within examples (the encoder's)
};

}  // namespace

TEST_CASE("fused attention tiles: forward and gradients against the plain loop in double and fp32", "[attention][fused]") {
  std::mt19937 gen(71);
  for (const CoreCase& c : kCoreCases) {
    INFO("B " << c.B << ", heads " << c.heads << ", D " << c.D << ", T " << c.T << (c.causal ? ", causal" : "")
              << (c.packed ? ", packed" : ""));
    const size_t n = size_t(c.B) * c.T * c.heads * c.D;
    const auto q = random_values<double>(n, gen), k = random_values<double>(n, gen),
               v = random_values<double>(n, gen), dO = random_values<double>(n, gen);
    const auto seg = random_segments(c.B, c.T, gen);
    const FusedAttentionShape s{.B = c.B, .heads_l = c.heads, .D = c.D, .Tq = c.T, .causal = c.causal,
                                .segment = c.packed ? seg.data() : nullptr};
    const LoopAttention ref = loop_attention(s, q, k, v, dO);
    const double terms = std::max(c.T, c.D);
    const FusedRun<double> f64 = run_fused(s, q, k, v, dO);
    const double tol64 = 24 * terms * std::ldexp(1.0, -53);
    check_close("O, double", f64.O, ref.O, tol64);
    check_close("dq, double", f64.dq, ref.dq, tol64);
    check_close("dk, double", f64.dk, ref.dk, tol64);
    check_close("dv, double", f64.dv, ref.dv, tol64);
    auto to_float = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
    const FusedRun<float> f32 = run_fused(s, to_float(q), to_float(k), to_float(v), to_float(dO));
    const double tol32 = 24 * terms * std::ldexp(1.0, -24);
    check_close("O, fp32", f32.O, ref.O, tol32);
    check_close("dq, fp32", f32.dq, ref.dq, tol32);
    check_close("dk, fp32", f32.dk, ref.dk, tol32);
    check_close("dv, fp32", f32.dv, ref.dv, tol32);
    // lse: log sum_j exp(s_ij) over the visible keys, the plain loop's z and max recomputed
    CHECK(std::all_of(f64.lse.begin(), f64.lse.end(), [](double x) { return std::isfinite(x); }));
    // The bidirectional tiles against the plain core too (attention_core.hpp, the encoder's path).
    if (!c.causal) {
      std::vector<double> P(size_t(c.B) * c.heads * c.T * c.T), O(n);
      const AttentionPairs a{.B = c.B, .heads_l = c.heads, .D = c.D, .Tq = c.T, .Tk = c.T,
                             .query_segment = s.segment, .key_segment = s.segment};
      masked_attention_forward(a, q.data(), k.data(), v.data(), P.data(), O.data());
      check_close("O against masked_attention_forward", f64.O, O, tol64);
    }
  }
}

TEST_CASE("fused attention tiles: bitwise the same twice, with host loops reversed, on threads and queued", "[attention][fused]") {
  std::mt19937 gen(72);
  const int B = 2, heads = 3, D = 8, T = 41;
  const size_t n = size_t(B) * T * heads * D;
  const auto q = random_values<float>(n, gen), k = random_values<float>(n, gen), v = random_values<float>(n, gen),
             dO = random_values<float>(n, gen);
  const auto seg = random_segments(B, T, gen);
  for (const bool bf16 : {false, true}) {
    INFO((bf16 ? "bf16" : "fp32"));
    const FusedAttentionShape s{.B = B, .heads_l = heads, .D = D, .Tq = T, .causal = true, .segment = seg.data(),
                                .bf16 = bf16};
    const FusedRun<float> first = run_fused(s, q, k, v, dO);
    CHECK(bitwise_equal(first, run_fused(s, q, k, v, dO)));
    {
      HostLoopsReversed reversed;  // one thread, the tiles in reverse: no tile reads another's writes
      CHECK(bitwise_equal(first, run_fused(s, q, k, v, dO)));
    }
    set_host_loop_threads(2);  // several threads take contiguous blocks of tiles
    CHECK(bitwise_equal(first, run_fused(s, q, k, v, dO)));
    set_host_loop_threads(1);
  }
}

namespace {

// Two layers of one shape, plain and fused, with the same weights; float.
struct LayerPair {
  AttentionShape shape;
  double rope = 0;
  bool causal = true;
};

struct LayerRun {
  std::vector<float> y, dx, grads;
};
LayerRun run_layer(const LayerPair& c, AttentionKernel kernel, const StepContext& ctx, const std::vector<float>& x,
                   const std::vector<float>& dy, int N, int T) {
  CausalSelfAttention<float> att(c.shape, 0.0, 5, c.causal, c.rope);
  att.set_kernel(kernel);
  ParamStore<float> store;
  att.declare(store, "attn");
  store.allocate();
  store.init(19, 1.0);
  LayerRun r{std::vector<float>(x.size()), std::vector<float>(x.size()), {}};
  att.forward(ctx, x.data(), r.y.data(), N, T);
  // The Transformer's backward context carries no segment ids: the layer keeps the forward's.
  att.backward(StepContext{}, dy.data(), r.dx.data(), N);
  device_synchronize();
  r.grads.assign(store.grads(), store.grads() + store.size());
  return r;
}

}  // namespace

TEST_CASE("fused attention layer: the plain layer's output and every gradient, fp32 and bf16, rope, kv_heads", "[attention][fused]") {
  std::mt19937 gen(73);
  struct Case {
    int M, heads, kv_heads, B, T;
    double rope;
    bool causal, packed;
  };
  for (const Case& c : {Case{32, 4, 4, 2, 37, 0, true, true}, Case{32, 4, 2, 2, 20, 10000, true, true},
                        Case{64, 2, 1, 1, 16, 10000, true, false}, Case{24, 3, 3, 2, 19, 0, false, true}, Case{32, 4, 4, 4, 40, 0, true, true}}) {
    INFO("M " << c.M << ", heads " << c.heads << ", kv_heads " << c.kv_heads << ", T " << c.T
              << (c.rope > 0 ? ", rope" : "") << (c.causal ? ", causal" : ", bidirectional"));
    const int N = c.B * c.T;
    const LayerPair pair{attention_shape(c.M, c.heads, whole(c.heads), c.kv_heads), c.rope, c.causal};
    const auto x = random_values<float>(size_t(N) * c.M, gen), dy = random_values<float>(size_t(N) * c.M, gen);
    const auto seg = random_segments(c.B, c.T, gen);
    StepContext ctx;
    ctx.segment = c.packed ? seg.data() : nullptr;
    // The projections add sums of M terms to the core's chain.
    const double terms = std::max({c.T, c.M, c.M / c.heads});
    for (const Precision p : {Precision::Fp32, Precision::Bf16}) {
      INFO(option_name(p));
      GemmPrecisionScope precision(p);
      const double tol = p == Precision::Bf16 ? 24 * std::ldexp(1.0, -8) : 24 * terms * std::ldexp(1.0, -24);
      const LayerRun plain = run_layer(pair, AttentionKernel::Plain, ctx, x, dy, N, c.T);
      const LayerRun fused = run_layer(pair, AttentionKernel::Fused, ctx, x, dy, N, c.T);
      check_close("y", fused.y, plain.y, tol);
      check_close("dx", fused.dx, plain.dx, tol);
      check_close("weight gradients", fused.grads, plain.grads, tol);
      CHECK(bitwise_equal(fused.y, run_layer(pair, AttentionKernel::Fused, ctx, x, dy, N, c.T).y));
    }
  }
}

namespace {

// The scope's launches go to the GPU.
struct OnGpu {
  OnGpu() {
    cuda_bind(0);
    set_device(Device::Cuda);
  }
  ~OnGpu() { set_device(Device::Cpu); }
};

// run_layer's fused layer with its inputs and outputs in device Buffers, reached only through the
// transfer points' copies (the rule of the deferred host device and of a GPU's memory).
LayerRun run_layer_in_buffers(const LayerPair& c, const StepContext& ctx, const std::vector<float>& x,
                              const std::vector<float>& dy, int N, int T) {
  Buffer<float> xb(x.size()), dyb(dy.size()), y(x.size()), dx(x.size());
  copy_from_host(xb.data(), x.data(), x.size() * sizeof(float));
  copy_from_host(dyb.data(), dy.data(), dy.size() * sizeof(float));
  CausalSelfAttention<float> att(c.shape, 0.0, 5, c.causal, c.rope);
  att.set_kernel(AttentionKernel::Fused);
  ParamStore<float> store;
  att.declare(store, "attn");
  store.allocate();
  store.init(19, 1.0);
  att.forward(ctx, xb.data(), y.data(), N, T);
  att.backward(StepContext{}, dyb.data(), dx.data(), N);
  LayerRun r{std::vector<float>(x.size()), std::vector<float>(x.size()), std::vector<float>(store.size())};
  copy_to_host(r.y.data(), y.data(), x.size() * sizeof(float));
  copy_to_host(r.dx.data(), dx.data(), x.size() * sizeof(float));
  copy_to_host(r.grads.data(), store.grads(), store.size() * sizeof(float));
  return r;
}

}  // namespace

TEST_CASE("fused attention layer: the deferred host device computes the same bits", "[attention][fused][device]") {
  std::mt19937 gen(74);
  const int M = 32, heads = 4, B = 2, T = 21, N = B * T;
  const LayerPair pair{attention_shape(M, heads, whole(heads), 2), 10000, true};
  const auto x = random_values<float>(size_t(N) * M, gen), dy = random_values<float>(size_t(N) * M, gen);
  StepContext ctx;
  for (const Precision p : {Precision::Fp32, Precision::Bf16}) {
    INFO(option_name(p));
    GemmPrecisionScope precision(p);
    const LayerRun host = run_layer(pair, AttentionKernel::Fused, ctx, x, dy, N, T);
    LayerRun queued;
    {
      meshmoe::test::DeferredHostDevice device;
      queued = run_layer_in_buffers(pair, ctx, x, dy, N, T);
    }
    CHECK(bitwise_equal(host.y, queued.y));
    CHECK(bitwise_equal(host.dx, queued.dx));
    CHECK(bitwise_equal(host.grads, queued.grads));
  }
}

// The fused layer on a GPU: at D = 16 the kernel of the same bodies (model/fused_attention.cu), at
// D = 64 in bf16 the tensor-core kernels (model/fused_attention_tc.cu); the host's fused layer within
// the layer case's bounds (the GPU's exp and log and cuBLAS's sums round in other orders, and the
// tensor cores' sums: the header's bf16 argument), and two GPU runs bitwise equal. Without a GPU it
// says so and passes.
TEST_CASE("fused attention layer on the GPU: the host's within the bounds, bitwise twice", "[attention][fused][cuda]") {
  if (!cuda_compiled() || cuda_device_count() == 0) {
    WARN("skipped: no GPU");
    return;
  }
  std::mt19937 gen(75);
  const int B = 2, T = 45, N = B * T;
  struct Case {
    int M, heads, kv_heads;
  };
  for (const Case& c : {Case{64, 4, 2}, Case{128, 2, 1}}) {
    INFO("M " << c.M << ", heads " << c.heads << " (D " << c.M / c.heads << ")");
    const LayerPair pair{attention_shape(c.M, c.heads, whole(c.heads), c.kv_heads), 10000, true};
    const auto x = random_values<float>(size_t(N) * c.M, gen), dy = random_values<float>(size_t(N) * c.M, gen);
    const auto seg = random_segments(B, T, gen);
    StepContext ctx;
    Buffer<int32_t> segment;
    for (const Precision p : {Precision::Fp32, Precision::Bf16}) {
      INFO(option_name(p));
      GemmPrecisionScope precision(p);
      ctx.segment = seg.data();
      const LayerRun host = run_layer(pair, AttentionKernel::Fused, ctx, x, dy, N, T);
      LayerRun first, second;
      {
        OnGpu gpu;
        segment = Buffer<int32_t>(seg.size());
        copy_from_host(segment.data(), seg.data(), seg.size() * sizeof(int32_t));
        ctx.segment = segment.data();
        first = run_layer_in_buffers(pair, ctx, x, dy, N, T);
        second = run_layer_in_buffers(pair, ctx, x, dy, N, T);
        segment = Buffer<int32_t>();
      }
      const double tol =
          p == Precision::Bf16 ? 24 * std::ldexp(1.0, -8) : 24 * std::max(T, c.M) * std::ldexp(1.0, -24);
      check_close("y", first.y, host.y, tol);
      check_close("dx", first.dx, host.dx, tol);
      check_close("weight gradients", first.grads, host.grads, tol);
      CHECK(bitwise_equal(first.y, second.y));
      CHECK(bitwise_equal(first.dx, second.dx));
      CHECK(bitwise_equal(first.grads, second.grads));
    }
  }
}

namespace {

// run_fused on the GPU: the operands (and the segment ids) in device Buffers, the results copied back.
FusedRun<float> run_fused_on_gpu(const FusedAttentionShape& s, const std::vector<float>& q,
                                 const std::vector<float>& k, const std::vector<float>& v,
                                 const std::vector<float>& dO) {
  const size_t n = q.size(), rows = size_t(s.B) * s.heads_l * s.Tq;
  Buffer<float> qb, kb, vb, dOb, O(n), lse(rows), delta(rows), dq(n), dk(n), dv(n);
  upload(qb, q.data(), n);
  upload(kb, k.data(), n);
  upload(vb, v.data(), n);
  upload(dOb, dO.data(), n);
  Buffer<int32_t> segment;
  FusedAttentionShape on_gpu = s;
  if (s.segment) {
    upload(segment, s.segment, size_t(s.B) * s.Tq);
    on_gpu.segment = segment.data();
  }
  fused_attention_forward(on_gpu, qb.data(), kb.data(), vb.data(), O.data(), lse.data());
  fused_attention_backward(on_gpu, qb.data(), kb.data(), vb.data(), O.data(), lse.data(), dOb.data(), delta.data(),
                           dq.data(), dk.data(), dv.data());
  return {download(O), download(lse), download(delta), download(dq), download(dk), download(dv)};
}

}  // namespace

// The tensor-core kernels (model/fused_attention_tc.cu) against the host's bf16 tiles at head widths
// 64 and 128: causal and bidirectional, packed examples, T short of, equal to and past the 64-row
// blocks (the last block's rows and tiles past T); bitwise twice; and which shapes take them (fp32
// and other widths the tile kernel, the host never). Bounds: the header's tensor-core item.
TEST_CASE("fused attention on tensor cores: the host's bf16 tiles within the bound, bitwise twice", "[attention][fused][cuda]") {
  CHECK_FALSE(fused_attention_uses_tensor_cores({.B = 1, .heads_l = 1, .D = 64, .Tq = 16, .bf16 = true}));
  if (!cuda_compiled() || cuda_device_count() == 0) {
    WARN("skipped: no GPU");
    return;
  }
  std::mt19937 gen(76);
  for (const CoreCase& c : {CoreCase{2, 2, 64, 45, true, true}, CoreCase{1, 3, 64, 130, true, false},
                            CoreCase{2, 1, 64, 77, false, true}, CoreCase{2, 2, 128, 100, true, true},
                            CoreCase{1, 1, 128, 64, true, false}}) {
    INFO("B " << c.B << ", heads " << c.heads << ", D " << c.D << ", T " << c.T << (c.causal ? ", causal" : "")
              << (c.packed ? ", packed" : ""));
    const size_t n = size_t(c.B) * c.T * c.heads * c.D;
    const auto q = random_values<float>(n, gen), k = random_values<float>(n, gen), v = random_values<float>(n, gen),
               dO = random_values<float>(n, gen);
    const auto seg = random_segments(c.B, c.T, gen);
    const FusedAttentionShape s{.B = c.B, .heads_l = c.heads, .D = c.D, .Tq = c.T, .causal = c.causal,
                                .segment = c.packed ? seg.data() : nullptr, .bf16 = true};
    const FusedRun<float> host = run_fused(s, q, k, v, dO);
    FusedRun<float> first, second;
    {
      OnGpu gpu;
      REQUIRE(fused_attention_uses_tensor_cores(s));
      CHECK_FALSE(fused_attention_uses_tensor_cores({.B = 1, .heads_l = 1, .D = c.D, .Tq = 16, .bf16 = false}));
      CHECK_FALSE(fused_attention_uses_tensor_cores({.B = 1, .heads_l = 1, .D = 32, .Tq = 16, .bf16 = true}));
      first = run_fused_on_gpu(s, q, k, v, dO);
      second = run_fused_on_gpu(s, q, k, v, dO);
    }
    const double tol = 24 * std::ldexp(1.0, -8);
    check_close("O", first.O, host.O, tol);
    check_close("lse", first.lse, host.lse, 24 * std::max(c.T, c.D) * std::ldexp(1.0, -24));
    check_close("dq", first.dq, host.dq, tol);
    check_close("dk", first.dk, host.dk, tol);
    check_close("dv", first.dv, host.dv, tol);
    CHECK(bitwise_equal(first, second));
  }
}
