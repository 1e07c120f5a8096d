// The row bodies of for_each_row (tensor/launch_rows.hpp) on an emulated warp: 32 host threads,
// one per lane, that exchange their partials through shared slots between barriers, in the
// butterfly order that WarpLanes (tensor/launch_rows_cuda.cuh) shuffles in. This checks each
// body's half of the contract, which the host's single lane cannot: every element owned by one
// lane, each reduction complete before the pass that uses it, a row's scalars written by the
// leader, a sync wherever a lane reads what another wrote. The results equal the host's to
// rounding (the sums run in another order), and every lane gets the bitwise same reduction.
// [cuda] with a GPU: the same cases on the row kernels themselves, against the host, and bitwise
// the same on a second run; without a GPU that case WARNs "skipped" and checks nothing.
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
#include "optim/optimizer_bodies.hpp"
#include "tensor/deferred_device.hpp"
#include "tensor/device.hpp"
#include "tensor/elementwise.hpp"
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
void on_emulated_warp(int64_t rows, const Body& body) {
  EmulatedWarp warp;
  warp.run(rows, body);
  CHECK_FALSE(warp.lanes_disagreed.load());
}

// Deferred: the host's lane under the deferred host device (tensor/device.hpp) with device memory's
// rule (DeviceAccess::Copies), which checks that the cases reach their Buffers only through the
// transfer copies, as they must on the GPU.
enum class Where { Host, EmulatedWarp, Gpu, Deferred };

bool gpu_available() { return cuda_compiled() && cuda_device_count() > 0; }

