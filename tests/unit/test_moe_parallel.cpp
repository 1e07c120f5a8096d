// Expert parallelism: the sharded MoE layer against the single-rank one.
// For every mesh data x tensor of the job's ranks and both expert axes:
//   expert_axis = data   (GShard / Switch all-to-all; with tensor > 1 Switch 5.5 hidden split),
//   expert_axis = tensor (Pipeline-MoE index-select + all-reduce),
// and for each router setting (top-1 with drops, top-2 random, NTLB, dropless, top-2 geglu with
// overflow; jitter and expert dropout on), every rank builds the unsharded MoeLayer<double> with all
// experts and the sharded one with the same seed, feeds the sharded one its part of the same global
// input (data: rank d its block of groups; tensor: all ranks all tokens) and compares forward y, dx,
// and every parameter gradient block with the corresponding slice of the unsharded result.
// Gradients of parameters not split over data are summed over the data ranks first (what the
// trainer does). Tolerance: |sharded - single| <= 1e-12 * max(1, |single|) (double; only the
// summation order of the tensor all-reduce differs).
// Also: the loads summed over data equal the unsharded loads, and every row the all-to-all (or the
// index selection) delivered to an expert is exactly the global input row of the token it names,
// with as many filled rows per expert as the unsharded load.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "../test_util.hpp"
#include "../support/model_support.hpp"
#include "mesh/mesh.hpp"
#include "test_moe_util.hpp"

using namespace meshmoe;
using namespace meshmoe::test;

namespace {

constexpr double kTol = 1e-12;  // relative, double

struct Case {
  std::string name;
  MoeOptions opt;
};

// M=6, E=8, H=8, S=16: E and H divisible by 1, 2 and 4 ranks.
MoeOptions par_moe(RouterKind router, Activation act = Activation::Relu) {
  MoeOptions o = small_moe(router, act);
  o.num_experts = 8;
  o.d_ff = 8;
  o.group_size = 16;
  o.jitter_eps = 0.1;
  o.expert_dropout = 0.25;
  return o;
}

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"top1-drops", par_moe(RouterKind::Top1)});
  Case t2{"top2-random", par_moe(RouterKind::Top2, Activation::Gelu)};
  t2.opt.second_expert = SecondExpertPolicy::Random;
  t2.opt.capacity_factor_train = 1.0;
  c.push_back(t2);
  Case ntlb{"ntlb-top1", par_moe(RouterKind::Top1)};
  ntlb.opt.no_token_left_behind = true;
  ntlb.opt.capacity_factor_train = 0.75;
  c.push_back(ntlb);
  Case dl{"dropless-top2", par_moe(RouterKind::Top2, Activation::Geglu)};
  dl.opt.dropless = true;
  c.push_back(dl);
  Case gg{"top2-always-geglu-overflow", par_moe(RouterKind::Top2, Activation::Geglu)};
  gg.opt.second_expert = SecondExpertPolicy::Always;
  gg.opt.capacity_factor_train = 0.75;
  c.push_back(gg);
  Case sh{"shared-top2-geglu", par_moe(RouterKind::Top2, Activation::Geglu)};  // hidden 2 x 8 over tensor
  sh.opt.shared_experts = 2;
  sh.opt.second_expert = SecondExpertPolicy::Random;
  c.push_back(sh);
  // Expert choice: C = ceil(16 * 1.5 / 8) = 3 tokens per expert and group; a token gets 0..E experts.
  Case ec{"expert-choice-gelu", par_moe(RouterKind::ExpertChoice, Activation::Gelu)};
  ec.opt.capacity_factor_train = 1.5;
  c.push_back(ec);
  Case ecs{"expert-choice-shared-geglu", par_moe(RouterKind::ExpertChoice, Activation::Geglu)};
  ecs.opt.shared_experts = 2;
  c.push_back(ecs);
  return c;
}

int count_bad(const double* got, const double* want, size_t n, double& worst) {
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double err = std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i]));
    worst = std::max(worst, err);
    bad += !(err <= kTol);
  }
  return bad;
}

// The unsharded layer on the whole global batch.
struct Reference {
  MoeHarness<double> hs;
  std::vector<double> y, dx, grads;
  Reference(const MoeOptions& opt, const StepContext& ctx, const std::vector<double>& x, const std::vector<double>& dy,
            int N, double aux_w, double z_w)
      : hs(opt, 17) {
    y.resize(x.size());
    dx.assign(x.size(), 0.0);
    hs.layer->forward(ctx, x.data(), y.data(), N);
    hs.store.zero_grad();
    hs.layer->backward(ctx, dy.data(), dx.data(), N, aux_w, z_w);
    grads.assign(hs.store.grads(), hs.store.grads() + hs.store.size());
  }
};

