// Routing properties of the MoE router (capacity, slot order, NTLB, random routing statistics,
// dropless) and the load-balancing / z losses on hand-computed cases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "../support/model_support.hpp"
#include "model/moe/router_bodies.hpp"
#include "test_moe_util.hpp"

using namespace meshmoe;
using namespace meshmoe::test;

namespace {

struct RouterHarness {
  ParamStore<double> store;
  Router<double> router;
  explicit RouterHarness(const MoeOptions& opt, uint64_t seed = 1, double init_scale = 1.0) : router(opt) {
    router.declare(store, "r");
    store.allocate();
    store.init(seed, init_scale);
  }
};

// Tokens x = base + noise: a shared component makes many tokens prefer the same experts (overflow).
std::vector<double> skewed_tokens(int N, int M, uint32_t seed, double skew) {
  std::vector<double> x = normal_vector(size_t(N) * M, seed);
  const std::vector<double> base = normal_vector(M, seed + 1000, skew);
  for (int n = 0; n < N; ++n)
    for (int m = 0; m < M; ++m) x[size_t(n) * M + m] += base[m];
  return x;
}

// Routes N tokens of width M = E = 2 whose router probabilities are p: router weights = identity
// and x = log p.
void route_probabilities(RouterHarness& h, const double (*p)[2], int N, const StepContext& ctx) {
  const double eye[4] = {1, 0, 0, 1};
  std::copy(eye, eye + 4, h.router.wg.w);
  std::vector<double> x(size_t(N) * 2);
  for (int n = 0; n < N; ++n)
    for (int e = 0; e < 2; ++e) x[size_t(n) * 2 + e] = std::log(p[n][e]);
  test::route_and_read_totals(h.router, ctx, x.data(), N);
}

}  // namespace

TEST_CASE("moe capacity formula", "[moe]") {
  MoeOptions o = small_moe(RouterKind::Top2);
  o.num_experts = 8, o.group_size = 256, o.capacity_factor_train = 1.25, o.capacity_factor_eval = 2.0;
  CHECK(o.capacity(true) == 80);   // ceil(2 * 256 * 1.25 / 8) = 80 exactly
  CHECK(o.capacity(false) == 128);  // eval factor: 2 * 256 * 2 / 8
  o.router = RouterKind::Top1;
  CHECK(o.capacity(true) == 40);
  o.group_size = 10, o.num_experts = 1, o.capacity_factor_train = 0.7;
  CHECK(o.capacity(true) == 7);  // 0.7 * 10 = 7.000000000000001 in double: not 8
  o.group_size = 8, o.num_experts = 3, o.capacity_factor_train = 1.0;
  CHECK(o.capacity(true) == 3);  // ceil(8 / 3)
  o.router = RouterKind::TopK, o.top_k = 3, o.num_experts = 4, o.capacity_factor_train = 4.0;
  CHECK(o.capacity(true) == 8);  // ceil(3 * 8 * 4 / 4) = 24, capped at S = 8
  o.capacity_factor_train = 0.01;
  CHECK(o.capacity(true) == 1);  // at least one slot
  o.dropless = true;
  CHECK(o.capacity(true) == 8);
  CHECK(o.capacity(false) == 8);
  o.top_k = 5;
  CHECK_THROWS_AS(o.validate(), InputError);  // more choices than experts
}

TEST_CASE("moe capacity: huge factors are clamped to the group size in double, normal ones unchanged", "[moe][memory]") {
  MoeOptions o = small_moe(RouterKind::Top2);
  o.num_experts = 8, o.group_size = 256;
  for (double f : {1e300, 1e6, 1e18, 1e10, 4.0, 1.7976931348623157e308}) {
    o.capacity_factor_train = o.capacity_factor_eval = f;
    INFO("factor " << f);
    CHECK(o.capacity(true) == 256);  // a token visits an expert once: C <= S (1e300 used to give 1)
    CHECK(o.capacity(false) == 256);
  }
  // Below the cap: exactly the ceil formula of GShard section 2.2 (router_equations.hpp), as before the clamp.
  const std::pair<double, int> cases[] = {{1.25, 80}, {2.0, 128}, {1.0, 64}, {0.5, 32}, {1.01, 65}, {3.99, 256}, {3.9, 250}};
  for (const auto& [f, c] : cases) {
    o.capacity_factor_train = f;
    INFO("factor " << f);
    CHECK(o.capacity(true) == c);
  }
  o.router = RouterKind::Top1, o.group_size = 16, o.num_experts = 4, o.capacity_factor_train = 1e300;
  CHECK(o.capacity(true) == 16);
}

