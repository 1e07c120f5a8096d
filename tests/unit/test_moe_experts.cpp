// The MoE experts as grouped GEMMs (model/moe/experts.cpp, tensor/blas.hpp gemm_grouped): bitwise
// the loop of one GEMM per expert they replace, a fixed number of device launches per forward
// and backward whatever the number of local experts, and with bf16 copies no GEMM rounding.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "../test_util.hpp"
#include "model/activation.hpp"
#include "model/moe/experts.hpp"
#include "tensor/bf16.hpp"
#include "tensor/blas.hpp"
#include "tensor/deferred_device.hpp"
#include "test_moe_util.hpp"

using namespace meshmoe;
using namespace meshmoe::test;

namespace {

MoeOptions expert_options(int E, Activation act) {
  MoeOptions o = small_moe(RouterKind::Top1, act);
  o.num_experts = E;
  return o;
}

std::vector<float> normal_floats(size_t n, uint32_t seed) {
  const std::vector<double> v = normal_vector(n, seed);
  return std::vector<float>(v.begin(), v.end());
}

struct ExpertsHarness {
  ParamStore<float> store;
  Experts<float> experts;
  explicit ExpertsHarness(const MoeOptions& o) : experts(o) {
    experts.declare(store, "e");
    store.allocate();
    store.init(5, 1.0);
  }
};

// The loop the grouped calls replace: per expert, x W_in, the activation, h W_out; backward's four
// GEMMs per expert likewise (no dropout). Returns y; dx and the gradients added into dx, g_in, g_out.
std::vector<float> per_expert_loop(const MoeOptions& o, const float* w_in, const float* w_out, const std::vector<float>& x,
                                   const std::vector<int>& rows, const std::vector<float>& dy, std::vector<float>& dx,
                                   std::vector<float>& g_in, std::vector<float>& g_out) {
  const int M = o.d_model, H = o.d_ff, W = activation_in_width(o.activation, H);
  std::vector<float> y(x.size(), 0.f);
  size_t r0 = 0;
  for (size_t e = 0; e < rows.size(); ++e) {
    const int R = rows[e];
    if (R == 0) continue;
    std::vector<float> pre(size_t(R) * W), h(size_t(R) * H), dh(size_t(R) * H), dpre(size_t(R) * W);
    const float *wi = w_in + e * M * W, *wo = w_out + e * H * M;
    matmul(false, false, R, W, M, &x[r0 * M], wi, pre.data());
    activation_forward(o.activation, pre.data(), h.data(), R, H);
    matmul(false, false, R, M, H, h.data(), wo, &y[r0 * M]);
    matmul(true, false, H, M, R, h.data(), &dy[r0 * M], &g_out[e * H * M], true);
    matmul(false, true, R, H, M, &dy[r0 * M], wo, dh.data());
    activation_backward(o.activation, pre.data(), dh.data(), dpre.data(), R, H);
    matmul(true, false, M, W, R, &x[r0 * M], dpre.data(), &g_in[e * M * W], true);
    matmul(false, true, R, M, W, dpre.data(), wi, &dx[r0 * M], true);
    r0 += size_t(R);
  }
  return y;
}

}  // namespace

