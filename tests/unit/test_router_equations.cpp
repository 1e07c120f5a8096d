// The routing equations of src/model/moe/router_equations.hpp, each against an independent form:
// the capacity against exact integer arithmetic, the losses against the papers' formulas written out
// here, their gradients against central finite differences of those formulas, the weights against
// the means they stand for. The router's use of them is tested in test_moe_routing.cpp (the
// losses on hand-computed cases, Switch = E^2 GShard) and test_moe_layer.cpp (the whole layer's
// gradients, aux and z losses included, against finite differences).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "model/moe/router_equations.hpp"

using namespace meshmoe;

namespace {

// A group of S tokens' router probabilities [S, E]: softmax rows of random logits.
std::vector<double> random_probabilities(int S, int E, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.5);
  std::vector<double> p(size_t(S) * E);
  for (int s = 0; s < S; ++s) {
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += p[size_t(s) * E + e] = std::exp(normal(gen));
    for (int e = 0; e < E; ++e) p[size_t(s) * E + e] /= sum;
  }
  return p;
}

int argmax(const double* row, int E) { return int(std::max_element(row, row + E) - row); }

// Switch section 2.2 eq. 4-6 as written (alpha = 1), f from the argmax of the given rows
// `assign` (held fixed when the probabilities move: f is not differentiable).
double switch_loss(const std::vector<double>& p, const std::vector<double>& assign, int S, int E) {
  double loss = 0;
  for (int i = 0; i < E; ++i) {
    double f = 0, P = 0;
    for (int s = 0; s < S; ++s) {
      f += argmax(&assign[size_t(s) * E], E) == i ? 1.0 : 0.0;
      P += p[size_t(s) * E + i];
    }
    loss += (f / S) * (P / S);
  }
  return E * loss;
}

// GShard Algorithm 1: c_e counts the tokens whose first choice is e (line 11, past capacity too),
// m_e = (1/S) sum_s g_s,e (line 3), l_aux = (1/E) sum_e (c_e / S) m_e (line 13).
double gshard_loss(const std::vector<double>& p, const std::vector<double>& assign, int S, int E) {
  std::vector<double> c(size_t(E), 0), m(size_t(E), 0);
  for (int s = 0; s < S; ++s) {
    c[size_t(argmax(&assign[size_t(s) * E], E))] += 1;
    for (int e = 0; e < E; ++e) m[size_t(e)] += p[size_t(s) * E + e] / S;
  }
  double l = 0;
  for (int e = 0; e < E; ++e) l += c[size_t(e)] / S * m[size_t(e)];
  return l / E;
}

// Central difference of loss(q, p) in q[s, e] around q = p, the assignment held at p.
template <class Loss>
double central_difference(const Loss& loss, const std::vector<double>& p, int S, int E, int s, int e) {
  const double h = 1e-6;
  std::vector<double> q = p;
  q[size_t(s) * E + e] = p[size_t(s) * E + e] + h;
  const double up = loss(q, p, S, E);
  q[size_t(s) * E + e] = p[size_t(s) * E + e] - h;
  return (up - loss(q, p, S, E)) / (2 * h);
}

// The group's k best experts per token, best first (what the router's top-k writes).
std::vector<int> top_choices(const std::vector<double>& p, int S, int E, int k) {
  std::vector<int> top(size_t(S) * k);
  for (int s = 0; s < S; ++s) {
    std::vector<int> order(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) order[size_t(e)] = e;
    const double* row = &p[size_t(s) * E];
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
    for (int i = 0; i < k; ++i) top[size_t(s) * k + i] = order[size_t(i)];
  }
  return top;
}

}  // namespace

TEST_CASE("router equations: capacity ceil(k S f / E) in [1, S], as exact integer arithmetic", "[moe]") {
  // f = q / 100: C = ceil(k S q / (100 E)) exactly, clamped to [1, S] (GShard section 2.2's k S / E
  // per group, scaled by Switch eq. 3's capacity factor). Every non-integer k S f / E here is at
  // least 1 / (100 E) from an integer, so the double evaluation must give the exact ceiling.
  int checked = 0;
  for (int k : {1, 2, 3})
    for (int S : {1, 2, 7, 10, 64, 256})
      for (int E : {1, 2, 3, 6, 8, 16})
        for (int q = 5; q <= 500; q += 5) {
          const int64_t num = int64_t(k) * S * q, den = int64_t(100) * E;
          const int64_t exact = std::clamp<int64_t>((num + den - 1) / den, 1, S);
          INFO("k " << k << " S " << S << " E " << E << " f " << q / 100.0);
          REQUIRE(expert_capacity(k, S, E, q / 100.0) == exact);
          ++checked;
        }
  CHECK(checked == 3 * 6 * 6 * 100);
  CHECK(expert_capacity(1, 10, 1, 0.7) == 7);     // 0.7 * 10 = 7.000000000000001 in double
  CHECK(expert_capacity(2, 256, 8, 1e300) == 256);  // clamped in double before the conversion
}