TEST_CASE("moe routing invariants over random settings; NTLB never drops more", "[moe]") {
  std::mt19937 gen(2024);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  int trials_with_drops = 0, trials_rerouted = 0;
  for (int trial = 0; trial < 300; ++trial) {
    MoeOptions o;
    o.d_model = 5;
    o.num_experts = uni(2, 8);
    o.d_ff = 3;
    const int kind = uni(0, 2);
    o.router = kind == 0 ? RouterKind::Top1 : kind == 1 ? RouterKind::Top2 : RouterKind::TopK;
    o.top_k = uni(1, o.num_experts);
    if (o.router == RouterKind::Top2 && o.num_experts < 2) o.num_experts = 2;
    o.group_size = uni(3, 16);
    o.capacity_factor_train = std::uniform_real_distribution<double>(0.2, 2.5)(gen);
    o.capacity_factor_eval = std::uniform_real_distribution<double>(0.2, 2.5)(gen);
    o.second_expert = SecondExpertPolicy(uni(0, 2));
    o.jitter_eps = uni(0, 1) * 0.1;
    o.layer_id = uint32_t(trial);
    const int G = uni(1, 4), N = G * o.group_size, k = o.k(), E = o.num_experts;
    StepContext ctx;
    ctx.seed = uint64_t(trial);
    ctx.training = uni(0, 3) != 0;
    ctx.token_offset = uint64_t(uni(0, 1000));
    const std::vector<double> x = skewed_tokens(N, o.d_model, uint32_t(trial), 2.0);
    INFO("trial " << trial << " E=" << E << " k=" << k << " S=" << o.group_size << " G=" << G);

    RouterHarness plain(o, trial);
    test::route_and_read_totals(plain.router, ctx, x.data(), N);
    MoeOptions on = o;
    on.no_token_left_behind = true;
    RouterHarness ntlb(on, trial);
    test::route_and_read_totals(ntlb.router, ctx, x.data(), N);

    for (RouterHarness* h : {&plain, &ntlb}) {
      const bool is_ntlb = h == &ntlb;
      const Routing<double>& r = h->router.routing();
      const auto& p = h->router.probs();
      REQUIRE(r.C == o.capacity(ctx.training));
      // Per (group, expert): the slots in use are exactly 0..count-1, count <= C.
      std::map<std::pair<int, int>, std::vector<int>> slots;
      std::vector<int64_t> load(E, 0);
      int64_t kept = 0;
      for (int n = 0; n < N; ++n) {
        std::set<int> used;
        double Z = 0;
        std::vector<int> order(E);
        for (int e = 0; e < E; ++e) order[e] = e;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[size_t(n) * E + a] > p[size_t(n) * E + b]; });
        for (int i = 0; i < k; ++i) Z += p[size_t(n) * E + order[i]];
        if (o.router == RouterKind::Top1) Z = 1;
        for (int i = 0; i < k; ++i) {
          const size_t c = size_t(n) * k + i;
          const int e = r.expert[c];
          if (e < 0) {
            CHECK(r.gate[c] == 0);
            continue;
          }
          CHECK(used.insert(e).second);  // a token uses an expert at most once
          slots[{n / o.group_size, e}].push_back(r.slot[c]);
          load[e] += 1;
          ++kept;
          CHECK(std::abs(r.gate[c] - p[size_t(n) * E + e] / Z) <= 1e-15);
          if (!is_ntlb) CHECK(e == order[i]);  // plain routing: the i-th choice is the i-th best expert
        }
      }
      for (auto& [ge, s] : slots) {
        std::sort(s.begin(), s.end());
        CHECK(int(s.size()) <= r.C);
        for (size_t j = 0; j < s.size(); ++j) CHECK(s[j] == int(j));
      }
      CHECK(load == r.load);
      // the logged router entropy: sum over tokens of -sum_e p log p
      double entropy = 0;
      for (int n = 0; n < N; ++n)
        for (int e = 0; e < E; ++e)
          if (const double q = p[size_t(n) * E + e]; q > 0) entropy -= q * std::log(q);
      CHECK(std::abs(h->router.entropy_sum - entropy) <= 1e-12 * N);
      CHECK(h->router.entropy_sum <= N * std::log(double(E)) + 1e-12 * N);
      CHECK(r.wanted == int64_t(N) * k - r.declined);
      CHECK(r.dropped == r.wanted - kept);
      if (o.router != RouterKind::Top2 || o.second_expert == SecondExpertPolicy::Always ||
          (o.second_expert == SecondExpertPolicy::Random && !ctx.training))
        CHECK(r.declined == 0);
    }
    const Routing<double>& a = plain.router.routing();
    const Routing<double>& b = ntlb.router.routing();
    CHECK(b.dropped <= a.dropped);
    CHECK(a.rerouted == 0);
    CHECK(b.dropped + b.rerouted == a.dropped);
    trials_with_drops += a.dropped > 0;
    trials_rerouted += b.rerouted > 0;
    // Plain routing drops a choice only when its (i-th best) expert is full in that group. NTLB's rule:
    // a choice it still drops has no expert with room outside the token's k original experts and the
    // experts it holds.
    auto counts = [&](const Routing<double>& r) {
      std::vector<int> count(size_t(G) * E, 0);
      for (int64_t l = 0; l < int64_t(N) * k; ++l)
        if (r.expert[l] >= 0) count[size_t(l / k / o.group_size) * E + r.expert[l]] += 1;
      return count;
    };
    const std::vector<int> count_a = counts(a), count_b = counts(b);
    const auto& p = plain.router.probs();
    // Per-expert counts recounted from the choices: dropped and declined by the expert chosen
    // (the token's i-th best), rerouted by the expert NTLB placed the choice with.
    std::vector<int64_t> a_dropped(E, 0), a_declined(E, 0), b_dropped(E, 0), b_declined(E, 0), b_rerouted(E, 0);
    for (int n = 0; n < N; ++n) {
      const int g = n / o.group_size;
      std::vector<int> order(E);
      for (int e = 0; e < E; ++e) order[e] = e;
      std::stable_sort(order.begin(), order.end(), [&](int u, int v) { return p[size_t(n) * E + u] > p[size_t(n) * E + v]; });
      for (int i = 0; i < k; ++i) {
        const size_t c = size_t(n) * k + i;
        CHECK(a.expert[c] >= Routing<double>::kDeclined);
        CHECK((a.expert[c] == Routing<double>::kDeclined) == (b.expert[c] == Routing<double>::kDeclined));
        if (a.expert[c] == Routing<double>::kDropped) CHECK(count_a[size_t(g) * E + order[i]] == a.C);
        if (a.expert[c] >= 0) CHECK(b.expert[c] == a.expert[c]);  // NTLB keeps every plain placement
        if (b.expert[c] == Routing<double>::kDropped) {
          std::set<int> mine(order.begin(), order.begin() + k);
          for (int j = 0; j < k; ++j) mine.insert(b.expert[size_t(n) * k + j]);
          for (int e = 0; e < E; ++e)
            if (!mine.count(e)) CHECK(count_b[size_t(g) * E + e] == b.C);
        }
        if (a.expert[c] == Routing<double>::kDropped && b.expert[c] >= 0)  // rerouted outside its own k
          CHECK(std::find(order.begin(), order.begin() + k, b.expert[c]) == order.begin() + k);
        a_dropped[order[i]] += a.expert[c] == Routing<double>::kDropped;
        a_declined[order[i]] += a.expert[c] == Routing<double>::kDeclined;
        b_dropped[order[i]] += b.expert[c] == Routing<double>::kDropped;
        b_declined[order[i]] += b.expert[c] == Routing<double>::kDeclined;
        if (a.expert[c] == Routing<double>::kDropped && b.expert[c] >= 0) b_rerouted[b.expert[c]] += 1;
      }
    }
    CHECK(a.expert_dropped == a_dropped);
    CHECK(a.expert_declined == a_declined);
    CHECK(a.expert_rerouted == std::vector<int64_t>(E, 0));
    CHECK(b.expert_dropped == b_dropped);
    CHECK(b.expert_declined == b_declined);
    CHECK(b.expert_rerouted == b_rerouted);
  }
  // The random settings must actually exercise drops and rerouting.
  CHECK(trials_with_drops > 50);
  CHECK(trials_rerouted > 30);
}