TEST_CASE("moe experts: the grouped GEMMs equal one GEMM per expert bitwise (rows differ or not, fp32 and bf16)",
          "[moe]") {
  struct Case {
    Activation act;
    std::vector<int> rows;
    Precision precision;
  };
  const std::vector<Case> cases = {{Activation::Relu, {3, 0, 7, 1}, Precision::Fp32},
                                   {Activation::Swiglu, {5, 5, 5}, Precision::Fp32},
                                   {Activation::Geglu, {0, 9, 2, 4, 0}, Precision::Bf16},
                                   {Activation::Gelu, {6, 6}, Precision::Bf16}};
  for (const Case& c : cases) {
    INFO("activation " << int(c.act) << ", " << c.rows.size() << " experts, precision " << int(c.precision));
    GemmPrecisionScope precision(c.precision);
    const MoeOptions o = expert_options(int(c.rows.size()), c.act);
    ExpertsHarness hs(o);
    Experts<float>& ex = hs.experts;
    int total = 0;
    for (int r : c.rows) total += r;
    const int M = o.d_model;
    const std::vector<float> x = normal_floats(size_t(total) * M, 1), dy = normal_floats(size_t(total) * M, 2);
    std::vector<int64_t> tokens(static_cast<size_t>(total));
    for (int i = 0; i < total; ++i) tokens[size_t(i)] = i;
    StepContext ctx;
    ctx.training = true;
    // dx and the gradients start nonzero: backward adds into them.
    std::vector<float> y(x.size()), dx = normal_floats(x.size(), 3);
    std::vector<float> g_in = normal_floats(ex.w_in.size, 4), g_out = normal_floats(ex.w_out.size, 5);
    std::copy(g_in.begin(), g_in.end(), ex.w_in.g);
    std::copy(g_out.begin(), g_out.end(), ex.w_out.g);
    ex.forward(ctx, x.data(), y.data(), c.rows, tokens.data());
    ex.backward(ctx, dy.data(), dx.data());

    std::vector<float> dx_ref = normal_floats(x.size(), 3);
    const std::vector<float> y_ref = per_expert_loop(o, ex.w_in.w, ex.w_out.w, x, c.rows, dy, dx_ref, g_in, g_out);
    CHECK(y == y_ref);
    CHECK(dx == dx_ref);
    CHECK(std::vector<float>(ex.w_in.g, ex.w_in.g + ex.w_in.size) == g_in);
    CHECK(std::vector<float>(ex.w_out.g, ex.w_out.g + ex.w_out.size) == g_out);
  }
}

TEST_CASE("moe experts: a forward and a backward queue as much device work with 8 local experts as with 1",
          "[moe][device][deferred]") {
  // Per pass: the launches of each expert count (GEMMs, activation, dropout scale) as device work
  // queued on the deferred host device, after a first pass that sized the Buffers.
  auto queued = [](int E, double dropout) {
    test::DeferredHostDevice guard;
    MoeOptions o = expert_options(E, Activation::Swiglu);
    o.expert_dropout = dropout;
    ExpertsHarness hs(o);
    const int R = 4, M = o.d_model;
    Buffer<float> x(size_t(E) * R * M, 0.5f), y(x.size()), dy(x.size(), 0.25f), dx(x.size());
    Buffer<int64_t> tokens(size_t(E) * R, 1);
    StepContext ctx;
    ctx.training = true;
    std::vector<size_t> work;
    for (int pass = 0; pass < 2; ++pass) {
      device_synchronize();
      const size_t before = deferred_host_work_queued();
      hs.experts.forward(ctx, x.data(), y.data(), R, tokens.data());
      const size_t after_forward = deferred_host_work_queued();
      hs.experts.backward(ctx, dy.data(), dx.data());
      work = {after_forward - before, deferred_host_work_queued() - after_forward};
    }
    device_synchronize();
    return work;
  };
  const std::vector<size_t> one = queued(1, 0.0);
  CHECK(one[0] > 0);
  CHECK(one[1] > 0);
  CHECK(queued(2, 0.0) == one);
  CHECK(queued(8, 0.0) == one);
  // Expert dropout is keyed by the expert: its scale stays a launch per expert.
  const std::vector<size_t> dropout_one = queued(1, 0.1), dropout_eight = queued(8, 0.1);
  CHECK(dropout_eight[0] == dropout_one[0] + 7);
  CHECK(dropout_eight[1] == dropout_one[1]);
}