// While it lives, Buffers come from the GPU's arena and for_each_row launches row kernels, when
// `where` is the GPU. Declared before a case's Buffers, so that they are freed inside it.
struct DeviceScope {
  explicit DeviceScope(Where where) : gpu(where == Where::Gpu), deferred(where == Where::Deferred) {
    if (deferred) set_deferred_host_device(true, DeviceAccess::Copies);
    if (!gpu) return;
    cuda_bind(0);
    set_device(Device::Cuda);
  }
  ~DeviceScope() {
    if (gpu) set_device(Device::Cpu);
    if (deferred) set_deferred_host_device(false);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  bool gpu, deferred;
};

// The bodies one after the other: for_each_row on the current device (host or GPU), or the
// emulated warp.
template <class... Bodies>
void run_rows(Where where, int64_t rows, const Bodies&... bodies) {
  if (where == Where::EmulatedWarp)
    (on_emulated_warp(rows, bodies), ...);
  else
    (for_each_row(rows, bodies, 1), ...);
}

template <typename T>
std::vector<T> random_values(size_t n, std::mt19937& gen, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = T(u(gen));
  return v;
}
template <typename T>
Buffer<T> random_buffer(size_t n, std::mt19937& gen, double lo = -1, double hi = 1) {
  const std::vector<T> v = random_values<T>(n, gen, lo, hi);
  return Buffer<T>(v.begin(), v.end());  // uploaded on the device
}

// A case's results, each array widened to double (exactly).
using Outputs = std::vector<std::vector<double>>;

template <class T>
std::vector<double> widened(const Buffer<T>& b) {
  const std::vector<T> host = download(b);
  return {host.begin(), host.end()};
}
template <class... Arrays>
Outputs outputs(const Arrays&... arrays) {
  return {widened(arrays)...};
}

// |b - a| <= tol (1 + |a|) everywhere, a the host's.
void check_close(const Outputs& b, const Outputs& a, double tol) {
  REQUIRE(b.size() == a.size());
  for (size_t k = 0; k < a.size(); ++k) {
    REQUIRE(b[k].size() == a[k].size());
    double worst = 0;
    for (size_t i = 0; i < a[k].size(); ++i)
      worst = std::max(worst, std::abs(b[k][i] - a[k][i]) / (1 + std::abs(a[k][i])));
    INFO("output " << k << ": worst relative difference " << worst);
    CHECK(worst <= tol);
  }
}

// Row lengths below, at and across the warp's width, and a long one.
const int kRowLengths[] = {5, 32, 77, 1000};

template <typename T>
Outputs layernorm_rows(Where where, int M) {
  DeviceScope scope(where);
  std::mt19937 gen(3);
  const int N = 6;
  const auto x = random_buffer<T>(size_t(N) * M, gen, -2, 3), gain = random_buffer<T>(M, gen);
  const auto bias = random_buffer<T>(M, gen), dy = random_buffer<T>(size_t(N) * M, gen);
  auto dx = random_buffer<T>(size_t(N) * M, gen);
  Buffer<T> xhat(x.size()), y(x.size()), rstd(N);
  run_rows(where, N, LayerNormForwardRow<T>{x.data(), gain.data(), bias.data(), xhat.data(), rstd.data(), y.data(), M, T(1e-5)},
           LayerNormBackwardRow<T>{dy.data(), xhat.data(), rstd.data(), gain.data(), dx.data(), M});
  return outputs(xhat, y, rstd, dx);
}

// Packed examples: three in the first sequence, two in the second (none when !segments).
template <typename T>
Outputs causal_softmax_rows(Where where, int Tq, bool segments) {
  DeviceScope scope(where);
  std::mt19937 gen(5);
  const int B = 2, heads = 2;
  std::vector<int32_t> segment_values(size_t(B) * Tq);
  for (int t = 0; t < Tq; ++t)
    segment_values[t] = t < Tq / 2 ? 0 : t < Tq - 7 ? 1 : 2, segment_values[Tq + t] = t < 33 ? 4 : 5;
  const Buffer<int32_t> segment(segment_values.begin(), segment_values.end());
  const int64_t rows = int64_t(B) * heads * Tq;
  auto P = random_buffer<T>(size_t(rows) * Tq, gen, -3, 3), dP = random_buffer<T>(P.size(), gen);
  // The bf16 copies the rows write beside P and dS (bf16 GEMM operands on a device): bitwise
  // bf16_bits of the values written, every element (the zeros above the diagonal too).
  Buffer<uint16_t> P16(P.size(), uint16_t(0xffff)), dS16(P.size(), uint16_t(0xffff));
  run_rows(where, rows, AttentionCausalSoftmaxRow<T>{P.data(), segments ? segment.data() : nullptr, Tq, heads, P16.data()},
           AttentionCausalSoftmaxBackwardRow<T>{P.data(), dP.data(), Tq, dS16.data()});
  const std::vector<T> p = download(P), ds = download(dP);
  const std::vector<uint16_t> p16 = download(P16), ds16 = download(dS16);
  size_t bad = 0;
  for (size_t i = 0; i < p.size(); ++i) bad += p16[i] != bf16_bits(float(p[i])) || ds16[i] != bf16_bits(float(ds[i]));
  CHECK(bad == 0);
  return outputs(P, dP);
}

// Two sequences; the last query of the first has an example without keys (an all-zero row).
template <typename T>
Outputs masked_softmax_rows(Where where, int Tk, bool segments) {
  DeviceScope scope(where);
  std::mt19937 gen(7);
  const int B = 2, heads = 3, Tq = 4;
  std::vector<int32_t> q(size_t(B) * Tq), k(size_t(B) * Tk);
  for (int i = 0; i < Tq; ++i) q[i] = i < 2 ? 0 : i < 3 ? 1 : 9, q[Tq + i] = 2;
  for (int j = 0; j < Tk; ++j) k[j] = j < Tk / 2 ? 0 : 1, k[Tk + j] = 2;
  const Buffer<int32_t> qseg(q.begin(), q.end()), kseg(k.begin(), k.end());
  const int64_t rows = int64_t(B) * heads * Tq;
  auto P = random_buffer<T>(size_t(rows) * Tk, gen, -3, 3), dP = random_buffer<T>(P.size(), gen);
  run_rows(where, rows,
           AttentionMaskedSoftmaxRow<T>{P.data(), segments ? qseg.data() : nullptr, segments ? kseg.data() : nullptr,
                                        Tq, Tk, heads},
           AttentionSoftmaxBackwardRow<T>{P.data(), dP.data(), Tk});
  Outputs out = outputs(P, dP);
  if (segments)
    for (int j = 0; j < Tk; ++j) CHECK(out[0][size_t(Tq - 1) * Tk + j] == 0.0);
  return out;
}

// The fused forward and gradient (in place over the logits), plain or with soft targets, and the
// teacher's softmax.
template <typename T>
Outputs cross_entropy_rows(Where where, int V, bool distill) {
  DeviceScope scope(where);
  std::mt19937 gen(11);
  const int N = 7;
  const auto logits = random_buffer<T>(size_t(N) * V, gen, -4, 4);
  std::vector<T> soft_values = random_values<T>(logits.size(), gen, 0, 1);  // rows summing to about 1, not exactly
  for (auto& p : soft_values) p *= T(2.0 / V);
  std::vector<T> mask_values(N, T(1));
  std::vector<int32_t> target_values(N);
  for (int n = 0; n < N; ++n) target_values[n] = (5 * n + 2) % V;
  mask_values[3] = 0;
  target_values[3] = -1;
  const Buffer<T> soft(soft_values.begin(), soft_values.end()), mask(mask_values.begin(), mask_values.end());
  const Buffer<int32_t> targets(target_values.begin(), target_values.end());
  const T weight = T(0.3), alpha = T(0.4);
  Buffer<T> lse(N), psum(N), probs(logits.size()), d = logits;
  Buffer<double> loss(N), hard(N), soft_loss(N);
  const CrossEntropyBackwardElement<T> backward{d.data(), lse.data(), mask.data(), targets.data(), d.data(), weight, V,
                                                distill ? soft.data() : nullptr, distill ? psum.data() : nullptr, alpha};
  run_rows(where, N, SoftmaxRow<T>{logits.data(), probs.data(), V});
  if (distill) {
    const SoftTargetForwardRow<T> fwd{d.data(),   mask.data(), soft.data(), targets.data(), lse.data(), psum.data(),
                                      loss.data(), hard.data(), soft_loss.data(), alpha, V};
    run_rows(where, N, CrossEntropyWithGradientRow<SoftTargetForwardRow<T>, T>{fwd, backward});
  } else {
    const CrossEntropyForwardRow<T> fwd{d.data(), mask.data(), targets.data(), lse.data(), loss.data(), V};
    run_rows(where, N, CrossEntropyWithGradientRow<CrossEntropyForwardRow<T>, T>{fwd, backward});
  }
  Outputs out = outputs(probs, lse, psum, loss, hard, soft_loss, d);
  CHECK(out.back() != widened(logits));
  return out;
}

// Every case at `where` against the host; on the GPU also run twice, bitwise the same.
void check_cases_at(Where where) {
  const auto check = [where](const auto& run_case, double tol) {
    const Outputs at = run_case(where);
    check_close(at, run_case(Where::Host), tol);
    if (where == Where::Gpu) CHECK(run_case(where) == at);
  };
  for (const int M : kRowLengths) {
    INFO("row length " << M);
    check([M](Where w) { return layernorm_rows<double>(w, M); }, 1e-12);
    check([M](Where w) { return layernorm_rows<float>(w, M); }, 1e-5);
    for (const bool segments : {false, true}) {
      INFO("segments " << segments);
      check([M, segments](Where w) { return masked_softmax_rows<double>(w, M, segments); }, 1e-12);
      check([M, segments](Where w) { return masked_softmax_rows<float>(w, M, segments); }, 1e-5);
    }
    for (const bool distill : {false, true}) {
      INFO("soft targets " << distill);
      check([M, distill](Where w) { return cross_entropy_rows<double>(w, M, distill); }, 1e-12);
      check([M, distill](Where w) { return cross_entropy_rows<float>(w, M, distill); }, 1e-5);
    }
  }
  for (const int Tq : {5, 45, 130}) {  // queries both sides of the warp's width
    INFO("Tq " << Tq);
    for (const bool segments : {false, true}) {
      INFO("segments " << segments);
      check([Tq, segments](Where w) { return causal_softmax_rows<double>(w, Tq, segments); }, 1e-12);
      check([Tq, segments](Where w) { return causal_softmax_rows<float>(w, Tq, segments); }, 1e-5);
    }
  }
}

}  // namespace