TEST_CASE("router equations: Switch load-balancing loss (eq. 4-6) and its gradient", "[moe]") {
  for (const auto& [S, E, k] : {std::tuple{16, 4, 1}, std::tuple{12, 6, 2}, std::tuple{9, 5, 3}}) {
    INFO("S " << S << " E " << E << " k " << k);
    const std::vector<double> p = random_probabilities(S, E, uint32_t(S * 100 + E));
    const std::vector<int> top = top_choices(p, S, E, k);
    std::vector<double> f(static_cast<size_t>(E)), term(static_cast<size_t>(E));
    switch_balance_terms(p.data(), top.data(), k, S, E, f.data(), term.data());
    // f: eq. 5, the fraction of tokens whose argmax is e
    for (int e = 0; e < E; ++e) {
      int n = 0;
      for (int s = 0; s < S; ++s) n += argmax(&p[size_t(s) * E], E) == e;
      CHECK(f[size_t(e)] == Approx(double(n) / S).epsilon(1e-15));
    }
    double sum = 0;
    for (const double t : term) sum += t;
    CHECK(sum == Approx(switch_loss(p, p, S, E)).epsilon(1e-14));
    // d loss / d p_e(x): central differences of eq. 4 with f held (the argmax of the unmoved rows)
    const double weight = 0.37;
    for (int s = 0; s < S; ++s)
      for (int e = 0; e < E; ++e) {
        const double numeric = weight * central_difference(switch_loss, p, S, E, s, e);
        CHECK(switch_balance_dprob(weight, E, f[size_t(e)], S) == Approx(numeric).epsilon(1e-8).margin(1e-12));
      }
  }
}

TEST_CASE("router equations: GShard auxiliary loss (Algorithm 1 line 13) and its gradient", "[moe]") {
  const int S = 10, E = 5, k = 2;
  const std::vector<double> p = random_probabilities(S, E, 7);
  const std::vector<int> top = top_choices(p, S, E, k);
  std::vector<double> f(static_cast<size_t>(E)), term(static_cast<size_t>(E));
  switch_balance_terms(p.data(), top.data(), k, S, E, f.data(), term.data());
  double sum = 0;
  for (const double t : term) sum += t;
  CHECK(balance_loss_form_scale(AuxLossForm::Switch, E) == 1.0);
  const double scale = balance_loss_form_scale(AuxLossForm::Gshard, E);
  CHECK(scale == gshard_per_switch_balance(E));
  CHECK(sum * scale == Approx(gshard_loss(p, p, S, E)).epsilon(1e-14));
  // The gradient the router takes (the Switch form's, its weight scaled) against central
  // differences of Algorithm 1's l_aux with the counts c_e held.
  const double weight = 0.37;
  for (int s = 0; s < S; ++s)
    for (int e = 0; e < E; ++e) {
      const double numeric = weight * central_difference(gshard_loss, p, S, E, s, e);
      CHECK(switch_balance_dprob(weight * scale, E, f[size_t(e)], S) == Approx(numeric).epsilon(1e-8).margin(1e-12));
    }
}

TEST_CASE("router equations: z-loss (ST-MoE eq. 5) and its gradient", "[moe]") {
  // One token's term (log sum_j exp x_j)^2 and d/dx_e = 2 lse p_e, against the formula and central
  // differences of it.
  const std::vector<double> x = {0.3, -1.2, 2.5, 0.0, 4.0, -0.7};
  const int E = int(x.size());
  auto lse_of = [&](const std::vector<double>& v) {
    double s = 0;
    for (const double xi : v) s += std::exp(xi);
    return std::log(s);
  };
  const double lse = lse_of(x);
  CHECK(z_loss_term(lse) == Approx(std::pow(lse, 2)).epsilon(1e-15));
  const double weight = 0.011, h = 1e-6;
  for (int e = 0; e < E; ++e) {
    const double p_e = std::exp(x[size_t(e)] - lse);
    std::vector<double> v = x;
    v[size_t(e)] = x[size_t(e)] + h;
    const double up = z_loss_term(lse_of(v));
    v[size_t(e)] = x[size_t(e)] - h;
    const double down = z_loss_term(lse_of(v));
    CHECK(z_loss_dlogit(weight, lse, p_e) == Approx(weight * (up - down) / (2 * h)).epsilon(1e-6));
  }
}

TEST_CASE("router equations: the losses' weights are the step's means", "[moe]") {
  // A step of `tokens` tokens in groups of S: weight * (sum of the groups' losses) = alpha times
  // their mean; the z-loss's weight times the sum of the tokens' terms = coef times their mean.
  const double tokens = 4096, S = 256, alpha = 1e-2, coef = 1e-3;
  const double groups = tokens / S;
  CHECK(balance_loss_weight(BalanceKind::AuxLoss, alpha, tokens, int64_t(S)) * groups == Approx(alpha).epsilon(1e-15));
  CHECK(balance_loss_weight(BalanceKind::Bias, alpha, tokens, int64_t(S)) == 0.0);  // the bias balances instead
  CHECK(balance_loss_weight(BalanceKind::AuxLoss, 0.0, tokens, int64_t(S)) == 0.0);
  CHECK(z_loss_weight(coef, tokens) * tokens == Approx(coef).epsilon(1e-15));
}

