// Finite differences (double) of the whole MoE layer, router included: gradients w.r.t. x, wg, w_in,
// w_out with capacity drops, top-1 / top-2 (random, always, threshold) / top-3, NTLB, jitter, expert
// dropout, aux and z losses all active. The same StepContext gives the same random numbers, so the
// function is deterministic; the test asserts that no routing decision differs between x+h and x-h.
#include <catch2/catch.hpp>

#include <cmath>

#include "model/activation.hpp"
#include "test_moe_util.hpp"

using namespace meshmoe;
using namespace meshmoe::test;

namespace {

struct FdCase {
  std::string name;
  MoeOptions opt;
  bool training = true;
  std::vector<float> bias = {};  // moe.balance = bias: the router's selection bias during the check
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
  if (!c.bias.empty()) std::copy(c.bias.begin(), c.bias.end(), layer.router.selection_bias.begin());
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
  if (c.opt.capacity_factor_train <= 1.0 && !c.opt.dropless && c.training && !c.opt.expert_choice())
    CHECK(st.dropped + st.rerouted > 0);
  if (c.opt.expert_choice())  // tokens no expert took, and tokens several experts took
    CHECK((st.experts_per_token[0] > 0 && st.experts_per_token[2] + st.experts_per_token[3] > 0));
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

TEST_CASE("moe layer: finite differences, expert choice (jitter, expert dropout, z-loss; eval; shared)", "[moe]") {
  FdCase a{"expert-choice", small_moe(RouterKind::ExpertChoice, Activation::Gelu)};
  a.opt.jitter_eps = 0.1;
  a.opt.expert_dropout = 0.2;
  check_fd(a);
  FdCase b{"expert-choice-eval-geglu", small_moe(RouterKind::ExpertChoice, Activation::Geglu)};
  b.opt.capacity_factor_eval = 0.75;  // C = ceil(8 * 0.75 / 4) = 2
  b.opt.capacity_factor_train = 4.0;  // C = S if it were used: evaluation must take the eval factor
  b.training = false;
  check_fd(b);
  FdCase c{"expert-choice-shared", small_moe(RouterKind::ExpertChoice, Activation::Relu)};
  c.opt.shared_experts = 2;
  c.opt.capacity_factor_train = 0.5;  // C = 1
  check_fd(c);
}

TEST_CASE("moe layer: finite differences, evaluation mode (no randomness, eval capacity)", "[moe]") {
  FdCase c{"eval", small_moe(RouterKind::Top2, Activation::Relu)};
  c.opt.jitter_eps = 0.1;       // ignored in eval
  c.opt.expert_dropout = 0.5;   // ignored in eval
  c.opt.capacity_factor_eval = 0.5;
  c.training = false;
  check_fd(c);
}

TEST_CASE("moe layer: finite differences, shared experts (relu top-1, geglu top-2)", "[moe]") {
  FdCase a{"shared-top1", small_moe(RouterKind::Top1, Activation::Relu)};
  a.opt.shared_experts = 2;
  a.opt.jitter_eps = 0.1;
  a.opt.expert_dropout = 0.2;
  check_fd(a);
  FdCase b{"shared-top2-geglu", small_moe(RouterKind::Top2, Activation::Geglu)};
  b.opt.shared_experts = 3;
  b.opt.second_expert = SecondExpertPolicy::Random;
  check_fd(b);
}

// The claim of moe_layer.hpp: one MLP of hidden width n H is the sum of n experts of width H, expert
// i being hidden units [i H, (i + 1) H) (for geglu its gelu and gate columns of [M, 2, nH]). The
// oracle runs each expert on its own over its slice of the weights and adds them to the output of
// the same layer without shared experts (the router and routed experts initialise by name alike).
TEST_CASE("moe layer: shared experts are n feed-forwards of width H summed into the routed output", "[moe]") {
  for (const Activation act : {Activation::Relu, Activation::Geglu}) {
    INFO("activation " << int(act));
    MoeOptions o = small_moe(RouterKind::Top2, act);
    o.second_expert = SecondExpertPolicy::Always;
    const int n = 3, N = 16, M = o.d_model, H = o.d_ff, nH = n * H, W = act == Activation::Geglu ? 2 : 1;
    MoeHarness<double> plain(o, 11);
    o.shared_experts = n;
    MoeHarness<double> with(o, 11);
    REQUIRE(with.store.infos().size() == plain.store.infos().size() + 2);
    const ParamView<double>& w_in = with.layer->shared->w_in;
    const ParamView<double>& w_out = with.layer->shared->w_out;
    StepContext ctx;
    ctx.seed = 5, ctx.step = 2, ctx.training = true;
    const std::vector<double> x = normal_vector(size_t(N) * M, 3);
    std::vector<double> y_plain(x.size()), y_with(x.size());
    plain.layer->forward(ctx, x.data(), y_plain.data(), N);
    with.layer->forward(ctx, x.data(), y_with.data(), N);
    CHECK(decisions(plain.layer->router.routing()) == decisions(with.layer->router.routing()));
    double max_shared = 0;
    for (int t = 0; t < N; ++t) {
      std::vector<double> sum(size_t(M), 0.0);
      for (int i = 0; i < n; ++i) {
        // expert i alone: pre [1, W H] in its own [2, H] (geglu) or [H] layout, h [1, H]
        std::vector<double> pre(size_t(W) * H, 0.0), h(size_t(H), 0.0);
        for (int part = 0; part < W; ++part)
          for (int j = 0; j < H; ++j)
            for (int m = 0; m < M; ++m)
              pre[size_t(part) * H + j] += x[size_t(t) * M + m] * w_in.w[(size_t(m) * W + part) * nH + size_t(i) * H + j];
        activation_forward(act, pre.data(), h.data(), 1, H);
        for (int j = 0; j < H; ++j)
          for (int m = 0; m < M; ++m) sum[m] += h[j] * w_out.w[(size_t(i) * H + j) * M + m];
      }
      for (int m = 0; m < M; ++m) {
        const size_t k = size_t(t) * M + m;
        CHECK(y_with[k] - y_plain[k] == Approx(sum[m]).margin(1e-12));
        max_shared = std::max(max_shared, std::abs(sum[m]));
      }
    }
    CHECK(max_shared > 0.1);  // the shared experts contribute
  }
}

TEST_CASE("moe layer: finite differences, selection bias (top-2 and NTLB top-1)", "[moe]") {
  // The bias changes which experts are chosen, not the gates' dependence on the probabilities.
  FdCase a{"bias-top2", small_moe(RouterKind::Top2, Activation::Gelu)};
  a.opt.balance = BalanceKind::Bias;
  a.opt.second_expert = SecondExpertPolicy::Random;
  a.opt.shared_experts = 1;
  a.bias = {0.2f, -0.1f, 0.05f, -0.15f};
  check_fd(a);
  FdCase b{"bias-ntlb-top1", small_moe(RouterKind::Top1, Activation::Relu)};
  b.opt.balance = BalanceKind::Bias;
  b.opt.no_token_left_behind = true;
  b.opt.capacity_factor_train = 0.75;
  b.bias = {-0.1f, 0.15f, 0.0f, 0.1f};
  check_fd(b);
}

TEST_CASE("moe layer: finite differences, softmax over the chosen k (top-1 gate 1, top-3 drops, scale)", "[moe]") {
  // moe.gate = softmax_topk (Mixtral section 2.1): top-1's gate is 1, so the router learns only from
  // the aux and z losses; top-3 with drops and shared experts; the routed scale on both.
  FdCase a{"softmax-topk-top1", small_moe(RouterKind::Top1, Activation::Relu)};
  a.opt.gate = MoeGate::SoftmaxTopk;
  a.opt.routed_scale = 2.5;
  a.opt.jitter_eps = 0.1;
  check_fd(a);
  FdCase b{"softmax-topk-top3", small_moe(RouterKind::TopK, Activation::Gelu)};
  b.opt.gate = MoeGate::SoftmaxTopk;
  b.opt.capacity_factor_train = 0.75;
  b.opt.shared_experts = 2;
  b.opt.routed_scale = 0.6;
  check_fd(b);
}

TEST_CASE("moe layer: finite differences, sigmoid gates (selection bias, NTLB, random second, scale)", "[moe]") {
  // moe.gate = sigmoid (DeepSeek-V3 section 2.1.2): the aux loss over s / R enters the check with
  // aux_w, whatever moe.balance says (check_fd passes the weights).
  FdCase a{"sigmoid-top3-bias", small_moe(RouterKind::TopK, Activation::Geglu)};
  a.opt.gate = MoeGate::Sigmoid;
  a.opt.balance = BalanceKind::Bias;
  a.opt.shared_experts = 1;
  a.opt.routed_scale = 2.5;
  a.opt.capacity_factor_train = 0.75;
  a.bias = {0.05f, -0.1f, 0.02f, 0.08f};
  check_fd(a);
  FdCase b{"sigmoid-ntlb-top1", small_moe(RouterKind::Top1, Activation::Relu)};
  b.opt.gate = MoeGate::Sigmoid;
  b.opt.no_token_left_behind = true;
  b.opt.capacity_factor_train = 0.75;
  check_fd(b);
  FdCase c{"sigmoid-top2-random", small_moe(RouterKind::Top2, Activation::Gelu)};
  c.opt.gate = MoeGate::Sigmoid;
  c.opt.second_expert = SecondExpertPolicy::Random;
  c.opt.jitter_eps = 0.05;
  check_fd(c);
}

TEST_CASE("moe layer: finite differences, fine-grained experts (16 of width 3, top-8, 2 shared)", "[moe]") {
  // DeepSeekMoE's fine-grained segmentation (section 3.1) at test size: many narrow experts, k = 8.
  for (const MoeGate gate : {MoeGate::Softmax, MoeGate::SoftmaxUnnormalised, MoeGate::Sigmoid}) {
    FdCase c{"fine-grained-" + std::string(option_name(gate)), small_moe(RouterKind::TopK, Activation::Gelu)};
    c.opt.num_experts = 16;
    c.opt.d_ff = 3;
    c.opt.top_k = 8;
    c.opt.shared_experts = 2;
    c.opt.capacity_factor_train = 0.9;
    c.opt.gate = gate;
    check_fd(c);
  }
}