TEST_CASE("moe top-2 slot order: first choices fill capacity first, in token order (GShard Algorithm 1)", "[moe]") {
  MoeOptions o = small_moe(RouterKind::Top2);
  o.second_expert = SecondExpertPolicy::Always;
  o.group_size = 16;
  o.capacity_factor_train = 1.0;  // C = 8
  const int N = 64, k = 2, E = o.num_experts;
  RouterHarness h(o, 4);
  StepContext ctx;
  const std::vector<double> x = skewed_tokens(N, o.d_model, 77, 1.5);
  test::route_and_read_totals(h.router, ctx, x.data(), N);
  const Routing<double>& r = h.router.routing();
  CHECK(r.dropped > 0);
  // Recompute GShard's positions: position of a first choice = number of earlier first choices of its
  // expert in the group; of a second choice = kept first choices of the expert + rank among earlier
  // second choices. Kept iff position < C.
  for (int g = 0; g < N / o.group_size; ++g) {
    std::vector<int> first(E, 0), second(E, 0);
    const auto& p = h.router.probs();
    std::vector<int> e1(o.group_size), e2(o.group_size);
    for (int s = 0; s < o.group_size; ++s) {
      const int n = g * o.group_size + s;
      std::vector<int> order(E);
      for (int e = 0; e < E; ++e) order[e] = e;
      std::stable_sort(order.begin(), order.end(), [&](int u, int v) { return p[size_t(n) * E + u] > p[size_t(n) * E + v]; });
      e1[s] = order[0], e2[s] = order[1];
    }
    for (int s = 0; s < o.group_size; ++s) {
      const int n = g * o.group_size + s, pos = first[e1[s]]++;
      CHECK(r.expert[size_t(n) * k] == (pos < r.C ? e1[s] : -1));
      if (pos < r.C) CHECK(r.slot[size_t(n) * k] == pos);
    }
    for (int s = 0; s < o.group_size; ++s) {
      const int n = g * o.group_size + s, pos = std::min(first[e2[s]], r.C) + second[e2[s]]++;
      CHECK(r.expert[size_t(n) * k + 1] == (pos < r.C ? e2[s] : -1));
      if (pos < r.C) CHECK(r.slot[size_t(n) * k + 1] == pos);
    }
  }
}

TEST_CASE("moe declined_takes_slot (GShard Algorithm 1 line 22) on a hand-computed group", "[moe]") {
  // E = 2, S = 4, C = 3 (k S cf / E = 2 * 4 * 0.75 / 2), threshold second expert 0.2. Router weights
  // = identity and x = log p, so the probabilities are p. Second gates: 0.1 (declined), 0.4, 0.3,
  // 0.45. First choices: t0, t1 -> e0 slots 0, 1; t2, t3 -> e1 slots 0, 1. Second choices in token
  // order: t0's (e1) declined; t1's e1: slot 2, or with line 22 (t0's decline took slot 2) dropped;
  // t2's e0: slot 2; t3's e0: dropped (e0 full).
  const double p[4][2] = {{0.9, 0.1}, {0.6, 0.4}, {0.3, 0.7}, {0.45, 0.55}};
  for (const bool literal : {false, true}) {
    MoeOptions o = small_moe(RouterKind::Top2);
    o.d_model = 2, o.num_experts = 2, o.group_size = 4, o.capacity_factor_train = 0.75;
    o.second_expert = SecondExpertPolicy::Threshold;
    o.second_expert_threshold = 0.2;
    o.declined_takes_slot = literal;
    RouterHarness h(o, 1);
    route_probabilities(h, p, 4, StepContext{});
    const Routing<double>& r = h.router.routing();
    INFO("declined_takes_slot = " << literal);
    REQUIRE(r.C == 3);
    const int D = Routing<double>::kDeclined, X = Routing<double>::kDropped;
    const std::vector<int> expert = {0, D, 0, literal ? X : 1, 1, 0, 1, X};
    const std::vector<int> slot = {0, -1, 1, literal ? -1 : 2, 0, 2, 1, -1};
    CHECK(std::vector<int>(r.expert.begin(), r.expert.end()) == expert);
    CHECK(std::vector<int>(r.slot.begin(), r.slot.end()) == slot);
    CHECK(r.load == std::vector<int64_t>{3, literal ? 2 : 3});  // filled slots, not positions
    CHECK(r.declined == 1);
    CHECK(r.dropped == (literal ? 2 : 1));
  }
}

