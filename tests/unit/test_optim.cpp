// Optimizers, learning-rate schedules and gradient clipping (src/train/).
// Oracles: hand-computed values; independent double-precision implementations of the papers'
// formulas (Adafactor in the row-*sum* form of Shazeer & Stern Alg. 4, where the code uses means);
// the unsharded optimizer for sharded blocks ([mpi]); PyTorch (hidden case [optim-torch], driven by
// tests/scripts/optim_vs_torch.sh with tests/reference/optim_reference.py).
#include <hdf5.h>
#include <mpi.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../test_util.hpp"
#include "../support/model_support.hpp"
#include "../support/optim_support.hpp"
#include "core/error.hpp"
#include "tensor/launch.hpp"
#include "optim/adafactor.hpp"
#include "optim/adamw.hpp"
#include "optim/grad_clip.hpp"
#include "optim/optimizer.hpp"
#include "optim/optimizer_bodies.hpp"
#include "optim/schedule.hpp"
#include "tensor/bf16.hpp"

using namespace meshmoe;

namespace {

Config schedule_cfg(const std::string& kind, double lr, int64_t warmup, int64_t steps, double min_ratio = 0.1) {
  Config c;
  c.optim.schedule = test::option<ScheduleKind>(kind);
  c.optim.lr = lr;
  c.optim.warmup_steps = warmup;
  c.run.steps = steps;
  c.optim.min_lr_ratio = min_ratio;
  return c;
}

// Quadratic f(x) = 0.5 * sum_i a_i (x_i - c_i)^2 over every element of a store, with a_i, c_i and
// the start x_i fixed functions of the element's flat index: g_i = a_i (x_i - c_i).
double quad_a(size_t i) { return 0.5 + 0.25 * double(i % 7); }
double quad_c(size_t i) { return std::sin(0.7 * double(i) + 0.3); }
double quad_x0(size_t i) { return std::cos(1.3 * double(i)); }

void set_quadratic_grads(ParamStore<float>& s) {
  for (size_t i = 0; i < s.size(); ++i) s.grads()[i] = float(quad_a(i) * (double(s.weights()[i]) - quad_c(i)));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST_CASE("schedule: warm-up then constant / rsqrt / cosine at hand-computed points", "[optim][schedule]") {
  // lr 2, warm-up 4 steps, run 12 steps: warm-up gives 0.5, 1, 1.5, 2 at t = 1..4.
  for (const char* kind : {"constant", "rsqrt", "cosine"}) {
    const Schedule s = Schedule::from_config(schedule_cfg(kind, 2.0, 4, 12));
    CHECK(s(1) == Approx(0.5).epsilon(1e-15));
    CHECK(s(2) == Approx(1.0).epsilon(1e-15));
    CHECK(s(3) == Approx(1.5).epsilon(1e-15));
    CHECK(s(4) == Approx(2.0).epsilon(1e-15));
    CHECK_THROWS_AS(s(0), std::logic_error);
  }
  const Schedule c = Schedule::from_config(schedule_cfg("constant", 2.0, 4, 12));
  CHECK(c(5) == 2.0);
  CHECK(c(1000) == 2.0);
  const Schedule r = Schedule::from_config(schedule_cfg("rsqrt", 2.0, 4, 12));
  CHECK(r(16) == Approx(1.0).epsilon(1e-15));       // 2 * sqrt(4/16)
  CHECK(r(100) == Approx(0.4).epsilon(1e-15));      // 2 * sqrt(4/100)
  const Schedule k = Schedule::from_config(schedule_cfg("cosine", 2.0, 4, 12, 0.1));
  CHECK(k(8) == Approx(1.1).epsilon(1e-14));        // p = 1/2: 0.2 + 1.8 * 0.5
  CHECK(k(6) == Approx(0.2 + 1.8 * 0.5 * (1 + std::sqrt(0.5))).epsilon(1e-14));  // p = 1/4
  CHECK(k(12) == Approx(0.2).epsilon(1e-14));       // min_lr_ratio * lr at run.steps
  CHECK(k(40) == Approx(0.2).epsilon(1e-14));       // stays there
  // No warm-up: full lr at t = 1; rsqrt decays as lr / sqrt(t).
  CHECK(Schedule::from_config(schedule_cfg("constant", 3.0, 0, 10))(1) == 3.0);
  CHECK(Schedule::from_config(schedule_cfg("rsqrt", 3.0, 0, 10))(9) == Approx(1.0).epsilon(1e-15));
  CHECK(Schedule::from_config(schedule_cfg("cosine", 3.0, 0, 10, 0.0))(5) == Approx(1.5).epsilon(1e-14));
  // run.steps <= warm-up: cosine is at its floor after warm-up.
  CHECK(Schedule::from_config(schedule_cfg("cosine", 1.0, 10, 5, 0.5))(11) == Approx(0.5).epsilon(1e-15));
}

// Names that are no schedule or optimizer are refused where the deck is read (test_deck.cpp,
// "deck: option keys").
TEST_CASE("schedule and optimizer: built from the deck's choice", "[optim][schedule]") {
  CHECK(Schedule::from_config(schedule_cfg("cosine", 1.0, 0, 10)).kind == ScheduleKind::Cosine);
  ParamStore<float> s;
  s.add("w", {2}, InitKind::Zeros, 1, nullptr);
  s.allocate();
  Config c;
  CHECK(dynamic_cast<AdamW*>(make_optimizer(c, s).get()) != nullptr);
  c.optim.name = OptimizerKind::Adafactor;
  CHECK(dynamic_cast<Adafactor*>(make_optimizer(c, s).get()) != nullptr);
}

// ---------------------------------------------------------------------------------------------
TEST_CASE("grad clip: global norm from partial sums, torch's scale", "[optim][clip]") {
  ParamStore<float> s;
  s.add("a", {2}, InitKind::Zeros, 1, nullptr);
  s.add("b", {1, 2}, InitKind::Zeros, 1, nullptr);
  s.allocate();
  const float g[] = {3, 0, 4, 12};  // norm sqrt(9 + 16 + 144) = 13
  std::copy(g, g + 4, s.grads());
  // A rank owning only "a" and one owning only "b": the partial sums add up to the total.
  CHECK(test::grad_sum_squares(s, {0}) == 9.0);
  CHECK(test::grad_sum_squares(s, {1}) == 160.0);
  CHECK(test::grad_sum_squares(s) == 169.0);
  const double norm = std::sqrt(test::grad_sum_squares(s, {0}) + test::grad_sum_squares(s, {1}));
  CHECK(clip_scale(norm, 1.0) == 1.0 / (13.0 + 1e-6));
  CHECK(clip_scale(norm, 13.0) == 13.0 / (13.0 + 1e-6));  // the 1e-6 makes it scale slightly
  CHECK(clip_scale(norm, 20.0) == 1.0);
  CHECK(clip_scale(norm, 0.0) == 1.0);                     // disabled
  CHECK(clip_scale(0.0, 1.0) == 1.0);
  CHECK(std::isnan(clip_scale(std::nan(""), 1.0)));
  CHECK(std::isnan(clip_scale(INFINITY, 1.0)));
  CHECK(test::whole_entries(s) == std::vector<size_t>{0, 1});
  CHECK(test::split_entries(s).empty());
  scale_grads(s, {1}, 0.5);
  CHECK(s.grads()[0] == 3.0f);
  CHECK(s.grads()[3] == 6.0f);
  scale_grads(s, clip_scale(std::sqrt(test::grad_sum_squares(s)), 1.0));
  CHECK(std::sqrt(test::grad_sum_squares(s)) == Approx(1.0).epsilon(2e-6));  // fp32 grads: ~10 ulps
}

TEST_CASE("optimizers: the clipping factor given to step() is bitwise scaling the gradients first",
          "[optim][clip]") {
  for (const bool adafactor : {false, true}) {
    INFO((adafactor ? "adafactor" : "adamw"));
    std::mt19937 gen(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    ParamStore<float> fused, scaled;
    for (ParamStore<float>* s : {&fused, &scaled}) {
      s->add("w", {6, 10}, InitKind::Zeros, 1, nullptr);
      s->add("b", {10}, InitKind::Zeros, 1, nullptr).no_weight_decay = true;
      s->allocate();
    }
    for (size_t i = 0; i < fused.size(); ++i) fused.weights()[i] = scaled.weights()[i] = normal(gen);
    auto make = [&](ParamStore<float>& s) -> std::unique_ptr<Optimizer> {
      if (adafactor) return std::make_unique<Adafactor>(s, all_entries(s), AdafactorOptions{0.8, 1e-30, 1.0});
      return std::make_unique<AdamW>(s, all_entries(s), AdamWOptions{0.9, 0.95, 1e-8, 0.1});
    };
    auto opt_fused = make(fused), opt_scaled = make(scaled);
    for (int64_t t = 1; t <= 4; ++t) {
      for (size_t i = 0; i < fused.size(); ++i) fused.grads()[i] = scaled.grads()[i] = 3.0f * normal(gen);
      const double scale = t == 3 ? 1.0 : clip_scale(std::sqrt(test::grad_sum_squares(fused)), 1.0);
      REQUIRE((t == 3 || scale < 0.5));  // clipping is active on the other steps
      scale_grads(scaled, scale);
      opt_scaled->step(scaled, 0.01, t);
      opt_fused->step(fused, 0.01, t, scale);
    }
    CHECK(std::equal(fused.weights(), fused.weights() + fused.size(), scaled.weights()));
    const auto a = opt_fused->state(), b = opt_scaled->state();
    REQUIRE(a.size() == b.size());
    for (size_t k = 0; k < a.size(); ++k) CHECK(*a[k].data == *b[k].data);
  }
}

// ---------------------------------------------------------------------------------------------
TEST_CASE("adamw: first step by hand, weight decay only where allowed", "[optim][adamw]") {
  ParamStore<float> s;
  s.add("w", {1}, InitKind::Zeros, 1, nullptr);
  s.add("b", {1}, InitKind::Zeros, 1, nullptr).no_weight_decay = true;
  s.add("z", {1}, InitKind::Zeros, 1, nullptr);
  s.allocate();
  for (int i = 0; i < 3; ++i) s.weights()[i] = 1.0f;
  s.grads()[0] = 2.0f;  // f = x^2 at x = 1
  s.grads()[1] = 2.0f;
  s.grads()[2] = 0.0f;  // no gradient: only the decay moves it
  AdamW opt(s, all_entries(s), AdamWOptions{0.9, 0.95, 1e-8, 0.1});
  opt.step(s, 0.1, 1);
  // m^ = 2, v^ = 4: x <- x (1 - 0.1 * 0.1) - 0.1 * 2 / (2 + 1e-8)
  CHECK(s.weights()[0] == Approx(0.99 - 0.1 * 2 / (2 + 1e-8)).epsilon(1e-7));
  CHECK(s.weights()[1] == Approx(1.0 - 0.1 * 2 / (2 + 1e-8)).epsilon(1e-7));
  CHECK(s.weights()[2] == Approx(0.99).epsilon(1e-7));
  // State: exp_avg = 0.1 g, exp_avg_sq = 0.05 g^2, named per parameter.
  const auto st = opt.state();
  REQUIRE(st.size() == 6);
  CHECK(st[0].name == "w/exp_avg");
  CHECK(st[1].name == "w/exp_avg_sq");
  CHECK((*st[0].data)[0] == Approx(0.2).epsilon(1e-7));
  CHECK((*st[1].data)[0] == Approx(0.2).epsilon(1e-7));
}

TEST_CASE("adamw: 5 steps on a quadratic against a double oracle; owned subset", "[optim][adamw]") {
  ParamStore<float> s;
  s.add("w", {3, 4}, InitKind::Zeros, 1, nullptr);
  s.add("b", {4}, InitKind::Zeros, 1, nullptr).no_weight_decay = true;
  s.add("e", {2, 3, 2}, InitKind::Zeros, 1, nullptr);
  s.allocate();
  for (size_t i = 0; i < s.size(); ++i) s.weights()[i] = float(quad_x0(i));
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.05;
  const Schedule sched = Schedule::from_config(schedule_cfg("cosine", 0.05, 2, 5));
  // The optimizer owns "w" and "e" only: "b" must stay untouched.
  AdamW opt(s, {0, 2}, AdamWOptions{b1, b2, eps, wd});
  std::vector<double> x(s.size()), m(s.size(), 0.0), v(s.size(), 0.0);
  for (size_t i = 0; i < s.size(); ++i) x[i] = double(s.weights()[i]);
  const ParamInfo& bias = s.infos()[1];
  for (int64_t t = 1; t <= 5; ++t) {
    set_quadratic_grads(s);
    const double lr = sched(t);
    for (size_t i = 0; i < s.size(); ++i) {
      if (i >= bias.flat_offset && i < bias.flat_offset + bias.size) continue;
      const double g = double(s.grads()[i]);  // the same fp32 gradient both sides
      x[i] -= lr * wd * x[i];                  // Loshchilov & Hutter Alg. 2, decoupled decay
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double mhat = m[i] / (1 - std::pow(b1, t)), vhat = v[i] / (1 - std::pow(b2, t));
      x[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
    opt.step(s, lr, t);
  }
  // fp32 vs double over 5 steps, |x| <= ~1.5: 1e-6 absolute is ~10 fp32 ulps.
  for (size_t i = 0; i < s.size(); ++i) {
    INFO("element " << i);
    CHECK(double(s.weights()[i]) == Approx(x[i]).margin(1e-6).epsilon(0));
  }
  for (size_t i = bias.flat_offset; i < bias.flat_offset + bias.size; ++i) CHECK(s.weights()[i] == float(quad_x0(i)));
}

// ---------------------------------------------------------------------------------------------
TEST_CASE("adafactor: first step by hand (factored 2x2, update clipping, vector)", "[optim][adafactor]") {
  ParamStore<float> s;
  s.add("w", {2, 2}, InitKind::Zeros, 1, nullptr);
  s.add("b", {3}, InitKind::Zeros, 1, nullptr);
  s.allocate();
  const float g[] = {1, 2, 3, 4, 0.5f, -2, 0};
  std::copy(g, g + 7, s.grads());
  // G^2 = [[1, 4], [9, 16]]: row means R = [2.5, 12.5], column means C = [5, 10], mean(R) = 7.5,
  // V = R C^T / 7.5 = [[5/3, 10/3], [25/3, 50/3]], U^2 = G^2 / V = [3/5, 6/5, 27/25, 24/25],
  // RMS(U) = sqrt(0.96). Vector: beta2_1 = 0, V = g^2 + eps1, U = sign(g) (0 for g = 0),
  // RMS(U) = sqrt(2/3). With d = 0.5 both are clipped by RMS(U) / d.
  Adafactor opt(s, all_entries(s), AdafactorOptions{0.8, 1e-30, 0.5});
  opt.step(s, 0.1, 1);
  const double cw = 0.1 / (std::sqrt(0.96) / 0.5), cb = 0.1 / (std::sqrt(2.0 / 3.0) / 0.5);
  const double u[] = {std::sqrt(0.6), std::sqrt(1.2), std::sqrt(1.08), std::sqrt(0.96)};
  for (int i = 0; i < 4; ++i) CHECK(s.weights()[i] == Approx(-cw * u[i]).epsilon(1e-6));
  CHECK(s.weights()[4] == Approx(-cb).epsilon(1e-6));
  CHECK(s.weights()[5] == Approx(cb).epsilon(1e-6));
  CHECK(s.weights()[6] == 0.0f);
  CHECK(opt.last_rms_over_d()[0] == Approx(std::sqrt(0.96) / 0.5).epsilon(1e-12));
  const auto st = opt.state();
  REQUIRE(st.size() == 3);
  CHECK((*st[0].data) == Buffer<float>{2.5f, 12.5f});
  CHECK((*st[1].data) == Buffer<float>{5.0f, 10.0f});
  // With d = 1 the matrix update (RMS 0.98) is not clipped.
  ParamStore<float> s2;
  s2.add("w", {2, 2}, InitKind::Zeros, 1, nullptr);
  s2.allocate();
  std::copy(g, g + 4, s2.grads());
  Adafactor opt2(s2, all_entries(s2), AdafactorOptions{0.8, 1e-30, 1.0});
  opt2.step(s2, 0.1, 1);
  for (int i = 0; i < 4; ++i) CHECK(s2.weights()[i] == Approx(-0.1 * u[i]).epsilon(1e-6));
}

TEST_CASE("adafactor: factored and unfactored state shapes", "[optim][adafactor]") {
  ParamStore<float> s;
  s.add("experts.w1", {2, 3, 4}, InitKind::Zeros, 1, nullptr);  // [E, M, H]
  s.add("proj.w", {3, 5}, InitKind::Zeros, 1, nullptr);
  s.add("ln.g", {5}, InitKind::Ones, 1, nullptr);
  s.allocate();
  Adafactor opt(s, all_entries(s), AdafactorOptions{});
  const auto st = opt.state();
  REQUIRE(st.size() == 5);
  using V = std::vector<int64_t>;
  CHECK(st[0].name == "experts.w1/v_row");
  CHECK(st[0].logical_shape == V{2, 3});
  CHECK(st[0].data->size() == 6);
  CHECK(st[1].name == "experts.w1/v_col");
  CHECK(st[1].logical_shape == V{2, 4});
  CHECK(st[1].data->size() == 8);
  CHECK(st[2].name == "proj.w/v_row");
  CHECK(st[2].logical_shape == V{3});
  CHECK(st[3].name == "proj.w/v_col");
  CHECK(st[3].logical_shape == V{5});
  CHECK(st[4].name == "ln.g/v");
  CHECK(st[4].logical_shape == V{5});
  CHECK(st[4].data->size() == 5);
  CHECK(Adafactor::factored(s.infos()[0]));
  CHECK(!Adafactor::factored(s.infos()[2]));
}

TEST_CASE("adafactor: a rank-1 G^2 is factored exactly (U = sign G at t = 1)", "[optim][adafactor]") {
  ParamStore<float> s;
  s.add("w", {3, 4}, InitKind::Zeros, 1, nullptr);
  s.allocate();
  const double a[] = {1, -2, 0.5}, b[] = {2, 1, -3, 0.25};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) s.grads()[i * 4 + j] = float(a[i] * b[j]);
  Adafactor opt(s, all_entries(s), AdafactorOptions{0.8, 1e-30, 1.0});
  opt.step(s, 0.01, 1);
  for (int e = 0; e < 12; ++e) CHECK(s.weights()[e] == Approx(s.grads()[e] > 0 ? -0.01 : 0.01).epsilon(1e-6));
}

TEST_CASE("adafactor: 6 steps on a quadratic against Shazeer & Stern Alg. 4/5 in double", "[optim][adafactor]") {
  // m = 70: the column sums' blocks of 32 columns, two whole and one of 6.
  for (const int m : {4, 70}) {
    INFO("two 3x" << m << " matrices");
    ParamStore<float> s;
    s.add("e", {2, 3, m}, InitKind::Zeros, 1, nullptr);
    s.add("b", {5}, InitKind::Zeros, 1, nullptr);
    s.allocate();
    for (size_t i = 0; i < s.size(); ++i) s.weights()[i] = float(quad_x0(i));
    const AdafactorOptions o{0.8, 1e-30, m == 4 ? 1.05 : 0.93};  // d between RMS(U)s: both branches
    Adafactor opt(s, all_entries(s), o);
    const Schedule sched = Schedule::from_config(schedule_cfg("rsqrt", 0.05, 2, 6));
    std::vector<double> x(s.size());
    for (size_t i = 0; i < s.size(); ++i) x[i] = double(s.weights()[i]);
    // Oracle state, Alg. 4 with sums: R [E][n] = row sums, C [E][m] = column sums.
    const int E = 2, n = 3;
    std::vector<double> R(E * n, 0.0), C(E * m, 0.0), Vb(5, 0.0);
    bool clipped_any = false, unclipped_any = false;
    for (int64_t t = 1; t <= 6; ++t) {
      set_quadratic_grads(s);
      const double lr = sched(t), beta = 1 - std::pow(double(t), -o.decay);
      std::vector<double> U(s.size());
      const float* g = s.grads();
      for (int e = 0; e < E; ++e) {
        for (int i = 0; i < n; ++i) {
          double r = 0;
          for (int j = 0; j < m; ++j) r += double(g[(e * n + i) * m + j]) * g[(e * n + i) * m + j] + o.eps1;
          R[e * n + i] = beta * R[e * n + i] + (1 - beta) * r;
        }
        for (int j = 0; j < m; ++j) {
          double c = 0;
          for (int i = 0; i < n; ++i) c += double(g[(e * n + i) * m + j]) * g[(e * n + i) * m + j] + o.eps1;
          C[e * m + j] = beta * C[e * m + j] + (1 - beta) * c;
        }
        double sumR = 0;
        for (int i = 0; i < n; ++i) sumR += R[e * n + i];
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < m; ++j) {
            const int k = (e * n + i) * m + j;
            U[k] = g[k] / std::sqrt(R[e * n + i] * C[e * m + j] / sumR);
          }
      }
      for (int k = 0; k < 5; ++k) {
        const double gk = g[E * n * m + k];
        Vb[k] = beta * Vb[k] + (1 - beta) * (gk * gk + o.eps1);
        U[E * n * m + k] = gk / std::sqrt(Vb[k]);
      }
      auto apply = [&](size_t lo, size_t hi) {
        double ss = 0;
        for (size_t k = lo; k < hi; ++k) ss += U[k] * U[k];
        const double rms_d = std::sqrt(ss / double(hi - lo)) / o.clip;
        (rms_d > 1 ? clipped_any : unclipped_any) = true;
        UNSCOPED_INFO("rms/d " << rms_d);
        for (size_t k = lo; k < hi; ++k) x[k] -= lr * U[k] / std::max(1.0, rms_d);
      };
      apply(0, E * n * m);
      apply(E * n * m, s.size());
      opt.step(s, lr, t);
    }
    CHECK(clipped_any);    // the run exercises both branches of update clipping
    CHECK(unclipped_any);
    // fp32 params and state vs double, |x| <= ~1.5, 6 steps: 1e-6 absolute (~10 fp32 ulps).
    for (size_t i = 0; i < s.size(); ++i) {
      INFO("element " << i);
      CHECK(double(s.weights()[i]) == Approx(x[i]).margin(1e-6).epsilon(0));
    }
    // The stored row means are the oracle's row sums / m (fp32 storage: 1e-6 relative).
    const auto st = opt.state();
    for (int k = 0; k < E * n; ++k) CHECK((*st[0].data)[k] == Approx(R[k] / m).epsilon(1e-6));
    for (int k = 0; k < E * m; ++k) CHECK((*st[1].data)[k] == Approx(C[k] / n).epsilon(1e-6));
  }
}

// ---------------------------------------------------------------------------------------------
// Each rank holds a block of the parameters, split along one dimension over all ranks; the
// DimReduce is an MPI_Allreduce over MPI_COMM_WORLD. Every rank also runs the unsharded optimizer
// and the blocks must match it.
TEST_CASE("adafactor: sharded blocks with DimReduce equal the unsharded update", "[optim][adafactor][mpi]") {
  const int np = test::world_size(), rank = test::world_rank();
  const std::vector<int64_t> shape3{4, 4, 8}, shape1{8};
  auto value = [](int which, uint64_t idx, int64_t t) {  // gradient of element idx at step t
    return float(std::sin(0.37 * double(idx) + 1.1 * double(t) + which) * (1.0 + 0.3 * double(idx % 5)));
  };
  ParamStore<float> full;
  full.add("e", shape3, InitKind::Zeros, 1, nullptr);
  full.add("v", shape1, InitKind::Zeros, 1, nullptr);
  full.allocate();
  for (size_t i = 0; i < full.size(); ++i) full.weights()[i] = float(quad_x0(i));
  for (int dim = 0; dim < 3; ++dim) {
    DYNAMIC_SECTION("split along dim " << dim) {
      std::vector<int64_t> local3 = shape3, off3(3, 0), local1 = shape1, off1{0};
      // This rank's block [n r / np, n (r+1) / np) of a dimension of n: uneven when np does not
      // divide n (3 ranks: 4 splits 1, 1, 2).
      const auto block = [&](int64_t n, int64_t& local, int64_t& off) {
        off = n * rank / np;
        local = n * (rank + 1) / np - off;
      };
      block(shape3[size_t(dim)], local3[size_t(dim)], off3[size_t(dim)]);
      block(shape1[0], local1[0], off1[0]);
      ParamStore<float> part;
      part.add_block("e", shape3, local3, off3, InitKind::Zeros, 1, nullptr);
      part.add_block("v", shape1, local1, off1, InitKind::Zeros, 1, nullptr);
      part.allocate();
      int calls = 0;
      DimReduce allsum = [&](const ParamInfo&, int, double* buf, size_t n) {
        ++calls;
        MPI_Allreduce(MPI_IN_PLACE, buf, int(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      };
      Adafactor opt(part, all_entries(part), AdafactorOptions{0.8, 1e-30, 1.0}, allsum);
      auto logical = [&](const ParamStore<float>& s, size_t k, size_t local) {
        return test::logical_index(s.infos()[k], local);
      };
      ParamStore<float> whole = full;  // fresh copy of the start
      Adafactor whole_opt(whole, all_entries(whole), AdafactorOptions{0.8, 1e-30, 1.0});
      for (size_t k = 0; k < 2; ++k)
        for (size_t i = 0; i < part.infos()[k].size; ++i)
          part.weights()[part.infos()[k].flat_offset + i] =
              full.weights()[full.infos()[k].flat_offset + logical(part, k, i)];
      for (int64_t t = 1; t <= 3; ++t) {
        for (size_t k = 0; k < 2; ++k) {
          for (size_t i = 0; i < whole.infos()[k].size; ++i)
            whole.grads()[whole.infos()[k].flat_offset + i] = value(int(k), i, t);
          for (size_t i = 0; i < part.infos()[k].size; ++i)
            part.grads()[part.infos()[k].flat_offset + i] = value(int(k), logical(part, k, i), t);
        }
        whole_opt.step(whole, 0.1, t);
        opt.step(part, 0.1, t);
      }
      if (np > 1) CHECK(calls > 0);
      // Global grad norm of the last step from per-rank partial sums (one entry is whole when np = 1).
      double part_sq = test::grad_sum_squares(part, test::split_entries(part));
      MPI_Allreduce(MPI_IN_PLACE, &part_sq, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      part_sq += test::grad_sum_squares(part, test::whole_entries(part));
      CHECK(part_sq == Approx(test::grad_sum_squares(whole)).epsilon(1e-12));  // double sums, other order
      CHECK(test::split_entries(part).size() == (np > 1 ? 2u : 0u));
      // Only the order of double sums differs: 1e-6 absolute on params of size ~1 (~10 fp32 ulps).
      for (size_t k = 0; k < 2; ++k)
        for (size_t i = 0; i < part.infos()[k].size; ++i) {
          INFO("param " << k << " local " << i);
          CHECK(part.weights()[part.infos()[k].flat_offset + i] ==
                Approx(whole.weights()[whole.infos()[k].flat_offset + logical(part, k, i)]).margin(1e-6).epsilon(0));
        }
    }
  }
}

TEST_CASE("adafactor: a split parameter without DimReduce is a logic error", "[optim][adafactor]") {
  ParamStore<float> s;
  s.add_block("w", {4, 4}, {4, 2}, {0, 2}, InitKind::Zeros, 1, nullptr);
  s.allocate();
  Adafactor opt(s, all_entries(s), AdafactorOptions{});
  CHECK_THROWS_WITH(opt.step(s, 0.1, 1), Catch::Contains("split along dim 1"));
}

// ---------------------------------------------------------------------------------------------
// Every loop body of the optimizers and of clipping writes only what its index owns: a few steps
// give bitwise the same weights, state and norms with the host loops run backwards.
namespace {

struct OptimRun {
  std::vector<float> weights;
  std::vector<std::vector<float>> state;
  std::vector<double> norms, rms_over_d;
};

// 3 steps of zero_grad, random gradients, global-norm clipping and an update.
OptimRun run_optimizer_steps(bool adafactor, bool reversed) {
  test::HostLoopsReversed order(reversed);
  ParamStore<float> s;
  s.add("experts.w", {2, 3, 5}, InitKind::Zeros, 1, nullptr);
  s.add("proj.w", {70, 65}, InitKind::Zeros, 1, nullptr);  // U^2 and g^2 over more than one 4096-chunk
  s.add("ln.g", {9}, InitKind::Zeros, 1, nullptr).no_weight_decay = true;
  s.add("out.b", {5000}, InitKind::Zeros, 1, nullptr);
  s.allocate();
  std::mt19937 gen(20240611);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < s.size(); ++i) s.weights()[i] = normal(gen);
  std::unique_ptr<Optimizer> opt;
  if (adafactor)
    opt = std::make_unique<Adafactor>(s, all_entries(s), AdafactorOptions{0.8, 1e-30, 1.0});
  else
    opt = std::make_unique<AdamW>(s, all_entries(s), AdamWOptions{0.9, 0.95, 1e-8, 0.1});
  OptimRun r;
  for (int64_t t = 1; t <= 3; ++t) {
    s.zero_grad();
    for (size_t i = 0; i < s.size(); ++i) s.grads()[i] += normal(gen) * float(1 + i % 3);
    r.norms.push_back(std::sqrt(test::grad_sum_squares(s)));
    r.norms.push_back(test::grad_sum_squares(s, {3, 1}));
    scale_grads(s, {2}, 0.5);
    scale_grads(s, clip_scale(r.norms[r.norms.size() - 2], 50.0));
    opt->step(s, 0.01, t);
    if (adafactor)
      for (double x : static_cast<Adafactor&>(*opt).last_rms_over_d()) r.rms_over_d.push_back(x);
  }
  r.weights.assign(s.weights(), s.weights() + s.size());
  for (const StateTensor& st : opt->state()) r.state.emplace_back(st.data->begin(), st.data->end());
  return r;
}

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Every optimizer state tensor of two runs bitwise equal.
void check_states_bitwise(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    INFO("state tensor " << k);
    CHECK(bitwise_equal(a[k], b[k]));
  }
}

}  // namespace

TEST_CASE("optimizers and clipping are bitwise the same with every host loop run backwards", "[optim][device]") {
  for (const bool adafactor : {false, true}) {
    INFO((adafactor ? "adafactor" : "adamw"));
    const OptimRun forward = run_optimizer_steps(adafactor, false);
    const OptimRun backward = run_optimizer_steps(adafactor, true);
    CHECK(!host_loop_reversed());
    CHECK(forward.norms[0] > 50.0);  // clipping is active
    CHECK(bitwise_equal(forward.norms, backward.norms));
    CHECK(bitwise_equal(forward.rms_over_d, backward.rms_over_d));
    CHECK(bitwise_equal(forward.weights, backward.weights));
    check_states_bitwise(forward.state, backward.state);
  }
}

// ---------------------------------------------------------------------------------------------
// The optimizers on the device (the deferred host device, cudaMalloc's access rule): AdamW's step
// is one launch for every owned parameter, Adafactor's step queues its work without waiting for
// the device (update clipping's RMS and step are computed there), and both give the host's bits.
// The host's AdamW is also checked against one AdamWUpdateElement loop per parameter (the update
// before the pieces), so every owned element, and only those, is updated once with its decay.
namespace {

void add_device_test_params(ParamStore<float>& s) {
  s.add("experts.w", {2, 3, 5}, InitKind::Zeros, 1, nullptr);
  s.add("proj.w", {70, 65}, InitKind::Zeros, 1, nullptr);  // two pieces of AdamW, two chunks of U^2
  s.add("ln.g", {9}, InitKind::Zeros, 1, nullptr).no_weight_decay = true;
  s.add("skipped.w", {40}, InitKind::Zeros, 1, nullptr);  // not owned
  s.add("out.b", {3 * 4096 + 1}, InitKind::Zeros, 1, nullptr).no_weight_decay = true;
  s.allocate();
}

std::vector<float> test_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

struct DeviceRun {
  std::vector<float> weights;
  std::vector<uint16_t> weights16;  // the store's bf16 copy (with bf16 GEMMs), else empty
  std::vector<std::vector<float>> state;
  std::vector<double> rms_over_d;
  std::vector<size_t> launches, waits;  // of each step() call
};

// 3 steps from fixed weights and gradients, every entry owned but "skipped.w"; with `bf16`, bf16
// GEMM operands (the store keeps the weights' bf16 copy on the device).
DeviceRun run_device_steps(bool adafactor, bool deferred, bool bf16 = false) {
  const test::GemmPrecisionScope precision(bf16 ? Precision::Bf16 : Precision::Fp32);
  std::optional<test::DeferredHostDevice> guard;
  if (deferred) guard.emplace(DeviceAccess::Copies);
  ParamStore<float> s;
  add_device_test_params(s);
  const size_t bytes = s.size() * sizeof(float);
  copy_from_host(s.weights(), test_values(s.size(), 7).data(), bytes);
  s.publish_weights();  // the weights written at once: their bf16 copy
  std::unique_ptr<Optimizer> opt;
  const std::vector<size_t> owned{0, 1, 2, 4};
  if (adafactor)
    opt = std::make_unique<Adafactor>(s, owned, AdafactorOptions{0.8, 1e-30, 1.0});
  else
    opt = std::make_unique<AdamW>(s, owned, AdamWOptions{0.9, 0.95, 1e-8, 0.1});
  DeviceRun r;
  for (int64_t t = 1; t <= 3; ++t) {
    copy_from_host(s.grads(), test_values(s.size(), uint32_t(100 + t)).data(), bytes);
    device_synchronize();
    const size_t queued = deferred_host_work_queued(), waits = device_waits();
    opt->step(s, 0.01, t, t == 2 ? 0.5 : 1.0);
    r.launches.push_back(deferred_host_work_queued() - queued);
    r.waits.push_back(device_waits() - waits);
  }
  r.weights.resize(s.size());
  copy_to_host(r.weights.data(), s.weights(), bytes);
  if (s.weights16()) {
    r.weights16.resize(s.size());
    copy_to_host(r.weights16.data(), s.weights16(), s.weights16_bytes());
  }
  for (const StateTensor& st : opt->state()) r.state.push_back(download(*st.data));
  if (adafactor) r.rms_over_d = static_cast<Adafactor&>(*opt).last_rms_over_d();
  return r;
}

}  // namespace

TEST_CASE("grad clip: the entries' sums of squares in one launch, each its own sum_squares's bits; scale_grads by ranges",
          "[optim][clip][device][deferred]") {
  ParamStore<float> s;
  add_device_test_params(s);
  const std::vector<float> g = test_values(s.size(), 11);
  std::copy(g.begin(), g.end(), s.grads());
  const std::vector<size_t> entries{4, 0, 1};  // any order; several chunks, one, and a partial one
  std::vector<double> own;
  Buffer<double> partials;
  for (size_t e : entries) own.push_back(sum_squares(g.data() + s.infos()[e].flat_offset, s.infos()[e].size, partials));
  CHECK(bitwise_equal(EntrySumSquares(s, entries)(s), own));
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  ParamStore<float> d;
  add_device_test_params(d);
  copy_from_host(d.grads(), g.data(), g.size() * sizeof(float));
  EntrySumSquares sums(d, entries);
  device_synchronize();
  const size_t waits = device_waits();
  const std::vector<double> first = sums(d);
  CHECK(device_waits() == waits + 1);
  CHECK(bitwise_equal(first, own));
  CHECK(bitwise_equal(sums(d), own));  // the same list each step
  // scale_grads: entries adjacent in the flat buffer are one launch ("skipped.w" splits them in two).
  const size_t queued = deferred_host_work_queued();
  scale_grads(d, {0, 1, 2, 4}, 0.5);
  CHECK(deferred_host_work_queued() == queued + 2);
  std::vector<float> scaled(g.size());
  copy_to_host(scaled.data(), d.grads(), g.size() * sizeof(float));
  const ParamInfo& skipped = d.infos()[3];
  for (size_t i = 0; i < g.size(); ++i) {
    const bool kept = i >= skipped.flat_offset && i < skipped.flat_offset + skipped.size;
    if (scaled[i] != (kept ? g[i] : g[i] * 0.5f)) FAIL_CHECK("element " << i << ": " << scaled[i] << " from " << g[i]);
  }
}

TEST_CASE("optimizers on the device: AdamW one launch a step, Adafactor no wait; the host's bits", "[optim][device][deferred]") {
  for (const bool adafactor : {false, true}) {
    INFO((adafactor ? "adafactor" : "adamw"));
    const DeviceRun host = run_device_steps(adafactor, false);
    const DeviceRun device = run_device_steps(adafactor, true);
    for (size_t t = 0; t < 3; ++t) {
      INFO("step " << t + 1);
      CHECK(device.waits[t] == 0);
      if (!adafactor) CHECK(device.launches[t] == 1);
      if (adafactor) CHECK(device.launches[t] > 4);  // queued, not run
    }
    CHECK(bitwise_equal(host.weights, device.weights));
    CHECK(bitwise_equal(host.rms_over_d, device.rms_over_d));
    check_states_bitwise(host.state, device.state);
    if (adafactor) {
      REQUIRE(host.rms_over_d.size() == 4);
      for (double r : host.rms_over_d) CHECK(r > 0.0);
    }
  }
  // The host's AdamW against one AdamWUpdateElement loop per owned parameter.
  ParamStore<float> s;
  add_device_test_params(s);
  const std::vector<float> w0 = test_values(s.size(), 7);
  std::vector<float> x = w0, m(s.size(), 0.0f), v(s.size(), 0.0f);
  for (int64_t t = 1; t <= 3; ++t) {
    const std::vector<float> g = test_values(s.size(), uint32_t(100 + t));
    const double lr = 0.01, wd = 0.1, grad_scale = t == 2 ? 0.5 : 1.0;
    const double bc1 = 1.0 - std::pow(0.9, double(t));
    for (size_t e : {0, 1, 2, 4}) {
      const ParamInfo& p = s.infos()[e];
      const float decay = p.no_weight_decay ? 1.0f : float(1.0 - lr * wd);
      const AdamWUpdateElement body{x.data() + p.flat_offset, m.data() + p.flat_offset, v.data() + p.flat_offset,
                                    g.data() + p.flat_offset, float(grad_scale), decay, 0.9f, float(1.0 - 0.9), 0.95f,
                                    float(1.0 - 0.95), float(std::sqrt(1.0 - std::pow(0.95, double(t)))), 1e-8f,
                                    float(-(lr / bc1))};
      for (size_t i = 0; i < p.size; ++i) body(int64_t(i));
    }
  }
  const DeviceRun host = run_device_steps(false, false);
  CHECK(bitwise_equal(host.weights, x));
  const ParamInfo& skipped = s.infos()[3];
  CHECK(std::equal(w0.begin() + ptrdiff_t(skipped.flat_offset), w0.begin() + ptrdiff_t(skipped.flat_offset + skipped.size),
                   host.weights.begin() + ptrdiff_t(skipped.flat_offset)));
  size_t k = 0;
  for (size_t e : {0, 1, 2, 4}) {
    const ParamInfo& p = s.infos()[e];
    INFO("parameter " << p.name);
    CHECK(bitwise_equal(host.state[k++], std::vector<float>(m.begin() + ptrdiff_t(p.flat_offset), m.begin() + ptrdiff_t(p.flat_offset + p.size))));
    CHECK(bitwise_equal(host.state[k++], std::vector<float>(v.begin() + ptrdiff_t(p.flat_offset), v.begin() + ptrdiff_t(p.flat_offset + p.size))));
  }
}

TEST_CASE("optimizers on the device with bf16 GEMMs: the update writes the weights' bf16 copy", "[optim][device][deferred][bf16]") {
  // Where bf16 GEMMs read copies (tensor/blas.hpp bf16_operand_copies) the store keeps the weights'
  // bf16 copy (ParamStore::weights16), and the update writes it with each new value: after 3 steps
  // every element's copy is bf16_bits of its weight (tensor/bf16.hpp; the skipped entry's from
  // publish_weights), still in one launch a step for AdamW, with the fp32 run's weights bitwise.
  // The host path keeps no copy.
  for (const bool adafactor : {false, true}) {
    INFO((adafactor ? "adafactor" : "adamw"));
    const DeviceRun fp32 = run_device_steps(adafactor, true);
    const DeviceRun device = run_device_steps(adafactor, true, true);
    CHECK(fp32.weights16.empty());
    CHECK(run_device_steps(adafactor, false, true).weights16.empty());
    CHECK(bitwise_equal(fp32.weights, device.weights));
    REQUIRE(device.weights16.size() == device.weights.size());
    size_t stale = 0;
    for (size_t i = 0; i < device.weights.size(); ++i) stale += device.weights16[i] != bf16_bits(device.weights[i]);
    CHECK(stale == 0);
    for (size_t t = 0; t < 3; ++t) {
      INFO("step " << t + 1);
      CHECK(device.waits[t] == 0);
      if (!adafactor) CHECK(device.launches[t] == 1);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// PyTorch reference (hidden: run by tests/scripts/optim_vs_torch.sh, which first writes
// $MESHMOE_TEST_TMPDIR/optim_ref.h5 with tests/reference/optim_reference.py).
namespace {

struct H5File {
  hid_t id = -1;
  explicit H5File(const std::string& path) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  }
  ~H5File() {
    if (id >= 0) H5Fclose(id);
  }
};

// Dataset as float (shape returned in `dims`); empty when absent.
std::vector<float> read_f32(hid_t file, const std::string& path, std::vector<hsize_t>* dims = nullptr) {
  const hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
  if (d < 0) return {};
  const hid_t sp = H5Dget_space(d);
  std::vector<hsize_t> dd(size_t(H5Sget_simple_extent_ndims(sp)));
  H5Sget_simple_extent_dims(sp, dd.data(), nullptr);
  size_t n = 1;
  for (hsize_t x : dd) n *= size_t(x);
  std::vector<float> out(n);
  H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
  H5Sclose(sp);
  H5Dclose(d);
  if (dims) *dims = dd;
  return out;
}

double attr_f64(hid_t obj, const char* name) {
  double v = NAN;
  const hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return v;
  H5Aread(a, H5T_NATIVE_DOUBLE, &v);
  H5Aclose(a);
  return v;
}

std::string attr_str(hid_t obj, const char* name) {  // fixed-length ASCII (numpy bytes_)
  const hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return "";
  const hid_t ft = H5Aget_type(a);
  std::string s(H5Tget_size(ft) + 1, '\0');  // room for a terminator whatever the file's padding
  const hid_t mt = H5Tcopy(H5T_C_S1);
  H5Tset_size(mt, s.size());
  H5Tset_strpad(mt, H5T_STR_NULLTERM);
  H5Aread(a, mt, s.data());
  H5Tclose(mt);
  H5Tclose(ft);
  H5Aclose(a);
  s.resize(std::strlen(s.c_str()));
  return s;
}

struct TorchCase {
  int steps = 0;
  double max_param_err = 0, max_delta_err = 0, max_lr_err = 0;  // relative, worst over steps and params
  int n_clipped = 0;
};

// Runs the C++ optimizer on the case `group` of the file with `cfg` and returns the worst errors.
TorchCase run_torch_case(hid_t f, const std::string& group, Config cfg) {
  const char* names[] = {"w", "b", "experts"};
  ParamStore<float> s;
  std::vector<std::vector<float>> init(3);
  for (int k = 0; k < 3; ++k) {
    std::vector<hsize_t> dims;
    init[k] = read_f32(f, std::string("/init/") + names[k], &dims);
    REQUIRE(!init[k].empty());
    std::vector<int64_t> shape(dims.begin(), dims.end());
    const hid_t d = H5Dopen2(f, (std::string("/init/") + names[k]).c_str(), H5P_DEFAULT);
    const bool nwd = attr_f64(d, "no_weight_decay") != 0.0;
    H5Dclose(d);
    s.add(names[k], shape, InitKind::Zeros, 1, nullptr).no_weight_decay = nwd;
  }
  s.allocate();
  for (int k = 0; k < 3; ++k) std::copy(init[k].begin(), init[k].end(), s.weights() + s.infos()[k].flat_offset);
  std::vector<std::vector<float>> grads(3), expect(3);
  for (int k = 0; k < 3; ++k) {
    grads[k] = read_f32(f, std::string("/grads/") + names[k]);
    expect[k] = read_f32(f, "/" + group + "/params/" + names[k]);
    REQUIRE(!grads[k].empty());
    REQUIRE(!expect[k].empty());
  }
  const std::vector<float> lr_ref = read_f32(f, "/" + group + "/lr");
  const std::vector<float> clipped = read_f32(f, "/" + group + "/clipped");
  TorchCase r;
  r.steps = int(lr_ref.size());
  const Schedule sched = Schedule::from_config(cfg);
  auto opt = make_optimizer(cfg, s);
  std::vector<float> prev(s.weights(), s.weights() + s.size());
  for (int t = 1; t <= r.steps; ++t) {
    for (int k = 0; k < 3; ++k) {
      const size_t n = s.infos()[k].size;
      std::copy(grads[k].begin() + ptrdiff_t((t - 1) * n), grads[k].begin() + ptrdiff_t(t * n),
                s.grads() + s.infos()[k].flat_offset);
    }
    const double scale = clip_scale(std::sqrt(test::grad_sum_squares(s)), cfg.optim.grad_clip);
    r.n_clipped += scale < 1.0;
    CHECK((scale < 1.0) == (clipped[size_t(t - 1)] != 0.0f));
    const double lr = sched(t);
    r.max_lr_err = std::max(r.max_lr_err, std::abs(lr - double(lr_ref[size_t(t - 1)])) / double(lr_ref[size_t(t - 1)]));
    opt->step(s, lr, t, scale);
    for (int k = 0; k < 3; ++k) {
      const ParamInfo& p = s.infos()[k];
      const float* ref = expect[k].data() + (t - 1) * p.size;
      const float* ref_prev = t == 1 ? init[k].data() : expect[k].data() + (t - 2) * p.size;
      double max_ref = 0, max_dref = 0, err = 0, derr = 0;
      for (size_t i = 0; i < p.size; ++i) {
        const double x = s.weights()[p.flat_offset + i], xp = prev[p.flat_offset + i];
        max_ref = std::max(max_ref, std::abs(double(ref[i])));
        max_dref = std::max(max_dref, std::abs(double(ref[i]) - ref_prev[i]));
        err = std::max(err, std::abs(x - ref[i]));
        derr = std::max(derr, std::abs((x - xp) - (double(ref[i]) - ref_prev[i])));
      }
      r.max_param_err = std::max(r.max_param_err, err / max_ref);
      r.max_delta_err = std::max(r.max_delta_err, derr / max_dref);
    }
    std::copy(s.weights(), s.weights() + s.size(), prev.begin());
  }
  return r;
}

Config torch_case_config(hid_t f, const std::string& group) {
  const hid_t g = H5Gopen2(f, ("/" + group).c_str(), H5P_DEFAULT);
  REQUIRE(g >= 0);
  Config c;
  c.optim.name = test::option<OptimizerKind>(attr_str(g, "name"));
  c.optim.schedule = test::option<ScheduleKind>(attr_str(g, "schedule"));
  c.optim.lr = attr_f64(g, "lr");
  c.optim.warmup_steps = int64_t(attr_f64(g, "warmup_steps"));
  c.optim.min_lr_ratio = attr_f64(g, "min_lr_ratio");
  c.run.steps = int64_t(attr_f64(g, "run_steps"));
  c.optim.beta1 = attr_f64(g, "beta1");
  c.optim.beta2 = attr_f64(g, "beta2");
  c.optim.eps = attr_f64(g, "eps");
  c.optim.weight_decay = attr_f64(g, "weight_decay");
  c.optim.grad_clip = attr_f64(g, "grad_clip");
  c.optim.adafactor_decay = attr_f64(g, "adafactor_decay");
  c.optim.adafactor_clip = attr_f64(g, "adafactor_clip");
  c.optim.adafactor_eps = attr_f64(g, "adafactor_eps");
  H5Gclose(g);
  return c;
}

}  // namespace

TEST_CASE("optimizers match PyTorch (AdamW) and a PyTorch Adafactor from the paper", "[.][optim-torch]") {
  const std::string path = test::scratch_dir() + "/optim_ref.h5";
  H5File f(path);
  INFO("reference file " << path << " (written by tests/reference/optim_reference.py)");
  REQUIRE(f.id >= 0);
  for (const std::string group : {"adamw", "adafactor"}) {
    INFO("case " << group);
    const Config cfg = torch_case_config(f.id, group);
    REQUIRE(option_name(cfg.optim.name) == group);
    const TorchCase r = run_torch_case(f.id, group, cfg);
    WARN(group << ": " << r.steps << " steps, " << r.n_clipped << " clipped; worst param error " << r.max_param_err
               << " (rel. to max |param|), worst update error " << r.max_delta_err << " (rel. to max |update|)");
    CHECK(r.steps == 10);
    CHECK(r.n_clipped > 0);            // the fixed gradients exercise clipping ...
    CHECK(r.n_clipped < r.steps);      // ... and its absence
    CHECK(r.max_lr_err < 1e-7);        // the reference stores lr in fp32
    // fp32 on both sides, different summation orders: parameters to 1e-6 of the tensor's largest
    // magnitude (the brief's tolerance), and each step's update to 1e-4 of its largest magnitude
    // (updates are ~1e-2 of the params, so fp32 rounding of x_t - x_{t-1} alone is ~1e-5).
    CHECK(r.max_param_err < 1e-6);
    CHECK(r.max_delta_err < 1e-4);
    // Sensitivity: the same comparison with a slightly wrong second-moment decay must fail.
    Config wrong = cfg;
    if (group == "adamw") wrong.optim.beta2 += 1e-3;
    else wrong.optim.adafactor_decay += 1e-2;
    const TorchCase w = run_torch_case(f.id, group, wrong);
    CHECK(w.max_delta_err > 1e-4);
  }
}