TEST_CASE("router equations: sigmoid scores, gates over the chosen k, and their gradients", "[moe]") {
  // DeepSeek-V3 eq. 13-15 and Mixtral's Softmax(TopK): each against central differences of the
  // formula written out here, h = 1e-6, relative tolerance 1e-7.
  const double h = 1e-6;
  for (const double x : {-6.0, -1.3, 0.0, 0.4, 3.2}) {
    CHECK(sigmoid_score(x) == Approx(std::exp(x) / (1 + std::exp(x))).epsilon(1e-15));
    const double numeric = 0.7 * (sigmoid_score(x + h) - sigmoid_score(x - h)) / (2 * h);
    CHECK(sigmoid_dlogit(0.7, sigmoid_score(x)) == Approx(numeric).epsilon(1e-7));
  }
  // g = scale p_e / Z, Z = sum of the chosen p: d g / d p_j for a chosen j.
  const std::vector<double> p = {0.31, 0.07, 0.22, 0.4};
  const std::vector<int> chosen = {3, 0, 2};
  const double scale = 2.5, dg = 0.9;
  auto gate = [&](const std::vector<double>& q, int e) {
    double Z = 0;
    for (const int j : chosen) Z += q[size_t(j)];
    return routed_gate(scale, q[size_t(e)], Z);
  };
  double Z = 0;
  for (const int j : chosen) Z += p[size_t(j)];
  for (const int e : chosen) {
    CHECK(gate(p, e) == Approx(scale * p[size_t(e)] / Z).epsilon(1e-15));
    for (const int j : chosen) {
      std::vector<double> up = p, down = p;
      up[size_t(j)] += h, down[size_t(j)] -= h;
      const double numeric = dg * (gate(up, e) - gate(down, e)) / (2 * h);
      const double analytic = (j == e ? routed_gate_dscore(scale, dg, Z) : 0.0) - routed_gate_dnorm(scale, dg, p[size_t(e)], Z);
      CHECK(analytic == Approx(numeric).epsilon(1e-7));
    }
  }
  // Mixtral: a softmax over the chosen logits equals the chosen softmax probabilities renormalised.
  const std::vector<double> logits = {0.5, -1.0, 2.0, 1.1, -0.3};
  double all = 0, top = 0;
  for (const double l : logits) all += std::exp(l);
  for (const int j : {2, 3}) top += std::exp(logits[size_t(j)]);
  const double p2 = std::exp(logits[2]) / all, p3 = std::exp(logits[3]) / all;
  CHECK(routed_gate(1.0, p2, p2 + p3) == Approx(std::exp(logits[2]) / top).epsilon(1e-14));
}

TEST_CASE("router equations: balance loss over normalised sigmoid scores and its gradient", "[moe]") {
  // DeepSeek-V3 eq. 19-20: P_e = mean over the group of s_e / R, R = sum_e s_e; the router's f stays
  // Switch's top-1 fraction (eq. 5). Against the loss written out and central differences in s.
  const int S = 7, E = 5, k = 2;
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> u(0.05, 0.95);
  std::vector<double> s(size_t(S) * E), R(size_t(S), 0.0);
  for (int t = 0; t < S; ++t)
    for (int e = 0; e < E; ++e) R[size_t(t)] += s[size_t(t) * E + e] = u(gen);
  const std::vector<int> top = top_choices(s, S, E, k);
  std::vector<double> f(static_cast<size_t>(E)), term(static_cast<size_t>(E));
  switch_balance_terms(s.data(), top.data(), k, S, E, f.data(), term.data(), R.data());
  auto normalised = [&](const std::vector<double>& v) {
    std::vector<double> q(v.size());
    for (int t = 0; t < S; ++t) {
      double r = 0;
      for (int e = 0; e < E; ++e) r += v[size_t(t) * E + e];
      for (int e = 0; e < E; ++e) q[size_t(t) * E + e] = v[size_t(t) * E + e] / r;
    }
    return q;
  };
  auto loss = [&](const std::vector<double>& v) { return switch_loss(normalised(v), s, S, E); };
  double sum = 0;
  for (const double t : term) sum += t;
  CHECK(sum == Approx(loss(s)).epsilon(1e-14));
  const double weight = 0.37, h = 1e-6;
  for (int t = 0; t < S; ++t) {
    double sum_ws = 0;
    for (int e = 0; e < E; ++e) sum_ws += switch_balance_dprob(weight, E, f[size_t(e)], S) * s[size_t(t) * E + e];
    for (int j = 0; j < E; ++j) {
      std::vector<double> up = s, down = s;
      up[size_t(t) * E + j] += h, down[size_t(t) * E + j] -= h;
      const double numeric = weight * (loss(up) - loss(down)) / (2 * h);
      const double analytic =
          normalised_score_dscore(switch_balance_dprob(weight, E, f[size_t(j)], S), sum_ws, R[size_t(t)]);
      CHECK(analytic == Approx(numeric).epsilon(1e-7).margin(1e-12));
    }
  }
}