TEST_CASE("moe declined_takes_slot equals a literal transcription of GShard Algorithm 1", "[moe]") {
  // Algorithm 1 as printed: first choices (lines 4-12), then second choices (lines 14-23); every
  // choice advances its expert's counter c_e whether kept, dropped or declined (lines 11, 22). The
  // declined set comes from the router itself (the same random stream decides it in both modes).
  std::mt19937 gen(7);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  int64_t holes_cost = 0;  // choices dropped only because of the empty slots
  for (int trial = 0; trial < 100; ++trial) {
    MoeOptions o = small_moe(RouterKind::Top2);
    o.num_experts = uni(2, 6);
    o.group_size = uni(4, 16);
    o.capacity_factor_train = std::uniform_real_distribution<double>(0.3, 1.5)(gen);
    o.second_expert = uni(0, 1) ? SecondExpertPolicy::Random : SecondExpertPolicy::Threshold;
    o.second_expert_threshold = 0.3;
    o.layer_id = uint32_t(trial);
    const int G = uni(1, 3), N = G * o.group_size, S = o.group_size, E = o.num_experts;
    StepContext ctx;
    ctx.seed = uint64_t(trial), ctx.training = true;
    const std::vector<double> x = skewed_tokens(N, o.d_model, uint32_t(100 + trial), 1.0);
    RouterHarness compact(o, trial);
    test::route_and_read_totals(compact.router, ctx, x.data(), N);
    MoeOptions ol = o;
    ol.declined_takes_slot = true;
    RouterHarness literal(ol, trial);
    test::route_and_read_totals(literal.router, ctx, x.data(), N);
    const Routing<double>& a = compact.router.routing();
    const Routing<double>& r = literal.router.routing();
    INFO("trial " << trial << " E=" << E << " S=" << S << " C=" << r.C);
    const auto& p = literal.router.probs();
    std::vector<int64_t> load(E, 0);
    for (int g = 0; g < G; ++g) {
      std::vector<int> c(E, 0);
      for (int i = 0; i < 2; ++i)
        for (int s = 0; s < S; ++s) {
          const int n = g * S + s;
          const size_t ch = size_t(n) * 2 + i;
          std::vector<int> order(E);
          for (int e = 0; e < E; ++e) order[e] = e;
          std::stable_sort(order.begin(), order.end(), [&](int u, int v) { return p[size_t(n) * E + u] > p[size_t(n) * E + v]; });
          const int e = order[i], pos = c[e]++;
          CHECK((a.expert[ch] == Routing<double>::kDeclined) == (r.expert[ch] == Routing<double>::kDeclined));
          if (r.expert[ch] == Routing<double>::kDeclined) continue;
          CHECK(r.expert[ch] == (pos < r.C ? e : Routing<double>::kDropped));
          CHECK(r.slot[ch] == (pos < r.C ? pos : -1));
          if (pos < r.C) load[e] += 1;
          holes_cost += pos >= r.C && a.expert[ch] >= 0;
        }
    }
    CHECK(load == r.load);
  }
  CHECK(holes_cost > 20);  // the literal reading does change routing in these trials
}

TEST_CASE("moe expert choice: capacity C = ceil(S cf / E), the paper's k = n c / E", "[moe]") {
  MoeOptions o = small_moe(RouterKind::ExpertChoice);
  o.num_experts = 8, o.group_size = 256, o.capacity_factor_train = 2.0, o.capacity_factor_eval = 1.25;
  CHECK(o.k() == 8);               // one choice per expert
  CHECK(o.capacity(true) == 64);   // 256 * 2 / 8
  CHECK(o.capacity(false) == 40);  // 256 * 1.25 / 8
  o.group_size = 10, o.num_experts = 3, o.capacity_factor_train = 1.0;
  CHECK(o.capacity(true) == 4);    // ceil(10 / 3)
  o.capacity_factor_train = 100;
  CHECK(o.capacity(true) == 10);   // at most S: every expert takes every token
  o.capacity_factor_train = 0.01;
  CHECK(o.capacity(true) == 1);
  for (auto bad : {&MoeOptions::dropless, &MoeOptions::no_token_left_behind}) {
    MoeOptions b = o;
    b.*bad = true;
    CHECK_THROWS_AS(b.validate(), InputError);
  }
  o.balance = BalanceKind::Bias;
  CHECK_THROWS_AS(o.validate(), InputError);
}

TEST_CASE("moe expert choice on a hand-computed group", "[moe]") {
  // E = 2, S = 4, C = 2 (S cf / E = 4 * 0.75 / 2 = 1.5, rounded up). route_probabilities: the
  // probabilities are p. Expert 0's column 0.9, 0.6, 0.3, 0.6: t0, then t1 (tie
  // with t3 at 0.6: the lower token index). Expert 1's column 0.1, 0.4, 0.7, 0.4: t2, then t1 (tie
  // with t3). So t1 gets both experts, t0 and t2 one, t3 none.
  const double p[4][2] = {{0.9, 0.1}, {0.6, 0.4}, {0.3, 0.7}, {0.6, 0.4}};
  MoeOptions o = small_moe(RouterKind::ExpertChoice);
  o.d_model = 2, o.num_experts = 2, o.group_size = 4, o.capacity_factor_train = 0.75;
  RouterHarness h(o, 1);
  StepContext ctx;
  ctx.training = true;
  route_probabilities(h, p, 4, ctx);
  const Routing<double>& r = h.router.routing();
  REQUIRE(r.C == 2);
  REQUIRE(r.k == 2);
  const int X = Routing<double>::kDropped;
  // choice n * E + e: expert e's take of token n
  CHECK(std::vector<int>(r.expert.begin(), r.expert.end()) == std::vector<int>{0, X, 0, 1, X, 1, X, X});
  CHECK(std::vector<int>(r.slot.begin(), r.slot.end()) == std::vector<int>{0, -1, 1, 1, -1, 0, -1, -1});
  const std::vector<double> gate = {0.9, 0, 0.6, 0.4, 0, 0.7, 0, 0};
  for (size_t c = 0; c < gate.size(); ++c) CHECK(r.gate[c] == Approx(gate[c]).epsilon(1e-14));
  CHECK(r.load == std::vector<int64_t>{2, 2});
  CHECK(r.wanted == 4);
  CHECK(r.dropped == 0);
  CHECK(r.declined == 0);
  CHECK(h.router.aux_sum == 0);
}

