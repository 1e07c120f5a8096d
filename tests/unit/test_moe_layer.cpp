// Finite differences (double) of the whole MoE layer, router included: gradients w.r.t. x, wg, w_in,
// w_out with capacity drops, top-1 / top-2 (random, always, threshold) / top-3, NTLB, jitter, expert
// dropout, aux and z losses all active. The same StepContext gives the same random numbers, so the
// function is deterministic; the test asserts that no routing decision differs between x+h and x-h.
#include <catch2/catch.hpp>

#include <cmath>

#include "test_moe_util.hpp"

using namespace meshmoe;
using namespace meshmoe::test;

namespace {

struct FdCase {
  std::string name;
  MoeOptions opt;
  bool training = true;
};

// L = sum(r * y) + aux_w * aux_sum + z_w * z_sum
double layer_loss(MoeLayer<double>& layer, const StepContext& ctx, const std::vector<double>& x,
                  const std::vector<double>& r, int N, double aux_w, double z_w, std::vector<int>* dec) {
  std::vector<double> y(x.size());
  layer.forward(ctx, x.data(), y.data(), N);
  double L = 0;
  for (size_t i = 0; i < y.size(); ++i) L += r[i] * y[i];
  L += aux_w * layer.stats().aux_sum + z_w * layer.stats().z_sum;
  if (dec) *dec = decisions(layer.router.routing());
  return L;
}

void check_fd(const FdCase& c) {
  INFO("case " << c.name);
  const int N = 32, M = c.opt.d_model;
  MoeHarness<double> hs(c.opt, 11);
  MoeLayer<double>& layer = *hs.layer;
  StepContext ctx;
  ctx.seed = 99;
  ctx.step = 5;
  ctx.training = c.training;
  ctx.token_offset = 64;
  std::vector<double> x = normal_vector(size_t(N) * M, 1);
  const std::vector<double> r = normal_vector(size_t(N) * M, 2);
  const double aux_w = 0.37, z_w = 0.011;

  // Analytic gradients.
  std::vector<int> dec0;
  layer_loss(layer, ctx, x, r, N, aux_w, z_w, &dec0);
  const MoeStats st = layer.stats();
  std::vector<double> dx(x.size(), 0.0);
  hs.store.zero_grad();
  layer.backward(ctx, r.data(), dx.data(), N, aux_w, z_w);
  const std::vector<double> grads(hs.store.grads(), hs.store.grads() + hs.store.size());

  // The case must exercise what it claims to (a test that can fail).
  if (c.opt.capacity_factor_train <= 1.0 && !c.opt.dropless && c.training) CHECK(st.dropped + st.rerouted > 0);
  if (c.opt.no_token_left_behind) CHECK(st.rerouted > 0);
  if (c.opt.router == RouterKind::Top2 && c.opt.second_expert != SecondExpertPolicy::Always && c.training)
    CHECK(st.declined > 0);

  // Central differences, h = 1e-6; tolerance |analytic - numeric| <= 1e-6 * max(1, |numeric|).
  const double h = 1e-6, tol = 1e-6;
  int checked = 0, flips = 0;
  auto fd = [&](double& v, double analytic, const std::string& what) {
    const double keep = v;
    std::vector<int> dp, dm;
    v = keep + h;
    const double Lp = layer_loss(layer, ctx, x, r, N, aux_w, z_w, &dp);
    v = keep - h;
    const double Lm = layer_loss(layer, ctx, x, r, N, aux_w, z_w, &dm);
    v = keep;
    const bool same = dp == dec0 && dm == dec0;
    if (!same) ++flips;
    REQUIRE(same);  // no routing decision flipped: the FD is of a smooth function
    const double numeric = (Lp - Lm) / (2 * h);
    if (std::abs(analytic - numeric) > tol * std::max(1.0, std::abs(numeric)))
      FAIL_CHECK(what << ": analytic " << analytic << " numeric " << numeric);
    ++checked;
  };
  for (size_t i = 0; i < x.size(); ++i) fd(x[i], dx[i], "x[" + std::to_string(i) + "]");
  for (const ParamInfo& p : hs.store.infos())
    for (size_t i = 0; i < p.size; ++i)
      fd(hs.store.weights()[p.flat_offset + i], grads[p.flat_offset + i], p.name + "[" + std::to_string(i) + "]");
  CHECK(flips == 0);
  CHECK(checked == int(x.size() + hs.store.size()));
}

}  // namespace

TEST_CASE("moe layer: finite differences, top-1 with drops, jitter, expert dropout", "[moe]") {
  FdCase c{"top1", small_moe(RouterKind::Top1, Activation::Relu)};
  c.opt.jitter_eps = 0.1;
  c.opt.expert_dropout = 0.3;
  check_fd(c);
}

TEST_CASE("moe layer: finite differences, top-2 random routing, gelu", "[moe]") {
  FdCase c{"top2-random", small_moe(RouterKind::Top2, Activation::Gelu)};
  c.opt.second_expert = SecondExpertPolicy::Random;
  c.opt.jitter_eps = 0.05;
  c.opt.expert_dropout = 0.2;
  check_fd(c);
}

TEST_CASE("moe layer: finite differences, top-2 always, geglu, overflow", "[moe]") {
  FdCase c{"top2-always", small_moe(RouterKind::Top2, Activation::Geglu)};
  c.opt.second_expert = SecondExpertPolicy::Always;
  c.opt.capacity_factor_train = 0.75;
  c.opt.expert_dropout = 0.1;
  check_fd(c);
}

TEST_CASE("moe layer: finite differences, top-2 always, GShard's aux-loss form", "[moe]") {
  FdCase c{"top2-gshard-aux", small_moe(RouterKind::Top2, Activation::Relu)};
  c.opt.second_expert = SecondExpertPolicy::Always;
  c.opt.aux_loss_form = AuxLossForm::Gshard;
  check_fd(c);
}

TEST_CASE("moe layer: finite differences, top-3", "[moe]") {
  FdCase c{"top3", small_moe(RouterKind::TopK, Activation::Gelu)};
  c.opt.jitter_eps = 0.1;
  check_fd(c);
}

TEST_CASE("moe layer: finite differences, No-Token-Left-Behind (top-1 and top-2 threshold)", "[moe]") {
  FdCase a{"ntlb-top1", small_moe(RouterKind::Top1, Activation::Relu)};
  a.opt.no_token_left_behind = true;
  a.opt.capacity_factor_train = 0.75;
  a.opt.jitter_eps = 0.1;
  a.opt.expert_dropout = 0.2;
  check_fd(a);
  FdCase b{"ntlb-top2-threshold", small_moe(RouterKind::Top2, Activation::Gelu)};
  b.opt.no_token_left_behind = true;
  b.opt.second_expert = SecondExpertPolicy::Threshold;
  b.opt.second_expert_threshold = 0.3;
  b.opt.capacity_factor_train = 0.75;
  check_fd(b);
}

TEST_CASE("moe layer: finite differences, evaluation mode (no randomness, eval capacity)", "[moe]") {
  FdCase c{"eval", small_moe(RouterKind::Top2, Activation::Relu)};
  c.opt.jitter_eps = 0.1;       // ignored in eval
  c.opt.expert_dropout = 0.5;   // ignored in eval
  c.opt.capacity_factor_eval = 0.5;
  c.training = false;
  check_fd(c);
}
