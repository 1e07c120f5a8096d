// The row bodies of for_each_row (tensor/launch_rows.hpp) on an emulated warp: 32 host threads,
// one per lane, that exchange their partials through shared slots between barriers, in the
// butterfly order that WarpLanes (tensor/launch_rows_cuda.cuh) shuffles in. No GPU here: this
// checks each body's half of the contract, which the host's single lane cannot: every element
// owned by one lane, each reduction complete before the pass that uses it, a row's scalars written
// by the leader, a sync wherever a lane reads what another wrote. The results equal the host's to
// rounding (the sums run in another order), and every lane gets the bitwise same reduction.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "model/attention_bodies.hpp"
#include "model/cross_entropy_bodies.hpp"
#include "model/layernorm_bodies.hpp"
#include "tensor/launch_rows.hpp"

using namespace meshmoe;

namespace {

constexpr int kLanes = 32;

class EmulatedWarp;

struct EmulatedWarpLanes {
  int first;
  EmulatedWarp* warp;
  static constexpr int step = kLanes;
  template <typename T>
  T sum(T partial) const {
    return reduce(partial, RowSum{});
  }
  template <typename T>
  T max(T partial) const {
    return reduce(partial, RowMax{});
  }
  template <typename T, class Combine>
  T reduce(T partial, const Combine& combine) const;
  bool leader() const { return first == 0; }
  void sync() const;
};

// One warp: lane l runs on thread l, every row in turn (a warp's grid-stride loop).
class EmulatedWarp {
 public:
  template <class Body>
  void run(int64_t rows, const Body& body) {
    std::vector<std::jthread> lanes;
    for (int l = 0; l < kLanes; ++l)
      lanes.emplace_back([this, l, rows, &body] {
        for (int64_t n = 0; n < rows; ++n) body(n, EmulatedWarpLanes{l, this});
      });
  }
  // Lane `lane` hands over its partial and gets the one of lane ^ offset (__shfl_xor_sync).
  template <typename T>
  T exchange(int lane, T partial, int offset) {
    static_assert(sizeof(T) <= sizeof(Slot));
    std::memcpy(slots_[lane].bytes, &partial, sizeof(T));
    barrier_.arrive_and_wait();
    T other;
    std::memcpy(&other, slots_[lane ^ offset].bytes, sizeof(T));
    barrier_.arrive_and_wait();
    return other;
  }
  // Records whether every lane holds the bitwise same reduction result.
  template <typename T>
  void check_agreement(int lane, T result) {
    const T lane0 = exchange(lane, result, lane);  // lane ^ lane = 0
    if (std::memcmp(&lane0, &result, sizeof(T)) != 0) lanes_disagreed = true;
  }
  void sync() { barrier_.arrive_and_wait(); }

  std::atomic<bool> lanes_disagreed{false};

 private:
  struct Slot {
    alignas(8) unsigned char bytes[8];
  };
  std::barrier<> barrier_{kLanes};
  Slot slots_[kLanes];
};

template <typename T, class Combine>
T EmulatedWarpLanes::reduce(T partial, const Combine& combine) const {
  const auto exchange = [this](T p, int offset) { return warp->exchange(first, p, offset); };
  const T result = butterfly<kLanes>(partial, exchange, combine);
  warp->check_agreement(first, result);
  return result;
}

void EmulatedWarpLanes::sync() const { warp->sync(); }

template <class Body>
void on_host(int64_t rows, const Body& body) {
  for (int64_t n = 0; n < rows; ++n) body(n, HostLanes{});
}

template <class Body>
void on_emulated_warp(int64_t rows, const Body& body) {
  EmulatedWarp warp;
  warp.run(rows, body);
  CHECK_FALSE(warp.lanes_disagreed.load());
}

// The bodies one after the other, on the host's one lane or on the emulated warp.
template <class... Bodies>
void run_rows(bool warp, int64_t rows, const Bodies&... bodies) {
  ((warp ? on_emulated_warp(rows, bodies) : on_host(rows, bodies)), ...);
}

template <typename T>
std::vector<T> random_vec(size_t n, std::mt19937& gen, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = T(u(gen));
  return v;
}

// |warp - host| <= tol (1 + |host|) everywhere.
template <typename T>
void check_close(const std::vector<T>& warp, const std::vector<T>& host, double tol) {
  REQUIRE(warp.size() == host.size());
  double worst = 0;
  for (size_t i = 0; i < host.size(); ++i)
    worst = std::max(worst, std::abs(double(warp[i]) - double(host[i])) / (1 + std::abs(double(host[i]))));
  INFO("worst relative difference " << worst);
  CHECK(worst <= tol);
}

// Row lengths below, at and across the warp's width.
const int kRowLengths[] = {5, 32, 77};

}  // namespace