TEST_CASE("moe expert choice equals sorting each expert's column, over random settings", "[moe]") {
  // Oracle: per group and expert, a stable sort of the tokens by descending probability (stable:
  // ties to the lower token index); the first C are the expert's, slot = rank. Quantised inputs
  // make ties common.
  std::mt19937 gen(11);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  int64_t ties = 0, zero = 0, several = 0;
  for (int trial = 0; trial < 60; ++trial) {
    MoeOptions o = small_moe(RouterKind::ExpertChoice);
    o.num_experts = uni(1, 6);
    o.group_size = uni(1, 12);
    o.capacity_factor_train = std::uniform_real_distribution<double>(0.2, 3.0)(gen);
    const int G = uni(1, 3), S = o.group_size, E = o.num_experts, N = G * S;
    std::vector<double> x = skewed_tokens(N, o.d_model, uint32_t(300 + trial), 0.5);
    if (trial % 2)
      for (double& v : x) v = std::round(v);  // equal tokens: equal probabilities
    RouterHarness h(o, uint64_t(trial));
    StepContext ctx;
    ctx.training = true;
    test::route_and_read_totals(h.router, ctx, x.data(), N);
    const Routing<double>& r = h.router.routing();
    const auto& p = h.router.probs();
    INFO("trial " << trial << " E=" << E << " S=" << S << " C=" << r.C);
    REQUIRE(r.C == o.capacity(true));
    std::vector<int> expert(size_t(N) * E, Routing<double>::kDropped), slot(size_t(N) * E, -1);
    for (int g = 0; g < G; ++g)
      for (int e = 0; e < E; ++e) {
        std::vector<int> order(S);
        for (int s = 0; s < S; ++s) order[s] = g * S + s;
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return p[size_t(a) * E + e] > p[size_t(b) * E + e]; });
        for (int j = 0; j + 1 < S; ++j) ties += p[size_t(order[j]) * E + e] == p[size_t(order[j + 1]) * E + e];
        for (int j = 0; j < std::min(r.C, S); ++j) {
          expert[size_t(order[j]) * E + e] = e;
          slot[size_t(order[j]) * E + e] = j;
        }
      }
    CHECK(std::vector<int>(r.expert.begin(), r.expert.end()) == expert);
    CHECK(std::vector<int>(r.slot.begin(), r.slot.end()) == slot);
    for (size_t c = 0; c < expert.size(); ++c)
      CHECK(r.gate[c] == (expert[c] >= 0 ? p[c] : 0.0));  // choice n * E + e: p[n, e] itself
    for (int n = 0; n < N; ++n) {
      int got = 0;
      for (int e = 0; e < E; ++e) got += expert[size_t(n) * E + e] >= 0;
      zero += got == 0;
      several += got >= 2;
    }
  }
  CHECK(ties > 20);
  CHECK(zero > 20);
  CHECK(several > 20);
}

TEST_CASE("moe random routing: second-expert dispatch rate is mean(min(1, 2 g2))", "[moe]") {
  MoeOptions o = small_moe(RouterKind::Top2);
  o.d_model = 4, o.num_experts = 8, o.group_size = 1024, o.dropless = true;
  const int N = 256 * 1024, E = o.num_experts;  // 262144 tokens
  RouterHarness h(o, 9, 2.0);
  StepContext ctx;
  ctx.seed = 12345, ctx.step = 17;
  const std::vector<double> x = normal_vector(size_t(N) * o.d_model, 31);
  test::route_and_read_totals(h.router, ctx, x.data(), N);
  const Routing<double>& r = h.router.routing();
  const auto& p = h.router.probs();
  double expected = 0, var = 0, mean_q = 0;
  for (int n = 0; n < N; ++n) {
    double p1 = p[size_t(n) * E + r.expert[size_t(n) * 2]], p2 = -1;
    for (int e = 0; e < E; ++e)
      if (e != r.expert[size_t(n) * 2]) p2 = std::max(p2, p[size_t(n) * E + e]);
    const double q = std::min(1.0, 2.0 * p2 / (p1 + p2));
    expected += q, var += q * (1 - q), mean_q += q / N;
  }
  const double observed = double(N - r.declined);
  // Bound: 5 standard errors of a sum of independent Bernoulli(q_n) draws.
  INFO("observed " << observed << " expected " << expected << " se " << std::sqrt(var) << " mean q " << mean_q);
  CHECK(r.dropped == 0);
  CHECK(mean_q < 0.9);  // the gates are spread enough for the test to mean something
  CHECK(mean_q > 0.1);
  CHECK(std::abs(observed - expected) <= 5 * std::sqrt(var));
  // Evaluation dispatches every second expert.
  ctx.training = false;
  test::route_and_read_totals(h.router, ctx, x.data(), N);
  CHECK(h.router.routing().declined == 0);
}

TEST_CASE("moe dropless routing drops nothing even when all tokens prefer one expert", "[moe]") {
  for (RouterKind kind : {RouterKind::Top1, RouterKind::Top2, RouterKind::TopK}) {
    MoeOptions o = small_moe(kind);
    o.dropless = true;
    o.second_expert = SecondExpertPolicy::Always;
    const int N = 64;
    RouterHarness h(o, 2);
    StepContext ctx;
    const std::vector<double> x = skewed_tokens(N, o.d_model, 5, 20.0);
    test::route_and_read_totals(h.router, ctx, x.data(), N);
    const Routing<double>& r = h.router.routing();
    CHECK(r.C == o.group_size);
    CHECK(r.dropped == 0);
    CHECK(*std::max_element(r.load.begin(), r.load.end()) >= N / 2);  // skewed indeed
    // the same tokens with capacity do drop
    o.dropless = false;
    RouterHarness h2(o, 2);
    test::route_and_read_totals(h2.router, ctx, x.data(), N);
    CHECK(h2.router.routing().dropped > 0);
  }
}

TEST_CASE("moe aux and z loss on a hand-computed case", "[moe]") {
  // M = 2, E = 2, S = 2, top-1. wg = [[ln 3, 0], [0, 0]]; x0 = [1, 0], x1 = [0.5, 0]
  // logits0 = [ln 3, 0] -> p0 = [3/4, 1/4]; logits1 = [ln 3 / 2, 0] -> p1 = [r/(1+r), 1/(1+r)], r = sqrt 3.
  // Both tokens' top-1 is expert 0: f = [1, 0], P_0 = (3/4 + r/(1+r)) / 2.
  // aux = E * sum f_e P_e = 2 * P_0 = 3/4 + r/(1+r); z = ln(4)^2 + ln(1+r)^2.
  MoeOptions o = small_moe(RouterKind::Top1);
  o.d_model = 2, o.num_experts = 2, o.group_size = 2, o.capacity_factor_train = 2.0;
  RouterHarness h(o);
  double* wg = h.router.wg.w;
  wg[0] = std::log(3.0), wg[1] = 0, wg[2] = 0, wg[3] = 0;
  const double r3 = std::sqrt(3.0);
  const double aux = 0.75 + r3 / (1 + r3), z = std::pow(std::log(4.0), 2) + std::pow(std::log(1 + r3), 2);
  StepContext ctx;
  SECTION("one group") {
    const std::vector<double> x = {1, 0, 0.5, 0};
    test::route_and_read_totals(h.router, ctx, x.data(), 2);
    CHECK(h.router.aux_sum == Approx(aux).epsilon(1e-14));
    CHECK(h.router.z_sum == Approx(z).epsilon(1e-14));
    CHECK(h.router.routing().gate[0] == Approx(0.75).epsilon(1e-15));  // top-1 gate = p, not renormalised
    CHECK(h.router.routing().gate[1] == Approx(r3 / (1 + r3)).epsilon(1e-15));
  }
  SECTION("two groups: the layer returns the sum over groups") {
    const std::vector<double> x = {1, 0, 0.5, 0, 0.5, 0, 1, 0};
    test::route_and_read_totals(h.router, ctx, x.data(), 4);
    CHECK(h.router.aux_sum == Approx(2 * aux).epsilon(1e-14));
    CHECK(h.router.z_sum == Approx(2 * z).epsilon(1e-14));
  }
}

