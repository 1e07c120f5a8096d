// The index-form dispatch / experts / combine against GShard Algorithm 2 written with dense one-hot
// tensors (einsum_oracle): forward output and every gradient, top-1 and top-2, with and without
// overflow. Tolerance: |index - oracle| <= 1e-12 * max(1, |oracle|) (double; only the summation order
// differs).
#include <catch2/catch.hpp>

#include <cmath>

#include "oracle/einsum_oracle.hpp"
#include "test_moe_util.hpp"

using namespace meshmoe;
using namespace meshmoe::test;

namespace {

void check_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i]));
    worst = std::max(worst, err);
    bad += err > 1e-12;
  }
  INFO(what << ": worst relative error " << worst);
  CHECK(bad == 0);
}

void compare_with_oracle(MoeOptions opt, bool expect_overflow) {
  const int N = 48, M = opt.d_model;
  MoeHarness<double> hs(opt, 5);
  MoeLayer<double>& layer = *hs.layer;
  StepContext ctx;
  ctx.seed = 3;
  ctx.step = 2;
  ctx.token_offset = 1000;
  const std::vector<double> x = normal_vector(size_t(N) * M, 21), dy = normal_vector(size_t(N) * M, 22);
  const double aux_w = 0.5, z_w = 0.1;

  // Index path: forward, backward.
  std::vector<double> y(x.size()), dx(x.size(), 0.0);
  layer.forward(ctx, x.data(), y.data(), N);
  hs.store.zero_grad();
  layer.backward(ctx, dy.data(), dx.data(), N, aux_w, z_w);
  const std::vector<double> g_index(hs.store.grads(), hs.store.grads() + hs.store.size());
  const Routing<double>& r = layer.router.routing();
  if (expect_overflow) CHECK(r.dropped > 0);
  else CHECK(r.dropped == 0);

  // Oracle: the same triples through dense dispatch / combine tensors; its dgate goes through the
  // router's backward (shared: the router is not what this test checks).
  EinsumMoeOracle<double> oracle;
  std::vector<double> y_o(x.size()), dx_o(x.size(), 0.0), dgate(size_t(N) * r.k);
  oracle.forward(r, opt.activation, M, opt.d_ff, x.data(), layer.experts.w_in.w, layer.experts.w_out.w, y_o.data());
  hs.store.zero_grad();
  oracle.backward(dy.data(), dx_o.data(), layer.experts.w_in.g, layer.experts.w_out.g, dgate.data());
  layer.router.backward(ctx, dgate.data(), dx_o.data(), N, aux_w, z_w);
  const std::vector<double> g_oracle(hs.store.grads(), hs.store.grads() + hs.store.size());

  // The dense tensors are one-hot per dispatched choice: GShard's "at most k non-zero values" per
  // [g, s, :, :] slice, and the number of ones equals the number of dispatched choices.
  double ones = 0;
  for (double v : oracle.dispatch_mask) ones += v;
  int64_t kept = 0;
  for (int64_t l : r.load) kept += l;
  CHECK(ones == double(kept));

  check_close(y, y_o, "y");
  check_close(dx, dx_o, "dx");
  for (const ParamInfo& p : hs.store.infos()) {
    std::vector<double> a(g_index.begin() + p.flat_offset, g_index.begin() + p.flat_offset + p.size);
    std::vector<double> b(g_oracle.begin() + p.flat_offset, g_oracle.begin() + p.flat_offset + p.size);
    check_close(a, b, "grad " + p.name);
  }
}

}  // namespace

TEST_CASE("moe index dispatch equals the einsum oracle: top-1", "[moe]") {
  MoeOptions opt = small_moe(RouterKind::Top1, Activation::Relu);
  opt.jitter_eps = 0.05;
  SECTION("no overflow") {
    opt.capacity_factor_train = 4.0;  // C = S
    compare_with_oracle(opt, false);
  }
  SECTION("overflow") {
    opt.capacity_factor_train = 1.0;
    compare_with_oracle(opt, true);
  }
}

TEST_CASE("moe index dispatch equals the einsum oracle: top-2", "[moe]") {
  MoeOptions opt = small_moe(RouterKind::Top2, Activation::Geglu);
  SECTION("no overflow, random routing") {
    opt.capacity_factor_train = 2.0;  // C = S
    compare_with_oracle(opt, false);
  }
  SECTION("overflow, always") {
    opt.second_expert = SecondExpertPolicy::Always;
    opt.capacity_factor_train = 1.0;
    compare_with_oracle(opt, true);
  }
  SECTION("overflow, NTLB, gelu") {
    opt.activation = Activation::Gelu;
    opt.no_token_left_behind = true;
    opt.capacity_factor_train = 0.5;
    compare_with_oracle(opt, true);
  }
}

TEST_CASE("moe index dispatch equals the einsum oracle: expert choice", "[moe]") {
  MoeOptions opt = small_moe(RouterKind::ExpertChoice, Activation::Gelu);
  opt.jitter_eps = 0.05;
  SECTION("C = S / E") { compare_with_oracle(opt, false); }
  SECTION("C = 3 S / (2 E), geglu") {
    opt.activation = Activation::Geglu;
    opt.capacity_factor_train = 1.5;
    compare_with_oracle(opt, false);
  }
}

TEST_CASE("moe index dispatch equals the einsum oracle: sigmoid and softmax_topk gates, top-8 of 16", "[moe]") {
  // DeepSeek-V3's and Mixtral's gates (moe.gate) with the routed scale in the combine weights, over
  // fine-grained experts (16 of width 3, 8 choices per token).
  MoeOptions opt = small_moe(RouterKind::TopK, Activation::Gelu);
  opt.num_experts = 16, opt.d_ff = 3, opt.top_k = 8, opt.routed_scale = 2.5;
  SECTION("sigmoid, overflow") {
    opt.gate = MoeGate::Sigmoid;
    opt.capacity_factor_train = 0.75;
    compare_with_oracle(opt, true);
  }
  SECTION("softmax_topk, no overflow") {
    opt.gate = MoeGate::SoftmaxTopk;
    opt.capacity_factor_train = 2.0;  // C = S
    compare_with_oracle(opt, false);
  }
}

TEST_CASE("moe float layer matches the double layer", "[moe]") {
  // Same parameters (init is computed in double then rounded) and inputs; routing must be identical
  // and y agree within 1e-4 relative (float rounding of O(1) sums of a few dozen terms).
  MoeOptions opt = small_moe(RouterKind::Top2, Activation::Gelu);
  opt.jitter_eps = 0.05;
  opt.expert_dropout = 0.2;
  const int N = 48, M = opt.d_model;
  MoeHarness<double> hd(opt, 5);
  MoeHarness<float> hf(opt, 5);
  StepContext ctx;
  ctx.seed = 3;
  const std::vector<double> x = normal_vector(size_t(N) * M, 21);
  const std::vector<float> xf(x.begin(), x.end());
  std::vector<double> y(x.size());
  std::vector<float> yf(x.size());
  hd.layer->forward(ctx, x.data(), y.data(), N);
  hf.layer->forward(ctx, xf.data(), yf.data(), N);
  CHECK(hd.layer->router.routing().expert == hf.layer->router.routing().expert);
  CHECK(hd.layer->router.routing().slot == hf.layer->router.routing().slot);
  for (size_t i = 0; i < y.size(); ++i) CHECK(std::abs(double(yf[i]) - y[i]) <= 1e-4 * std::max(1.0, std::abs(y[i])));
  CHECK(hf.layer->stats().aux_sum == Approx(hd.layer->stats().aux_sum).epsilon(1e-5));
}