void check_mode(const Case& c, ExpertAxis axis, int D, int Tn) {
  const int W = world_size();
  REQUIRE(D * Tn == W);
  const MoeOptions& opt = c.opt;
  const int M = opt.d_model, E = opt.num_experts, S = opt.group_size;
  const int G = 4 * 2;  // global groups: divisible by D = 1, 2, 4 (D = 4: two groups per rank)
  const int N = G * S;
  Mesh mesh(MPI_COMM_WORLD, 1, D, Tn);
  const int d = mesh.coord(Axis::Data), t = mesh.coord(Axis::Tensor);
  const std::string mode = axis == ExpertAxis::Data ? "data" : "tensor";
  INFO("case " << c.name << ", expert_axis = " << mode << ", mesh data=" << D << " x tensor=" << Tn << ", rank d="
               << d << " t=" << t);

  StepContext ctx;
  ctx.seed = 41;
  ctx.step = 3;
  ctx.training = true;
  ctx.token_offset = 512;
  const std::vector<double> x = normal_vector(size_t(N) * M, 31), dy = normal_vector(size_t(N) * M, 32);
  const double aux_w = 0.3, z_w = 0.02;
  Reference ref(opt, ctx, x, dy, N, aux_w, z_w);
  const MoeStats& rs = ref.hs.layer->stats();
  // The case exercises what it claims to (a test that can fail).
  if (!opt.dropless && opt.capacity_factor_train <= 1.0 && !opt.expert_choice()) CHECK(rs.dropped + rs.rerouted > 0);
  if (opt.expert_choice()) CHECK((rs.experts_per_token[0] > 0 && rs.experts_per_token[2] + rs.experts_per_token[3] > 0));
  if (opt.dropless) CHECK(rs.dropped == 0);
  if (opt.no_token_left_behind) CHECK(rs.rerouted > 0);

  // This rank's tokens: data mode rank d holds groups [d*G/D, (d+1)*G/D); tensor ranks of one data
  // rank hold the same tokens (both modes: the tokens are split over data only).
  const int Nl = N / D, n0 = d * Nl;
  StepContext lctx = ctx;
  lctx.token_offset = ctx.token_offset + uint64_t(n0);
  PhaseTimers timers;
  lctx.timers = &timers;
  ParamStore<double> store;
  MoeLayer<double> layer(opt, layer_placement(mesh, axis));
  layer.declare(store, "moe");
  store.allocate();
  store.init(17, 1.0);

  const std::vector<double> xl(x.begin() + size_t(n0) * M, x.begin() + size_t(n0 + Nl) * M);
  const std::vector<double> dyl(dy.begin() + size_t(n0) * M, dy.begin() + size_t(n0 + Nl) * M);
  std::vector<double> y(xl.size()), dx(xl.size(), 0.0);
  layer.forward(lctx, xl.data(), y.data(), Nl);
  store.zero_grad();
  layer.backward(lctx, dyl.data(), dx.data(), Nl, aux_w, z_w);

  double yworst = 0, dxworst = 0;
  const int ybad = count_bad(y.data(), ref.y.data() + size_t(n0) * M, y.size(), yworst);
  const int dxbad = count_bad(dx.data(), ref.dx.data() + size_t(n0) * M, dx.size(), dxworst);
  INFO("y worst relative error " << yworst << ", dx " << dxworst);
  CHECK(ybad == 0);
  CHECK(dxbad == 0);

  // Parameters: same values (init by logical index), gradients equal to the slice; a parameter not
  // split over data is summed over the data ranks first, as the trainer does.
  for (const ParamInfo& p : store.infos()) {
    INFO("parameter " << p.name);
    const ParamInfo* rp = test::find_param(ref.hs.store, p.name);
    REQUIRE(rp != nullptr);
    CHECK(rp->logical_shape == p.logical_shape);
    const bool experts = p.name.find("experts") != std::string::npos;
    uint8_t want_shard = kShardNone;
    if (experts && axis == ExpertAxis::Data && D > 1) want_shard |= kShardData;
    if (experts && Tn > 1) want_shard |= kShardTensor;
    // shared experts: hidden units over tensor on either expert axis, replicated over data
    if (p.name.find(".shared.") != std::string::npos && Tn > 1) want_shard |= kShardTensor;
    CHECK(int(p.sharded_over) == int(want_shard));
    std::vector<double> g(store.grads() + p.flat_offset, store.grads() + p.flat_offset + p.size);
    if (!(p.sharded_over & kShardData)) mesh.axis(Axis::Data).all_reduce(g.data(), g.size());
    std::vector<double> gw(p.size), ww(p.size);
    for (size_t i = 0; i < p.size; ++i) {
      const uint64_t li = test::logical_index(p, i);
      gw[i] = ref.grads[rp->flat_offset + li];
      ww[i] = ref.hs.store.weights()[rp->flat_offset + li];
    }
    double wworst = 0, gworst = 0;
    const int wbad = count_bad(store.weights() + p.flat_offset, ww.data(), p.size, wworst);
    const int gbad = count_bad(g.data(), gw.data(), p.size, gworst);
    INFO("weights worst relative error " << wworst << ", grad " << gworst);
    CHECK(wbad == 0);
    CHECK(gbad == 0);
  }

  // Statistics: this rank's tokens over all E experts; summed over data = the unsharded counts.
  const MoeStats& st = layer.stats();
  std::vector<int64_t> load = st.load;
  REQUIRE(int(load.size()) == E);
  int64_t counts[3] = {st.dropped, st.rerouted, st.wanted};
  std::vector<int64_t> per_token = st.experts_per_token;
  mesh.axis(Axis::Data).all_reduce(load.data(), load.size());
  mesh.axis(Axis::Data).all_reduce(counts, 3);
  mesh.axis(Axis::Data).all_reduce(per_token.data(), per_token.size());
  CHECK(load == rs.load);
  CHECK(per_token == rs.experts_per_token);
  CHECK(counts[0] == rs.dropped);
  CHECK(counts[1] == rs.rerouted);
  CHECK(counts[2] == rs.wanted);

  // What reached the local experts: every filled row is the input row of the token it names, every
  // empty row is zero, and each local expert got as many rows as its global load.
  CHECK(layer.dispatcher.name() == (axis == ExpertAxis::Data ? (D > 1 ? "all-to-all" : "local")
                                                               : (Tn > 1 ? "index-select" : "local")));
  const auto& xin = layer.experts.input();
  const auto& tok = layer.dispatcher.expert_row_token();
  REQUIRE(xin.size() == tok.size() * size_t(M));
  const int e0 = layer.experts.e0(), El = layer.experts.e_local();
  CHECK(El == (axis == ExpertAxis::Data ? E / D : E / Tn));
  const std::vector<int>& rows_per_expert = layer.dispatcher.expert_rows();
  REQUIRE(int(rows_per_expert.size()) == El);
  // Tensor mode: only this data rank's tokens reach the experts; data mode: every data rank's.
  std::vector<int64_t> want_load(rs.load.begin() + e0, rs.load.begin() + e0 + El);
  if (axis == ExpertAxis::Tensor)
    want_load.assign(st.load.begin() + e0, st.load.begin() + e0 + El);
  size_t row = 0;
  int wrong_rows = 0;
  for (int el = 0; el < El; ++el) {
    int64_t filled = 0;
    for (int r = 0; r < rows_per_expert[el]; ++r, ++row) {
      const double* v = &xin[row * M];
      const int64_t g = tok[row];
      if (g < 0) {
        for (int m = 0; m < M; ++m) wrong_rows += v[m] != 0.0;
        continue;
      }
      ++filled;
      const int64_t n = g - int64_t(ctx.token_offset);
      if (n < 0 || n >= N) {
        ++wrong_rows;
        continue;
      }
      for (int m = 0; m < M; ++m) wrong_rows += v[m] != x[size_t(n) * M + m];
    }
    CHECK(filled == want_load[el]);
  }
  CHECK(row == tok.size());
  CHECK(wrong_rows == 0);

  // The stages are timed, and the communication inside them.
  for (const char* ph : {"gate", "dispatch", "expert", "combine"}) CHECK(timers.totals().count(ph) == 1);
  if (axis == ExpertAxis::Data && D > 1) CHECK(timers.totals().count("moe_alltoall") == 1);
  if (Tn > 1) CHECK(timers.totals().count("moe_allreduce") == 1);

  // Every loop body writes only what its index owns (tensor/launch.hpp), also around the
  // all-to-all and index-select paths: the same step with the host loops run backwards is bitwise
  // the same.
  const std::vector<double> grads(store.grads(), store.grads() + store.size());
  std::vector<double> y_rev(xl.size()), dx_rev(xl.size(), 0.0);
  {
    HostLoopsReversed reversed;
    layer.forward(lctx, xl.data(), y_rev.data(), Nl);
    store.zero_grad();
    layer.backward(lctx, dyl.data(), dx_rev.data(), Nl, aux_w, z_w);
  }
  CHECK(y_rev == y);
  CHECK(dx_rev == dx);
  CHECK(std::equal(grads.begin(), grads.end(), store.grads()));
}