TEST_CASE("moe Switch aux loss = E^2 * GShard aux loss", "[moe]") {
  // GShard Algorithm 1 line 13: l_aux = (1/E) sum_e (c_e / S) m_e, c_e counting every token whose
  // top-1 is e (line 11 increments even over capacity), m_e the mean gate. Switch eq. 4 (alpha = 1):
  // E * sum_e f_e P_e with f_e = c_e / S, P_e = m_e. So Switch = E^2 * GShard, per group.
  MoeOptions o = small_moe(RouterKind::Top2);
  o.num_experts = 6, o.group_size = 16;
  const int N = 64, E = o.num_experts, S = o.group_size;
  RouterHarness h(o, 8);
  StepContext ctx;
  const std::vector<double> x = skewed_tokens(N, o.d_model, 3, 1.0);
  test::route_and_read_totals(h.router, ctx, x.data(), N);
  const auto& p = h.router.probs();
  double gshard_sum = 0;
  for (int g = 0; g < N / S; ++g) {
    std::vector<double> c(E, 0), m(E, 0);
    for (int s = 0; s < S; ++s) {
      const double* ps = &p[size_t(g * S + s) * E];
      c[std::max_element(ps, ps + E) - ps] += 1;
      for (int e = 0; e < E; ++e) m[e] += ps[e] / S;
    }
    double l = 0;
    for (int e = 0; e < E; ++e) l += c[e] / S * m[e];
    gshard_sum += l / E;
  }
  CHECK(h.router.aux_sum == Approx(double(E * E) * gshard_sum).epsilon(1e-12));
  // moe.aux_loss_form = gshard: the same routing, the loss in GShard's normalisation.
  o.aux_loss_form = AuxLossForm::Gshard;
  RouterHarness hg(o, 8);
  test::route_and_read_totals(hg.router, ctx, x.data(), N);
  CHECK(hg.router.aux_sum == Approx(gshard_sum).epsilon(1e-12));
}

TEST_CASE("moe selection bias: the update rule on a hand-computed case", "[moe]") {
  // loads 10, 30, 20, 20 (mean 20): expert 0 under (+u), 1 over (-u), 2 and 3 at the mean (0)
  float bias[4] = {0.5f, -0.25f, 0.125f, 0.0f};
  const double load[4] = {10, 30, 20, 20};
  update_selection_bias(bias, load, 4, 0.01);
  CHECK(bias[0] == float(0.5 + 0.01));
  CHECK(bias[1] == float(-0.25 - 0.01));
  CHECK(bias[2] == 0.125f);
  CHECK(bias[3] == 0.0f);
  // a Router without moe.balance = bias has no bias and ignores updates
  MoeOptions o = small_moe(RouterKind::Top1);
  Router<double> plain(o);
  CHECK(plain.selection_bias.empty());
  plain.update_bias(std::vector<double>{1, 2, 3, 4});
  CHECK(plain.selection_bias.empty());
  o.balance = BalanceKind::Bias;
  o.bias_update_rate = 0.5;
  Router<double> biased(o);
  REQUIRE(biased.selection_bias.size() == 4);
  biased.update_bias(std::vector<double>{0, 8, 0, 0});
  CHECK(std::vector<float>(biased.selection_bias.begin(), biased.selection_bias.end()) ==
        std::vector<float>{0.5f, -0.5f, 0.5f, 0.5f});
  CHECK(biased.bias_max_abs() == 0.5);
}

TEST_CASE("moe selection bias: selects by p + b, gates from the unbiased probabilities", "[moe]") {
  for (const RouterKind kind : {RouterKind::Top1, RouterKind::Top2}) {
    MoeOptions o = small_moe(kind);
    o.second_expert = SecondExpertPolicy::Always;
    o.dropless = true;
    o.balance = BalanceKind::Bias;
    RouterHarness h(o, 3);
    const int N = 16, E = o.num_experts, k = o.k();
    const std::vector<double> x = normal_vector(size_t(N) * o.d_model, 9);
    const float b[4] = {0.3f, -0.2f, 0.05f, 0.0f};
    std::copy(b, b + 4, h.router.selection_bias.begin());
    StepContext ctx;
    ctx.training = true;
    test::route_and_read_totals(h.router, ctx, x.data(), N);
    const Routing<double>& r = h.router.routing();
    int moved = 0;  // choices the bias changed
    for (int n = 0; n < N; ++n) {
      const double* p = h.router.probs().data() + size_t(n) * E;
      std::vector<int> by_score(E), by_p(E);
      for (int e = 0; e < E; ++e) by_score[e] = by_p[e] = e;
      std::stable_sort(by_score.begin(), by_score.end(), [&](int a, int c) { return p[a] + b[a] > p[c] + b[c]; });
      std::stable_sort(by_p.begin(), by_p.end(), [&](int a, int c) { return p[a] > p[c]; });
      double Z = 0;
      for (int i = 0; i < k; ++i) Z += p[by_score[i]];
      if (kind == RouterKind::Top1) Z = 1;
      for (int i = 0; i < k; ++i) {
        CHECK(r.expert[size_t(n) * k + i] == by_score[i]);
        CHECK(r.gate[size_t(n) * k + i] == Approx(p[by_score[i]] / Z).epsilon(1e-15));
        moved += by_score[i] != by_p[i];
      }
    }
    CHECK(moved > 0);
  }
}