TEST_CASE("row lanes: layernorm rows on an emulated warp equal the host's", "[row_lanes][layers]") {
  std::mt19937 gen(3);
  for (const int M : kRowLengths) {
    INFO("M = " << M);
    const int N = 6;
    const auto x = random_vec<double>(size_t(N) * M, gen, -2, 3), gain = random_vec<double>(M, gen);
    const auto bias = random_vec<double>(M, gen), dy = random_vec<double>(size_t(N) * M, gen);
    const auto dx0 = random_vec<double>(size_t(N) * M, gen);
    std::vector<double> xhat[2], rstd[2], y[2], dx[2];
    for (int w = 0; w < 2; ++w) {
      xhat[w].assign(x.size(), 0);
      y[w].assign(x.size(), 0);
      rstd[w].assign(N, 0);
      dx[w] = dx0;
      const LayerNormForwardRow<double> fwd{x.data(), gain.data(), bias.data(), xhat[w].data(), rstd[w].data(),
                                            y[w].data(), M, 1e-5};
      const LayerNormBackwardRow<double> bwd{dy.data(), xhat[w].data(), rstd[w].data(), gain.data(), dx[w].data(), M};
      run_rows(w == 1, N, fwd, bwd);
    }
    check_close(xhat[1], xhat[0], 1e-13);
    check_close(y[1], y[0], 1e-13);
    check_close(rstd[1], rstd[0], 1e-13);
    check_close(dx[1], dx[0], 1e-13);
  }
}

TEST_CASE("row lanes: causal softmax rows on an emulated warp equal the host's", "[row_lanes][attention]") {
  std::mt19937 gen(5);
  const int B = 2, heads = 2, T = 45;  // queries both sides of the warp's width
  std::vector<int32_t> segment(size_t(B) * T);
  for (int t = 0; t < T; ++t) segment[t] = t < 20 ? 0 : t < 38 ? 1 : 2, segment[T + t] = t < 33 ? 4 : 5;
  const int64_t rows = int64_t(B) * heads * T;
  const auto scores = random_vec<float>(size_t(rows) * T, gen, -3, 3), dP0 = random_vec<float>(scores.size(), gen);
  for (const int32_t* seg : {(const int32_t*)nullptr, (const int32_t*)segment.data()}) {
    INFO("segments " << (seg != nullptr));
    std::vector<float> P[2], dP[2];
    for (int w = 0; w < 2; ++w) {
      P[w] = scores;
      dP[w] = dP0;
      const AttentionCausalSoftmaxRow<float> fwd{P[w].data(), seg, T, heads};
      const AttentionCausalSoftmaxBackwardRow<float> bwd{P[w].data(), dP[w].data(), T};
      run_rows(w == 1, rows, fwd, bwd);
    }
    check_close(P[1], P[0], 1e-6);
    check_close(dP[1], dP[0], 1e-6);
  }
}