// Runs check_mode for every case on every data x tensor split of the job's ranks that the layer
// allows: E = H = 8 and the G = 8 groups must divide over the axes, so an axis of 3 (or 6) ranks
// cannot be used. Such splits are skipped with a warning (a 3-rank job skips them all).
void check_meshes(ExpertAxis axis) {
  const int W = world_size();
  for (int D = 1; D <= W; ++D) {
    if (W % D != 0) continue;
    const int Tn = W / D;
    if (8 % D != 0 || 8 % Tn != 0) {
      WARN("mesh data=" << D << " x tensor=" << Tn << " skipped: E = H = 8 experts, hidden units and groups "
                        << "do not divide over it");
      continue;
    }
    for (const Case& c : cases()) check_mode(c, axis, D, Tn);
  }
}

}  // namespace

TEST_CASE("moe expert parallelism over data (all-to-all; Switch 5.5 with tensor > 1) equals one rank", "[moe][mpi]") {
  check_meshes(ExpertAxis::Data);
}

TEST_CASE("moe expert parallelism over tensor (Pipeline-MoE index-select + all-reduce) equals one rank",
          "[moe][mpi]") {
  check_meshes(ExpertAxis::Tensor);
}

TEST_CASE("moe placement rejects experts that do not divide over the axis", "[moe]") {
  MoeOptions o = par_moe(RouterKind::Top2);
  o.num_experts = 6;
  Placement p;
  p.expert_axis = ExpertAxis::Tensor;
  p.tensor_size = 4;
  CHECK_THROWS_AS(p.validate_experts(o.num_experts, o.d_ff), InputError);
  p.expert_axis = ExpertAxis::Data;
  p.tensor_size = 3;  // hidden split: d_ff = 8 over 3
  CHECK_THROWS_AS(p.validate_experts(8, o.d_ff), InputError);
}