TEST_CASE("moe selection bias: updating it from the loads lowers the largest load", "[moe]") {
  // The same skewed tokens and router every step: without the bias the loads stay as they are;
  // with it (Wang et al. 2024) the most loaded expert's share falls well below where it started.
  MoeOptions o = small_moe(RouterKind::Top1);
  o.num_experts = 8;
  o.group_size = 64;
  o.dropless = true;
  o.balance = BalanceKind::Bias;
  o.bias_update_rate = 2e-3;
  RouterHarness h(o, 5);
  const int N = 256, E = o.num_experts;
  const std::vector<double> x = skewed_tokens(N, o.d_model, 21, 2.0);
  StepContext ctx;
  ctx.training = true;
  auto max_load = [&] {
    test::route_and_read_totals(h.router, ctx, x.data(), N);
    const auto& load = h.router.routing().load;
    return *std::max_element(load.begin(), load.end());
  };
  const int64_t start = max_load();
  CHECK(start > 2 * N / E);  // skewed: the busiest expert has more than twice its share
  for (int step = 0; step < 300; ++step) {
    max_load();
    const auto& load = h.router.routing().load;
    h.router.update_bias(std::vector<double>(load.begin(), load.end()));
  }
  const int64_t end = max_load();
  INFO("max load " << start << " -> " << end << " of " << N << " tokens, " << E << " experts");
  CHECK(end < start * 2 / 3);
  CHECK(end <= N / E + N / 16);  // close to balanced
  // and the unbiased router on the same tokens: unchanged
  std::fill(h.router.selection_bias.begin(), h.router.selection_bias.end(), 0.0f);
  CHECK(max_load() == start);
}

TEST_CASE("moe gates: softmax_topk, sigmoid and the routed scale against their formulas", "[moe]") {
  // The router's scores and gates (moe.gate, moe.routed_scale) against the formulas written out from
  // the logits x wg: softmax_topk = Softmax(TopK(logits)) (Mixtral section 2.1), sigmoid = the chosen
  // sigmoid scores normalised over the k (DeepSeek-V3 eq. 13-15); dropless, so every choice is placed.
  const int M = 6, E = 8, N = 32;
  const std::vector<double> x = normal_vector(size_t(N) * M, 41);
  StepContext ctx;
  ctx.training = true;
  for (const MoeGate gate : {MoeGate::Softmax, MoeGate::SoftmaxTopk, MoeGate::SoftmaxUnnormalised, MoeGate::Sigmoid})
    for (const RouterKind router : {RouterKind::Top1, RouterKind::Top2, RouterKind::TopK})
      for (const double scale : {1.0, 2.5}) {
        INFO("gate " << option_name(gate) << " router " << option_name(router) << " scale " << scale);
        MoeOptions o = small_moe(router);
        o.d_model = M, o.num_experts = E, o.top_k = 5, o.dropless = true, o.group_size = 16;
        o.second_expert = SecondExpertPolicy::Always;
        o.gate = gate, o.routed_scale = scale;
        RouterHarness h(o, 5);
        test::route_and_read_totals(h.router, ctx, x.data(), N);
        const Routing<double>& r = h.router.routing();
        const int k = o.k();
        for (int n = 0; n < N; ++n) {
          std::vector<double> logit(E), score(E);
          double sum_exp = 0;
          for (int e = 0; e < E; ++e) {
            for (int m = 0; m < M; ++m) logit[e] += x[size_t(n) * M + m] * h.router.wg.w[size_t(m) * E + e];
            sum_exp += std::exp(logit[e]);
          }
          for (int e = 0; e < E; ++e)
            score[e] = gate == MoeGate::Sigmoid ? 1 / (1 + std::exp(-logit[e])) : std::exp(logit[e]) / sum_exp;
          std::vector<int> order(E);
          for (int e = 0; e < E; ++e) order[e] = e;
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
          double chosen_exp = 0, chosen_score = 0;
          for (int i = 0; i < k; ++i) chosen_exp += std::exp(logit[order[i]]), chosen_score += score[order[i]];
          for (int i = 0; i < k; ++i) {
            const int e = order[i];
            REQUIRE(r.expert[size_t(n) * k + i] == e);
            CHECK(h.router.probs()[size_t(n) * E + e] == Approx(score[e]).epsilon(1e-13));
            double want = score[e];  // softmax top-1 (Switch eq. 2), softmax_unnormalised (DeepSeekMoE eq. 4)
            if (gate == MoeGate::SoftmaxTopk || (gate == MoeGate::Softmax && router != RouterKind::Top1))
              want = std::exp(logit[e]) / chosen_exp;
            if (gate == MoeGate::Sigmoid) want = score[e] / chosen_score;
            CHECK(r.gate[size_t(n) * k + i] == Approx(scale * want).epsilon(1e-13));
          }
        }
      }
}

TEST_CASE("moe gates: softmax_topk routes top-2 and top-k bitwise as softmax", "[moe]") {
  // Renormalised softmax gates are Softmax(TopK(logits)): the two spellings give the same triples.
  const int N = 64;
  for (const RouterKind router : {RouterKind::Top2, RouterKind::TopK}) {
    MoeOptions o = small_moe(router);
    o.capacity_factor_train = 0.75;
    const std::vector<double> x = skewed_tokens(N, o.d_model, 9, 1.0);
    StepContext ctx;
    ctx.training = true, ctx.seed = 3, ctx.step = 2;
    RouterHarness a(o, 2);
    o.gate = MoeGate::SoftmaxTopk;
    RouterHarness b(o, 2);
    test::route_and_read_totals(a.router, ctx, x.data(), N);
    test::route_and_read_totals(b.router, ctx, x.data(), N);
    const Routing<double>&ra = a.router.routing(), &rb = b.router.routing();
    CHECK(ra.dropped > 0);
    for (size_t c = 0; c < size_t(N) * ra.k; ++c) {
      REQUIRE(ra.expert[c] == rb.expert[c]);
      REQUIRE(ra.slot[c] == rb.slot[c]);
      REQUIRE(ra.gate[c] == rb.gate[c]);
    }
  }
}