TEST_CASE("row lanes: masked softmax rows on an emulated warp equal the host's", "[row_lanes][attention]") {
  std::mt19937 gen(7);
  const int heads = 3, Tq = 4;
  for (const int Tk : kRowLengths) {
    INFO("Tk = " << Tk);
    // Two sequences; the last query of the first has an example without keys (an all-zero row).
    const int B = 2;
    std::vector<int32_t> qseg(size_t(B) * Tq), kseg(size_t(B) * Tk);
    for (int i = 0; i < Tq; ++i) qseg[i] = i < 2 ? 0 : i < 3 ? 1 : 9, qseg[Tq + i] = 2;
    for (int j = 0; j < Tk; ++j) kseg[j] = j < Tk / 2 ? 0 : 1, kseg[Tk + j] = 2;
    const int64_t rows = int64_t(B) * heads * Tq;
    const auto scores = random_vec<double>(size_t(rows) * Tk, gen, -3, 3), dP0 = random_vec<double>(scores.size(), gen);
    for (const bool segments : {false, true}) {
      INFO("segments " << segments);
      std::vector<double> P[2], dP[2];
      for (int w = 0; w < 2; ++w) {
        P[w] = scores;
        dP[w] = dP0;
        const AttentionMaskedSoftmaxRow<double> fwd{P[w].data(), segments ? qseg.data() : nullptr,
                                                    segments ? kseg.data() : nullptr, Tq, Tk, heads};
        const AttentionSoftmaxBackwardRow<double> bwd{P[w].data(), dP[w].data(), Tk};
        run_rows(w == 1, rows, fwd, bwd);
      }
      check_close(P[1], P[0], 1e-13);
      check_close(dP[1], dP[0], 1e-13);
      if (segments)  // the query without keys: a zero row
        for (int j = 0; j < Tk; ++j) CHECK(P[1][size_t(Tq - 1) * Tk + j] == 0.0);
    }
  }
}

TEST_CASE("row lanes: cross-entropy rows on an emulated warp equal the host's", "[row_lanes][layers][distill]") {
  std::mt19937 gen(11);
  for (const int V : kRowLengths) {
    INFO("V = " << V);
    const int N = 7;
    const auto logits = random_vec<float>(size_t(N) * V, gen, -4, 4);
    std::vector<float> soft(logits.size()), mask(N, 1.0f);
    on_host(N, SoftmaxRow<float>{random_vec<float>(logits.size(), gen, -2, 2).data(), soft.data(), V});
    std::vector<int32_t> targets(N);
    for (int n = 0; n < N; ++n) targets[n] = (5 * n + 2) % V;
    mask[3] = 0;
    targets[3] = -1;
    const float weight = 0.3f, alpha = 0.4f;
    for (const bool distill : {false, true}) {
      INFO("soft targets " << distill);
      // Per lane count: lse, psum, loss, hard, soft_loss, dlogits (the fused pass, in place), probs.
      std::vector<float> lse[2], psum[2], d[2], probs[2];
      std::vector<double> loss[2], hard[2], soft_loss[2];
      for (int w = 0; w < 2; ++w) {
        lse[w].assign(N, 0);
        psum[w].assign(N, 0);
        loss[w].assign(N, 0);
        hard[w].assign(N, 0);
        soft_loss[w].assign(N, 0);
        probs[w].assign(logits.size(), 0);
        d[w] = logits;
        const CrossEntropyBackwardElement<float> backward{d[w].data(), lse[w].data(), mask.data(), targets.data(),
                                                          d[w].data(), weight, V, distill ? soft.data() : nullptr,
                                                          distill ? psum[w].data() : nullptr, alpha};
        const SoftmaxRow<float> softmax{logits.data(), probs[w].data(), V};
        run_rows(w == 1, N, softmax);
        if (distill) {
          const SoftTargetForwardRow<float> fwd{d[w].data(), mask.data(), soft.data(), targets.data(), lse[w].data(),
                                                psum[w].data(), loss[w].data(), hard[w].data(), soft_loss[w].data(),
                                                alpha, V};
          run_rows(w == 1, N, CrossEntropyWithGradientRow<SoftTargetForwardRow<float>, float>{fwd, backward});
        } else {
          const CrossEntropyForwardRow<float> fwd{d[w].data(), mask.data(), targets.data(), lse[w].data(),
                                                  loss[w].data(), V};
          run_rows(w == 1, N, CrossEntropyWithGradientRow<CrossEntropyForwardRow<float>, float>{fwd, backward});
        }
      }
      check_close(probs[1], probs[0], 1e-6);
      check_close(lse[1], lse[0], 1e-6);
      check_close(psum[1], psum[0], 1e-6);
      check_close(loss[1], loss[0], 1e-5);
      check_close(hard[1], hard[0], 1e-5);
      check_close(soft_loss[1], soft_loss[0], 1e-5);
      check_close(d[1], d[0], 1e-6);
      CHECK(d[1] != logits);
    }
  }
}