TEST_CASE("moe experts: with bf16 copies the grouped GEMMs round nothing and give the host's per-GEMM rounding bitwise",
          "[moe][device][deferred][bf16]") {
  // On the deferred host device (the GPU's side: tensor/blas.hpp bf16_operand_copies) every operand
  // of the experts' 6 grouped GEMM roles comes from a bf16 copy: the weights' from the store
  // (ParamStore::weights16), x's from the caller (as a dispatcher's gather writes it) or kept with x,
  // h's from the activation's kernel (or the dropout scale's), dy's and dpre's rounded once each
  // (round_to_bf16). Each group reads its copies in the host loop that stands for the GPU's one
  // grouped call (cuda_gemm_grouped_bf16): 12 operands per expert with rows, none rounded. The
  // oracle: the same layer on the host, which rounds every operand per GEMM (and, without dropout,
  // the loop of one bf16 GEMM per expert, per_expert_loop): the same bits.
  struct Case {
    Activation act;
    std::vector<int> rows;
    double dropout;
    bool given_x16;
  };
  const std::vector<Case> cases = {{Activation::Geglu, {0, 9, 2, 4, 0}, 0.0, true},
                                   {Activation::Gelu, {3, 1, 6}, 0.2, true},
                                   {Activation::Swiglu, {5, 0, 2}, 0.0, false}};
  const GemmPrecisionScope bf16(Precision::Bf16);
  for (const Case& c : cases) {
    INFO("activation " << int(c.act) << ", " << c.rows.size() << " experts, dropout " << c.dropout << ", x16 given "
                       << c.given_x16);
    MoeOptions o = expert_options(int(c.rows.size()), c.act);
    o.expert_dropout = c.dropout;
    int total = 0, with_rows = 0;
    for (int r : c.rows) total += r, with_rows += r > 0;
    const int M = o.d_model;
    const std::vector<float> x = normal_floats(size_t(total) * M, 1), dy = normal_floats(size_t(total) * M, 2),
                             dx0 = normal_floats(x.size(), 3);
    std::vector<int64_t> tokens(static_cast<size_t>(total));
    for (int i = 0; i < total; ++i) tokens[size_t(i)] = 3 * i + 1;
    StepContext ctx;
    ctx.training = true;
    ctx.seed = 7;
    struct Out {
      std::vector<float> y, dx, g_in, g_out;
    };
    Out host;
    std::vector<float> w_in, w_out;
    {
      ExpertsHarness hs(o);
      Experts<float>& ex = hs.experts;
      host.y.resize(x.size());
      host.dx = dx0;
      ex.forward(ctx, x.data(), host.y.data(), c.rows, tokens.data());
      ex.backward(ctx, dy.data(), host.dx.data());
      host.g_in.assign(ex.w_in.g, ex.w_in.g + ex.w_in.size);
      host.g_out.assign(ex.w_out.g, ex.w_out.g + ex.w_out.size);
      w_in.assign(ex.w_in.w, ex.w_in.w + ex.w_in.size);
      w_out.assign(ex.w_out.w, ex.w_out.w + ex.w_out.size);
    }
    Out dev;
    Bf16OperandCounts before, after;
    {
      DeferredHostDevice guard(DeviceAccess::Copies);
      ExpertsHarness hs(o);
      Experts<float>& ex = hs.experts;
      std::vector<uint16_t> x16_host(x.size());
      for (size_t i = 0; i < x.size(); ++i) x16_host[i] = bf16_bits(x[i]);
      const Buffer<float> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end());
      const Buffer<uint16_t> x16(x16_host.begin(), x16_host.end());
      const Buffer<int64_t> tok(tokens.begin(), tokens.end());
      Buffer<float> y(x.size()), dx(dx0.begin(), dx0.end());
      device_synchronize();
      before = bf16_operand_counts();
      ex.forward(ctx, xd.data(), y.data(), c.rows, tok.data(), c.given_x16 ? x16.data() : nullptr);
      ex.backward(ctx, dyd.data(), dx.data());
      device_synchronize();
      after = bf16_operand_counts();
      dev.y = download(y);
      dev.dx = download(dx);
      dev.g_in.resize(ex.w_in.size);
      dev.g_out.resize(ex.w_out.size);
      copy_to_host(dev.g_in.data(), ex.w_in.g, dev.g_in.size() * sizeof(float));
      copy_to_host(dev.g_out.data(), ex.w_out.g, dev.g_out.size() * sizeof(float));
    }
    CHECK(after.rounded == before.rounded);  // no GEMM rounds an operand
    CHECK(after.from_copies - before.from_copies == size_t(12 * with_rows));
    CHECK(after.copies_rounded - before.copies_rounded == 2);  // dy's and dpre's
    CHECK(dev.y == host.y);
    CHECK(dev.dx == host.dx);
    CHECK(dev.g_in == host.g_in);
    CHECK(dev.g_out == host.g_out);
    if (c.dropout == 0) {
      std::vector<float> dx_ref = dx0, g_in(w_in.size(), 0.f), g_out(w_out.size(), 0.f);
      CHECK(per_expert_loop(o, w_in.data(), w_out.data(), x, c.rows, dy, dx_ref, g_in, g_out) == dev.y);
      CHECK(dx_ref == dev.dx);
      CHECK(g_in == dev.g_in);
      CHECK(g_out == dev.g_out);
    }
  }
}