namespace {

// Routing-control counts of the groups compared: groups with dropped, declined, rerouted choices.
struct ControlTrials {
  int dropped = 0, declined = 0, rerouted = 0;
};

// One random routing straight into the bodies: probabilities with ties, k distinct first-ranked
// experts per token, random declines, capacities from 0 to past the group, groups across several
// 32-token chunks, NTLB (always when always_ntlb, with tighter capacities), declined_takes_slot, a selection bias. The
// device's path (RouterSlotsByScan's columns in a shuffled order, each owns its writes, then
// RouterAssignRest per group in reverse order) against the one-body-per-group reference
// (RouterAssignGroup) in group order: every output bitwise.
void compare_routing_control(std::mt19937& gen, int max_E, bool always_ntlb, ControlTrials& trials) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  const int E = uni(1, max_E), k = uni(1, std::min(E, 4)), S = uni(1, 80), G = uni(1, 3), N = G * S;
  // always_ntlb: capacities about the mean load S k / E and below, where most groups drop.
  const int C = uni(0, always_ntlb ? (S * k + E - 1) / E + 1 : S + 2);
  std::vector<double> probs(size_t(N) * E), norm(static_cast<size_t>(N));
  for (double& p : probs) p = uni(0, 3) == 0 ? 0.25 : std::uniform_real_distribution<double>(0, 1)(gen);
  std::vector<int> top(size_t(N) * k);
  std::vector<uint8_t> want(size_t(N) * k);
  const double decline = uni(0, 1) ? 0.3 : 0.0;
  for (int n = 0; n < N; ++n) {
    std::vector<int> order(E);
    for (int e = 0; e < E; ++e) order[e] = e;
    std::shuffle(order.begin(), order.end(), gen);
    for (int i = 0; i < k; ++i) {
      top[size_t(n) * k + i] = order[i];
      want[size_t(n) * k + i] = std::uniform_real_distribution<double>(0, 1)(gen) >= decline;
    }
    norm[n] = std::uniform_real_distribution<double>(0.5, 2)(gen);
  }
  std::vector<float> bias(static_cast<size_t>(E));
  for (float& b : bias) b = float(std::uniform_real_distribution<double>(-0.5, 0.5)(gen));
  const RouterTotalsLayout at{.E = E, .bins = Routing<double>::kPlacedBins};
  struct Out {
    std::vector<int> expert, slot, count, position;
    std::vector<double> gate;
    std::vector<uint8_t> dropped;
    std::vector<int64_t> stats;
  };
  // Filled with garbage first: every output must be written.
  auto make = [&] {
    return Out{std::vector<int>(size_t(N) * k, 77), std::vector<int>(size_t(N) * k, 77),
               std::vector<int>(size_t(G) * E, 77),  std::vector<int>(size_t(G) * E, 77),
               std::vector<double>(size_t(N) * k, 7.0), std::vector<uint8_t>(size_t(N) * k, 7),
               std::vector<int64_t>(size_t(G) * at.group_width(), 77)};
  };
  const bool ntlb = uni(0, 1) || always_ntlb, declined_takes_slot = uni(0, 1), with_bias = uni(0, 1);
  auto body = [&](Out& o) {
    return RouterAssignGroup<double>{.probs = probs.data(),
                                     .top = top.data(),
                                     .norm = norm.data(),
                                     .want = want.data(),
                                     .expert = o.expert.data(),
                                     .slot = o.slot.data(),
                                     .gate = o.gate.data(),
                                     .count = o.count.data(),
                                     .position = o.position.data(),
                                     .dropped = o.dropped.data(),
                                     .stats = o.stats.data(),
                                     .at = at,
                                     .S = S,
                                     .k = k,
                                     .E = E,
                                     .C = C,
                                     .ntlb = ntlb,
                                     .declined_takes_slot = declined_takes_slot,
                                     .bias = with_bias ? bias.data() : nullptr,
                                     .scale = 1.5};
  };
  Out ref = make(), scan = make();
  for (int g = 0; g < G; ++g) body(ref)(g);
  std::vector<int64_t> columns(size_t(G) * E);
  for (size_t i = 0; i < columns.size(); ++i) columns[i] = int64_t(i);
  std::shuffle(columns.begin(), columns.end(), gen);
  const RouterSlotsByScan<double> by_scan{body(scan)};
  for (int64_t ge : columns) by_scan(ge);
  for (int g = G; g-- > 0;) RouterAssignRest<double>{body(scan)}(g);
  INFO("E=" << E << " k=" << k << " S=" << S << " G=" << G << " C=" << C << " ntlb=" << ntlb
                << " declined_takes_slot=" << declined_takes_slot);
  REQUIRE(scan.expert == ref.expert);
  REQUIRE(scan.slot == ref.slot);
  REQUIRE(scan.gate == ref.gate);
  REQUIRE(scan.count == ref.count);
  REQUIRE(scan.position == ref.position);
  REQUIRE(scan.dropped == ref.dropped);
  REQUIRE(scan.stats == ref.stats);
  for (int g = 0; g < G; ++g) {
    const int64_t* st = ref.stats.data() + size_t(g) * at.group_width();
    trials.dropped += st[2] > 0, trials.declined += st[1] > 0, trials.rerouted += st[3] > 0;
  }
}

}  // namespace

TEST_CASE("moe routing control by prefix sums (RouterSlotsByScan, RouterAssignRest) equals RouterAssignGroup bitwise",
          "[moe]") {
  std::mt19937 gen(31);
  ControlTrials trials;
  for (int trial = 0; trial < 400; ++trial) {
    INFO("trial " << trial);
    compare_routing_control(gen, 24, false, trials);
  }
  // The trials reach what they claim to compare.
  CHECK(trials.dropped > 50);
  CHECK(trials.declined > 50);
  CHECK(trials.rerouted > 50);
}

TEST_CASE("moe No-Token-Left-Behind by a warp per group (RouterAssignRest) equals the serial reroute bitwise", "[moe]") {
  // NTLB in every routing, up to 80 experts: a lane ranks 1 to 3 experts (or none), and the
  // lanes' reduction picks the choice's expert.
  std::mt19937 gen(47);
  ControlTrials trials;
  for (int trial = 0; trial < 400; ++trial) {
    INFO("trial " << trial);
    compare_routing_control(gen, 80, true, trials);
  }
  CHECK(trials.dropped > 300);
  CHECK(trials.rerouted > 300);
}