// Dropless routing against capacity routing with capacity_factor = E / k, which has C = S as well:
// the two route identically, give the experts only the filled slots (the compact layout,
// dispatcher.hpp) and must agree in y, dx and every gradient (tolerance 1e-12 relative, double).
TEST_CASE("moe dropless equals capacity routing with C = S, filled slots only", "[moe]") {
  for (RouterKind rk : {RouterKind::Top1, RouterKind::Top2}) {
    MoeOptions full = par_moe(rk, Activation::Geglu);
    full.capacity_factor_train = double(full.num_experts) / full.k();
    MoeOptions dl = full;
    dl.dropless = true;
    REQUIRE(full.capacity(true) == full.group_size);
    const int N = 4 * full.group_size, M = full.d_model;
    StepContext ctx;
    ctx.seed = 5;
    ctx.step = 9;
    ctx.token_offset = 64;
    const std::vector<double> x = normal_vector(size_t(N) * M, 51), dy = normal_vector(size_t(N) * M, 52);
    Reference a(full, ctx, x, dy, N, 0.2, 0.01), b(dl, ctx, x, dy, N, 0.2, 0.01);
    int64_t kept = 0;
    for (int64_t l : b.hs.layer->stats().load) kept += l;
    CHECK(kept < int64_t(full.num_experts) * N);           // fewer than the E * G * S slots
    CHECK(a.hs.layer->dispatcher.permutation().rows() == size_t(kept));  // only the filled slots
    CHECK(b.hs.layer->dispatcher.permutation().rows() == size_t(kept));
    double worst = 0;
    CHECK(count_bad(b.y.data(), a.y.data(), a.y.size(), worst) == 0);
    CHECK(count_bad(b.dx.data(), a.dx.data(), a.dx.size(), worst) == 0);
    CHECK(count_bad(b.grads.data(), a.grads.data(), a.grads.size(), worst) == 0);
    INFO("worst relative error " << worst);
    CHECK(worst <= kTol);
  }
}