TEST_CASE("row lanes: every row body on an emulated warp equals the host's single lane", "[row_lanes][layers]") {
  check_cases_at(Where::EmulatedWarp);
}

TEST_CASE("row lanes: the chunk reductions (gradient norm, finite check) on an emulated warp", "[row_lanes][layers]") {
  // Three whole chunks and a partial one; a NaN and an Inf in the third.
  const int64_t n = 3 * SumSquaresChunk<float>::kChunk + 77, chunks = 4;
  std::mt19937 gen(13);
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(gen);
  std::vector<double> host(chunks), warp(chunks);
  for (int64_t c = 0; c < chunks; ++c) SumSquaresChunk<float>{v.data(), n, host.data()}(c, HostLanes{});
  on_emulated_warp(chunks, SumSquaresChunk<float>{v.data(), n, warp.data()});
  for (int64_t c = 0; c < chunks; ++c) CHECK(std::abs(warp[size_t(c)] - host[size_t(c)]) <= 1e-12 * host[size_t(c)]);
  v[size_t(2 * FlagNonFiniteChunk<float>::kChunk + 5)] = std::nanf("");
  v[size_t(2 * FlagNonFiniteChunk<float>::kChunk + 4000)] = INFINITY;
  std::vector<int32_t> bad(chunks, -1);
  on_emulated_warp(chunks, FlagNonFiniteChunk<float>{v.data(), n, bad.data()});
  CHECK(bad == std::vector<int32_t>{0, 0, 1, 0});
}

TEST_CASE("row lanes: the cases reach their Buffers only through the transfer copies", "[row_lanes][deferred]") {
  // Bitwise the host's results: the same arithmetic, queued (tensor/device.hpp).
  for (const int M : kRowLengths) {
    INFO("row length " << M);
    CHECK(layernorm_rows<float>(Where::Deferred, M) == layernorm_rows<float>(Where::Host, M));
    CHECK(masked_softmax_rows<float>(Where::Deferred, M, true) == masked_softmax_rows<float>(Where::Host, M, true));
    for (const bool distill : {false, true})
      CHECK(cross_entropy_rows<float>(Where::Deferred, M, distill) == cross_entropy_rows<float>(Where::Host, M, distill));
  }
  CHECK(causal_softmax_rows<float>(Where::Deferred, 45, true) == causal_softmax_rows<float>(Where::Host, 45, true));
}

TEST_CASE("row lanes: the row kernels on the GPU equal the host and repeat bitwise", "[row_lanes][cuda]") {
  if (!gpu_available()) {
    WARN("skipped: no GPU");
    return;
  }
  check_cases_at(Where::Gpu);
}
