// The device layer (tensor/device.hpp, tensor/launch.hpp):
//  - every loop body of the model writes only what its index owns: the whole model (forward,
//    backward, every gradient, the losses) is bitwise the same with the host loops run backwards,
//    for dense, Switch and GShard configurations with dropout, jitter, random routing and NTLB;
//  - Buffers are freed the way they were allocated; host Buffers routed through an arena
//    (tensor/arena.hpp) give the same step bitwise and the memory plan's bytes hold it in one chunk;
//  - [cuda] with a GPU: cuBLAS GEMMs against OpenBLAS, and the whole model on the GPU against the
//    host model (fp32: relative 1e-5 on losses, 1e-4 on the gradient norm-wise; fp64: 1e-12), and
//    the same with model.precision = bf16 on both sides (cuBLAS bf16 GEMM against the host emulation).
//    Without a GPU these cases WARN "skipped" and check nothing;
//  - the executables set OPENBLAS_THREAD_TIMEOUT before OpenBLAS loads (tensor/host_threads.hpp):
//    after a threaded GEMM its idle threads sleep at once instead of spinning for ~0.1 s.
#include <catch2/catch.hpp>
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <thread>
#include <new>
#include <optional>
#include <random>
#include <vector>

#include "../test_util.hpp"
#include "../support/model_support.hpp"
#include "core/timers.hpp"
#include "mesh/mpi_comm.hpp"
#include "model/transformer.hpp"
#include "optim/adamw.hpp"
#include "tensor/bf16.hpp"
#include "tensor/blas.hpp"
#include "tensor/device.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/host_threads.hpp"
#include "tensor/launch.hpp"
#include "run/memory.hpp"
#include "test_moe_util.hpp"

using namespace meshmoe;

namespace {

// router: dense, top1, top2, or the gates "sigmoid" (top-3 by score + selection bias, routed scale
// 2.5, a shared expert: DeepSeek-V3's layer) and "softmax_topk" (top-1 with a gate of 1, scale 1.5);
// "top2+blocks": top-2 with the blocks of today's MoE models (docs/ARCHITECTURE.md "Blocks":
// RMSNorm, rotary positions, SwiGLU, the first block dense).
Config device_test_config(const std::string& router_and_blocks) {
  const bool blocks = router_and_blocks.ends_with("+blocks");
  const std::string router = router_and_blocks.substr(0, router_and_blocks.find('+'));
  if (router == "sigmoid" || router == "softmax_topk") {
    Config c = device_test_config(router == "sigmoid" ? "top2" : "top1");
    c.moe.gate = test::option<MoeGate>(router);
    c.moe.router = router == "sigmoid" ? RouterKind::TopK : RouterKind::Top1;
    c.moe.top_k = 3;
    c.moe.routed_scale = router == "sigmoid" ? 2.5 : 1.5;
    if (router == "sigmoid") c.moe.balance = BalanceKind::Bias, c.moe.z_loss_coef = 0, c.moe.shared_experts = 1;
    return c;
  }
  Config c;
  c.model.seq_len = 8;
  c.model.d_model = 16;
  c.model.num_layers = 2;
  c.model.num_heads = 2;
  c.model.d_ff = 24;
  c.model.activation = router == "top1" ? Activation::Geglu : Activation::Gelu;
  c.model.dropout = 0.1;
  c.moe.num_experts = 4;
  c.moe.every = router == "dense" ? 0 : 2;
  c.moe.router = router == "dense" ? RouterKind::Top2 : test::option<RouterKind>(router);
  c.moe.second_expert = SecondExpertPolicy::Random;
  c.moe.group_size = 8;
  c.moe.capacity_factor_train = 1.0;
  c.moe.jitter_eps = router == "top1" ? 0.01 : 0.0;
  c.moe.expert_dropout = 0.2;
  c.moe.z_loss_coef = 1e-3;
  c.moe.aux_loss_coef = 1e-2;
  c.moe.no_token_left_behind = router == "top2";
  if (blocks) {
    c.model.norm = NormKind::RmsNorm;
    c.model.position = PositionKind::Rope;
    c.model.activation = Activation::Swiglu;
    c.moe.every = 1;
    c.moe.first_dense = 1;
  }
  return c;
}

// Everything one training micro-step produces.
template <typename T>
struct StepResult {
  ForwardStats stats;
  std::vector<T> logits, grads;
  size_t experts_with_rows = 0;  // over the MoE layers: experts that got a token
};

// Experts of the model's MoE layers that got a token in the last forward (each is a group, 12
// operands, of the experts' grouped GEMMs of a step).
template <typename T>
size_t experts_with_rows(const Transformer<T>& model) {
  size_t n = 0;
  for (const MoeLayer<T>* l : model.moe_layers())
    for (const int64_t load : l->stats().load) n += load > 0;
  return n;
}

// run_step's micro-batch: B = 2 random sequences of the deck's length, a fifth of the tokens masked.
struct TestBatch {
  int B = 2, Tn;
  std::vector<int32_t> inputs, targets;
  std::vector<float> mask;
  TestBatch(const Config& cfg, int V) : Tn(int(cfg.model.seq_len)), inputs(B * Tn), targets(B * Tn), mask(B * Tn) {
    std::mt19937 rng(11);
    for (int i = 0; i < B * Tn; ++i) {
      inputs[i] = int32_t(rng() % V);
      targets[i] = int32_t(rng() % V);
      mask[i] = rng() % 5 == 0 ? 0.f : 1.f;
    }
  }
  MicroBatch micro_batch() const { return {B, Tn, inputs.data(), targets.data(), mask.data()}; }
  LossWeights weights(const Config& cfg) const {
    return {1.0 / 13, cfg.moe.aux_loss_coef / 2.0, cfg.moe.z_loss_coef / (B * Tn)};
  }
};

template <typename T>
StepResult<T> run_step(const Config& cfg, int V) {
  const TestBatch batch(cfg, V);
  Transformer<T> model(cfg, V);
  model.init(5, 1.0);
  const MicroBatch mb = batch.micro_batch();
  const StepContext ctx{42, 3, true, 0, nullptr};
  const LossWeights w = batch.weights(cfg);
  model.params().zero_grad();
  StepResult<T> r;
  r.stats = model.forward(ctx, mb, w);
  r.experts_with_rows = experts_with_rows(model);
  r.logits = download(model.logits());  // the host's copies of device results
  model.backward(ctx, w);
  r.grads.resize(model.params().size());
  copy_to_host(r.grads.data(), model.params().grads(), r.grads.size() * sizeof(T));
  return r;
}

// Three AdamW steps of `cfg` (run_step's batch) on the host or on the deferred device
// (DeviceAccess::Copies): the logits and weights after them, and each step's bf16 operand counts.
struct TrainedSteps {
  std::vector<float> weights, logits;
  std::vector<Bf16OperandCounts> steps;  // each step's counts
  std::vector<size_t> experts_with_rows;  // each step's (StepResult::experts_with_rows)
};
TrainedSteps train_steps(const Config& cfg, bool deferred) {
  const int V = 13;
  const TestBatch batch(cfg, V);
  std::optional<test::DeferredHostDevice> guard;
  if (deferred) guard.emplace(DeviceAccess::Copies);
  Transformer<float> model(cfg, V);
  model.init(5, 1.0);
  AdamW opt(model.params(), all_entries(model.params()), AdamWOptions{0.9, 0.95, 1e-8, 0.1});
  TrainedSteps r;
  for (int64_t t = 1; t <= 3; ++t) {
    device_synchronize();
    const Bf16OperandCounts c0 = bf16_operand_counts();
    const StepContext ctx{42, uint32_t(t), true, 0, nullptr};
    model.params().zero_grad();
    model.forward(ctx, batch.micro_batch(), batch.weights(cfg));
    r.experts_with_rows.push_back(experts_with_rows(model));
    model.backward(ctx, batch.weights(cfg));
    opt.step(model.params(), 1e-2, t);
    device_synchronize();
    const Bf16OperandCounts c1 = bf16_operand_counts();
    r.steps.push_back({c1.rounded - c0.rounded, c1.from_copies - c0.from_copies, c1.copies_rounded - c0.copies_rounded});
  }
  r.logits = download(model.logits());
  r.weights.resize(model.params().size());
  copy_to_host(r.weights.data(), model.params().weights(), r.weights.size() * sizeof(float));
  return r;
}

bool gpu_available() { return cuda_compiled() && cuda_device_count() > 0; }

struct OnGpu {  // RAII: Device::Cuda while it lives
  OnGpu() {
    cuda_bind(0);
    set_device(Device::Cuda);
  }
  ~OnGpu() { set_device(Device::Cpu); }
};

template <typename T>
double rel_norm_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += double(a[i] - b[i]) * double(a[i] - b[i]);
    n += double(b[i]) * double(b[i]);
  }
  return std::sqrt(d / std::max(n, 1e-300));
}

}  // namespace

TEST_CASE("device: the model is bitwise the same with every host loop run backwards", "[device]") {
  for (const std::string router : {"dense", "top1", "top2"}) {
    INFO("router " << router);
    const Config cfg = device_test_config(router);
    const StepResult<float> fwd = run_step<float>(cfg, 13);
    StepResult<float> rev;
    {
      test::HostLoopsReversed guard;
      rev = run_step<float>(cfg, 13);
    }
    CHECK(fwd.stats.ce_sum == rev.stats.ce_sum);
    CHECK(fwd.stats.aux_sum == rev.stats.aux_sum);
    CHECK(fwd.stats.z_sum == rev.stats.z_sum);
    CHECK(fwd.logits == rev.logits);
    REQUIRE(fwd.grads.size() == rev.grads.size());
    size_t differ = 0;
    for (size_t i = 0; i < fwd.grads.size(); ++i) differ += fwd.grads[i] != rev.grads[i];
    CHECK(differ == 0);
  }
}

TEST_CASE("device: the model reaches device Buffers only through the transfer copies", "[device][deferred]") {
  // Under the deferred host device every launch and GEMM waits until device_synchronize(), and with
  // DeviceAccess::Copies (cudaMalloc's rule) the Buffers cannot be read or written but by
  // copy_to_host / copy_from_host: a layer, or this test's run_step, that touches a device Buffer
  // otherwise stops here with SIGSEGV (or, reading a value not yet computed, differs). The [cuda]
  // cases below run the same run_step on a GPU.
  for (const std::string router : {"dense", "top1", "top2", "sigmoid", "softmax_topk", "top2+blocks"}) {
    INFO("router " << router);
    const Config cfg = device_test_config(router);
    const StepResult<float> now = run_step<float>(cfg, 13);
    StepResult<float> deferred;
    {
      test::DeferredHostDevice guard(DeviceAccess::Copies);
      deferred = run_step<float>(cfg, 13);
    }
    CHECK(now.stats.ce_sum == deferred.stats.ce_sum);
    CHECK(now.stats.aux_sum == deferred.stats.aux_sum);
    CHECK(now.stats.z_sum == deferred.stats.z_sum);
    CHECK(now.logits == deferred.logits);
    CHECK(now.grads == deferred.grads);
  }
}

TEST_CASE("device: bf16 operands that several GEMMs read are rounded once, into copies, with the same bits",
          "[device][deferred][bf16]") {
  // Where the Buffers live on a device the layers round an operand that several bf16 GEMMs of a
  // pass read once, into a copy the GEMMs read (tensor/blas.hpp bf16_operand_copies); the host
  // rounds per GEMM. Both give the same bits, and the GEMMs read as many operands. The copies'
  // reads, counted by hand for run_step (B = 2 sequences, 2 heads, T = 8: one row block, so each
  // batched GEMM over P or dS is 4 host GEMMs): a causal self-attention 38 (forward: x by q, k, v
  // 3, P by P V 4, wq, wk, wv, wo 4; backward: dy by wo.g and datt 2, wo by datt 1, P by dV 4, dS by
  // dQ and dK 8, x by the three weight gradients 3, dq, dk, dv each by its weight gradient and dx
  // 6, wq, wk, wv by dx 3), a dense feed-forward 4 (dy and dpre, each by a weight gradient and an
  // input gradient) and 8 more (h, written by the activation's kernel, by y = h w_out and w_out's
  // weight gradient 2; x, written by ln2's kernel, by pre = x w_in and w_in's weight gradient 2;
  // w_in and w_out by the forward and the input gradient 4); the head 4 (x, written by ln_f's
  // kernel, by the logits and the weight gradient; embed.wte by the logits and dx). The weights'
  // copies are the store's (ParamStore::weights16), x's in the attentions the LayerNorm ln1's.
  // An MoE layer's experts read every operand of their 6 GEMM roles from copies: 12 per expert with rows.
  const test::GemmPrecisionScope bf16(Precision::Bf16);
  for (const std::string router : {"dense", "top1"}) {
    INFO("router " << router);
    const Config cfg = device_test_config(router);
    const size_t dense_ffns = router == "dense" ? 2 : 1;
    const Bf16OperandCounts c0 = bf16_operand_counts();
    const StepResult<float> host = run_step<float>(cfg, 13);
    const Bf16OperandCounts c1 = bf16_operand_counts();
    StepResult<float> deferred;
    {
      test::DeferredHostDevice guard(DeviceAccess::Copies);
      deferred = run_step<float>(cfg, 13);
      device_synchronize();
    }
    const Bf16OperandCounts c2 = bf16_operand_counts();
    CHECK(deferred.experts_with_rows == host.experts_with_rows);
    CHECK((router == "dense") == (host.experts_with_rows == 0));
    const size_t expected = 2 * 38 + dense_ffns * (4 + 8) + 4 + 12 * host.experts_with_rows;
    CHECK(c1.from_copies == c0.from_copies);  // the host keeps no copies
    CHECK(c2.from_copies - c1.from_copies == expected);
    CHECK(c2.rounded - c1.rounded + expected == c1.rounded - c0.rounded);
    CHECK(host.stats.ce_sum == deferred.stats.ce_sum);
    CHECK(host.stats.aux_sum == deferred.stats.aux_sum);
    CHECK(host.logits == deferred.logits);
    CHECK(host.grads == deferred.grads);
  }
}

TEST_CASE("device: bf16 training steps read the weights' bf16 copy, which the optimizer writes; fewer roundings a step",
          "[device][deferred][bf16]") {
  // Three AdamW steps of the dense deck and of the Switch deck (block 0 dense, block 1 top-1 MoE)
  // with bf16 GEMMs on the deferred device: the GEMMs read the weights' bf16 copy
  // (ParamStore::weights16), rounded once by init and from then on written by the optimizer's
  // update; the host rounds the weights per GEMM. The same bits (a stale copy after an update would
  // differ from step 2 on). The roundings of a step, each a launch on a GPU: the operands the GEMMs
  // round plus the copies round_to_bf16 writes, the layers' activation copies (a self-attention's
  // dy and dq|dk|dv: 2; a dense feed-forward's dy and dpre: 2); the copies of the weights, of h and
  // of the LayerNorms' outputs cost none (written by the optimizer, the activation and the norm's
  // rows). The copies' reads a step: the weights' 2 x 4 by each dense feed-forward and 8 by each
  // self-attention, 2 by the tied head; h's 2 a dense feed-forward; the norms' outputs 3 + 3 by each
  // self-attention's projections (ln1), 2 by a dense feed-forward's w_in GEMMs (ln2), 2 by the
  // head's (ln_f); the layers' own copies 24 a self-attention (30 with x, before ln1 wrote it), 4
  // a dense feed-forward.
  // The step's roundings before the attention's weights and the norms' outputs had copies (x
  // rounded into a copy by each self-attention in both passes, ln2's and ln_f's outputs and the
  // attention's weights by each GEMM): dense 104, Switch 148 (the top-1 layer's experts keep no
  // copies: their 6 GEMMs of a step round both operands, 4 experts, 48 roundings). Now dense 78,
  // Switch 124.
  const test::GemmPrecisionScope bf16(Precision::Bf16);
  const Config cfg = device_test_config("dense");
  const TrainedSteps host = train_steps(cfg, false), device = train_steps(cfg, true);
  CHECK(host.logits == device.logits);
  CHECK(host.weights == device.weights);
  const size_t attentions = 2, dense_ffns = 2;
  const size_t weight_reads = dense_ffns * 4 + attentions * 8 + 2, h_reads = dense_ffns * 2,
               norm_reads = attentions * 6 + dense_ffns * 2 + 2, activation_reads = attentions * 24 + dense_ffns * 4,
               activation_copies = attentions * 2 + dense_ffns * 2;
  // What the path before rounded besides (see above): the attentions' weights and ln2's and ln_f's
  // outputs per GEMM, and x into a copy twice a self-attention.
  const size_t before_extra = attentions * 8 + dense_ffns * 2 + 2 + attentions * 2;
  for (size_t t = 0; t < 3; ++t) {
    INFO("step " << t + 1);
    const Bf16OperandCounts h = host.steps[t], d = device.steps[t];
    CHECK(h.from_copies + h.copies_rounded == 0);  // the host keeps no copies
    CHECK(d.from_copies == weight_reads + h_reads + norm_reads + activation_reads);
    CHECK(d.copies_rounded == activation_copies);
    CHECK(d.rounded + d.from_copies == h.rounded);  // the same GEMMs, reading as many operands
    const size_t roundings = d.rounded + d.copies_rounded;
    INFO("roundings a step: " << roundings << ", before the attentions' weights and the norms' outputs had copies "
                              << roundings + before_extra);
    CHECK(roundings == h.rounded - weight_reads - h_reads - norm_reads - activation_reads + activation_copies);
    CHECK(h.rounded == 174);  // every operand of the step's GEMMs
    CHECK(roundings == 78);
    CHECK(roundings + before_extra == 104);  // 118 with the weights and h rounded per GEMM
  }
}

TEST_CASE("device: bf16 Switch training steps: the experts' GEMMs read copies only; 12 roundings fewer per expert",
          "[device][deferred][bf16][moe]") {
  // Three AdamW steps of the Switch deck (top-1, geglu experts with expert dropout, jitter; block 0
  // dense, block 1 MoE with 4 experts) with bf16 GEMMs on the deferred device against the host: the
  // same bits. The experts' 6 grouped GEMM roles read all their operands from copies (the weights'
  // from the store, x's from the dispatch gather, h's from the dropout scale's kernel, dy's and
  // dpre's rounded once each into a copy): 12 reads per expert with rows, no rounding, where each
  // group rounded its 2 operands before (on a GPU: a bf16 GEMM per expert, 2 rounding launches each);
  // 2 copies rounded per MoE layer instead. The rest as in the dense case above: 2 self-attentions
  // (38 reads, 2 copies each), a dense feed-forward (4 + 2 + 2 + 4 reads, 2 copies), the tied head (4).
  const test::GemmPrecisionScope bf16(Precision::Bf16);
  const Config cfg = device_test_config("top1");
  const TrainedSteps host = train_steps(cfg, false), device = train_steps(cfg, true);
  CHECK(host.logits == device.logits);
  CHECK(host.weights == device.weights);
  CHECK(host.experts_with_rows == device.experts_with_rows);
  const size_t others_reads = 2 * 38 + (4 + 2 + 2 + 4) + 4, others_copies = 2 * 2 + 2, expert_copies = 2;
  for (size_t t = 0; t < 3; ++t) {
    INFO("step " << t + 1);
    const Bf16OperandCounts h = host.steps[t], d = device.steps[t];
    const size_t expert_reads = 12 * device.experts_with_rows[t];
    CHECK(device.experts_with_rows[t] >= 2);
    CHECK(h.from_copies + h.copies_rounded == 0);  // the host keeps no copies
    CHECK(d.from_copies == others_reads + expert_reads);
    CHECK(d.copies_rounded == others_copies + expert_copies);
    CHECK(d.rounded + d.from_copies == h.rounded);  // the same GEMMs, reading as many operands
    const size_t roundings = d.rounded + d.copies_rounded, before = roundings + expert_reads - expert_copies;
    INFO("roundings a step: " << roundings << ", with the experts' operands rounded per GEMM " << before);
    CHECK(roundings == h.rounded - others_reads - expert_reads + others_copies + expert_copies);
    CHECK(roundings < before);
    CHECK(roundings == 78);  // 124 with the experts' operands rounded per GEMM, 148 before the norms' and attention's copies
  }
}

TEST_CASE("device: a forward waits for the device as often with 6 layers as with 2; NaN still named", "[device][deferred]") {
  // The finite scans of the parts' outputs are queued, and read after one wait by first_nonfinite(),
  // not each after a wait of its own (a GPU would drain once a layer).
  const int V = 13, B = 2;
  std::vector<size_t> waits;
  for (int layers : {2, 6}) {
    INFO(layers << " layers");
    Config cfg = device_test_config("dense");
    cfg.model.num_layers = layers;
    const int Tn = int(cfg.model.seq_len);
    std::vector<int32_t> tokens(size_t(B) * Tn, 3);
    std::vector<float> mask(tokens.size(), 1.f);
    const MicroBatch mb{B, Tn, tokens.data(), tokens.data(), mask.data()};
    const StepContext ctx{42, 3, true, 0, nullptr};
    const LossWeights w{1.0 / (B * Tn), 0, 0};
    test::DeferredHostDevice guard;
    Transformer<float> model(cfg, V);
    model.init(5, 1.0);
    device_synchronize();
    const size_t before = device_waits();
    model.forward(ctx, mb, w);
    const HostWaits before_scans = host_waits();
    CHECK(model.first_nonfinite().empty());
    CHECK((host_waits() - before_scans).copies == 1);  // every part's flags in one copy
    waits.push_back(device_waits() - before);
    model.inject_nan_next_forward();
    model.forward(ctx, mb, w);
    CHECK(model.first_nonfinite() == "embed");
    model.forward(ctx, mb, w);
    CHECK(model.first_nonfinite().empty());
  }
  INFO("waits of one forward: " << waits[0] << " (2 layers), " << waits[1] << " (6 layers)");
  CHECK(waits[0] == waits[1]);
}

TEST_CASE("device: an MoE layer waits once a forward; routing and dispatch plan are device work", "[device][deferred][moe]") {
  // The router queues its triples and totals without a wait; the plan's row counts and the
  // router's totals are read after one wait; the row maps are queued after it. Everything equals
  // the plain host's, statistics included.
  for (const RouterKind kind : {RouterKind::Top1, RouterKind::Top2, RouterKind::ExpertChoice}) {
    INFO("router " << int(kind));
    MoeOptions o = test::small_moe(kind);
    o.no_token_left_behind = kind == RouterKind::Top1;
    o.second_expert = SecondExpertPolicy::Random;
    o.jitter_eps = 0.01;
    o.expert_dropout = 0.2;
    const int N = 32, M = o.d_model;
    const std::vector<double> xd = test::normal_vector(size_t(N) * M, 3);
    const std::vector<float> x(xd.begin(), xd.end());
    StepContext ctx;
    ctx.seed = 5;
    ctx.step = 2;
    ctx.training = true;
    ctx.token_offset = 16;
    test::MoeHarness<float> plain(o, 9);
    std::vector<float> y_plain(x.size()), y(x.size());
    plain.layer->forward(ctx, x.data(), y_plain.data(), N);

    test::DeferredHostDevice guard;
    test::MoeHarness<float> h(o, 9);
    MoeLayer<float>& layer = *h.layer;
    device_synchronize();
    size_t waits = device_waits();
    layer.router.route(ctx, x.data(), N);
    CHECK(device_waits() == waits);
    CHECK(deferred_host_work_queued() > 0);
    IndexDispatcher<float>& perm = layer.dispatcher.permutation();
    perm.count_rows(layer.router.routing());
    layer.router.read_totals();
    CHECK(device_waits() == waits + 1);
    perm.map_rows(layer.router.routing(), ctx.token_offset);
    CHECK(device_waits() == waits + 1);  // nothing was queued since the wait
    CHECK(deferred_host_work_queued() > 0);  // the maps
    device_synchronize();
    const Routing<float>& r = layer.router.routing();
    const Routing<float>& rp = plain.layer->router.routing();
    CHECK(r.load == rp.load);
    CHECK(r.experts_per_token == rp.experts_per_token);
    const IndexDispatcher<float>& plain_perm = plain.layer->dispatcher.permutation();
    CHECK(std::vector<int>(perm.slot_token().begin(), perm.slot_token().end()) ==
          std::vector<int>(plain_perm.slot_token().begin(), plain_perm.slot_token().end()));
    CHECK(std::vector<int64_t>(perm.choice_row().begin(), perm.choice_row().end()) ==
          std::vector<int64_t>(plain_perm.choice_row().begin(), plain_perm.choice_row().end()));

    waits = device_waits();
    layer.forward(ctx, x.data(), y.data(), N);
    CHECK(device_waits() == waits + 1);
    device_synchronize();
    CHECK(y == y_plain);
    const MoeStats &s = layer.stats(), &sp = plain.layer->stats();
    CHECK(s.aux_sum == sp.aux_sum);
    CHECK(s.z_sum == sp.z_sum);
    CHECK(s.entropy_sum == sp.entropy_sum);
    CHECK(s.load == sp.load);
    CHECK(s.wanted == sp.wanted);
    CHECK(s.dropped == sp.dropped);
    CHECK(s.rerouted == sp.rerouted);
    CHECK(s.declined == sp.declined);
    CHECK(s.experts_per_token == sp.experts_per_token);
    CHECK(sp.wanted > 0);
  }
}

TEST_CASE("device: the dispatch plan names a routing choice outside the experts' slots", "[device][moe]") {
  MoeOptions o = test::small_moe(RouterKind::Top1);
  const int N = 16, M = o.d_model;
  const std::vector<double> xd = test::normal_vector(size_t(N) * M, 4);
  const std::vector<float> x(xd.begin(), xd.end());
  test::MoeHarness<float> h(o, 9);
  StepContext ctx;
  ctx.training = true;
  test::route_and_read_totals(h.layer->router, ctx, x.data(), N);
  Routing<float> r = h.layer->router.routing();
  IndexDispatcher<float> d;
  test::plan_rows(d, r, 0);  // a valid routing plans
  int c = 0;
  while (r.expert[size_t(c)] < 0) ++c;
  r.slot[size_t(c)] = r.C;  // one slot past capacity
  CHECK_THROWS_WITH(test::plan_rows(d, r, 0), Catch::Contains("choice " + std::to_string(c) + " has expert"));
  r.slot[size_t(c)] = 0;
  r.expert[size_t(c + 1)] = r.E;
  CHECK_THROWS_WITH(test::plan_rows(d, r, 0),
                    Catch::Contains("choice " + std::to_string(c + 1) + " has expert " + std::to_string(r.E)));
}

TEST_CASE("device: a Buffer made on the device is zero; the host's values reach it by queued copies", "[device][deferred]") {
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  Buffer<float> a(1000);  // value-initialised by the device: one zeroing, not one per element
  CHECK(deferred_host_work_queued() == 1);
  Buffer<double> c(300), d(200);
  CHECK(deferred_host_work_queued() == 3);
  fill_with(a.data(), 10, 2.f);
  CHECK(deferred_host_work_queued() == 4);
  const size_t waits = device_waits();
  const Buffer<float> b(a.size(), 3.f);  // the host's values: one copy, queued, no wait
  CHECK(deferred_host_work_queued() == 5);
  a.resize(2000);  // new storage: the old elements copied, the tail zeroed, by the device
  const Buffer<float> copy = a;  // copied by the device (one copy, no zeroing of what it overwrites)
  const Buffer<int32_t> listed{4, 5, 6};  // the host's values again
  CHECK(device_waits() == waits);
  const std::vector<float> ha = download(a);  // waits, then copies
  CHECK(deferred_host_work_queued() == 0);
  CHECK(ha[0] == 2.f);
  CHECK(ha[9] == 2.f);
  CHECK(ha[10] == 0.f);
  CHECK(ha[1999] == 0.f);
  const std::vector<float> hcopy = download(copy);
  CHECK(hcopy.size() == 2000);
  CHECK(hcopy[9] == 2.f);
  CHECK(hcopy[10] == 0.f);
  CHECK(download(b) == std::vector<float>(1000, 3.f));
  CHECK(download(listed) == std::vector<int32_t>{4, 5, 6});
  CHECK(download_one(c, 299) == 0.0);
}

TEST_CASE("device: Buffer::assign and resize with a value copy the host's values in order with queued work", "[device][deferred]") {
  // Each is a copy from the host queued behind the work before it, and taken from the host's
  // values at the call: no wait, and later work overwrites it in order.
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  Buffer<float> a(100);
  fill_with(a.data(), 100, 2.f);
  const size_t waits = device_waits();
  a.assign(50, 1.f);
  CHECK(device_waits() == waits);
  CHECK(a.size() == 50);
  std::vector<float> v(80, 3.f);
  fill_with(a.data(), 50, 4.f);
  a.assign(v.begin(), v.end());
  v.assign(80, 5.f);  // after the call: not what the copy takes
  a.resize(90, 6.f);
  CHECK(device_waits() == waits);
  std::vector<float> expected(90, 3.f);
  std::fill(expected.begin() + 80, expected.end(), 6.f);
  CHECK(download(a) == expected);
}

TEST_CASE("device: Buffer::reserve into new storage copies on the device, without a wait", "[device][deferred]") {
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  Buffer<float> a(10);
  fill_with(a.data(), 10, 7.f);
  device_synchronize();
  const size_t waits = device_waits();
  fill_with(a.data(), 5, 3.f);
  a.reserve(1000);
  CHECK(a.capacity() >= 1000);
  CHECK(a.size() == 10);
  CHECK(device_waits() == waits);
  CHECK(deferred_host_work_queued() > 0);
  CHECK(download_one(a, 4) == 3.f);
  CHECK(download_one(a, 5) == 7.f);
}

TEST_CASE("device: the parameters' initialisation on the device equals the host's", "[device][deferred]") {
  // Dense and MoE parameters (expert weights of three dimensions) from the same seed: the
  // initialisation is a loop body (model/param_init_bodies.hpp), queued on the device.
  for (const std::string router : {"dense", "top2"}) {
    INFO("router " << router);
    const Config cfg = device_test_config(router);
    std::vector<float> host, device;
    {
      Transformer<float> m(cfg, 64);
      m.init(7, 1.0);
      host.assign(m.params().weights(), m.params().weights() + m.params().size());
    }
    {
      test::DeferredHostDevice guard;
      Transformer<float> m(cfg, 64);
      m.init(7, 1.0);
      CHECK(deferred_host_work_queued() > 0);
      device_synchronize();
      device.assign(m.params().weights(), m.params().weights() + m.params().size());
    }
    CHECK(host == device);
    CHECK(std::count(host.begin(), host.end(), 0.f) < std::ptrdiff_t(host.size() / 2));  // initialised
  }
}

TEST_CASE("device: run.phase_sync waits for the device at each timed phase's start and end", "[device][deferred]") {
  test::DeferredHostDevice guard;
  Buffer<float> a(100);
  PhaseTimers timers;
  {
    ScopedPhase t(&timers, "attention");  // no fence: the queued zeroing stays queued
    CHECK(deferred_host_work_queued() == 1);
  }
  CHECK(deferred_host_work_queued() == 1);
  timers.set_fence(device_synchronize);
  {
    ScopedPhase t(&timers, "attention");  // waits for what earlier phases queued
    CHECK(deferred_host_work_queued() == 0);
    fill_with(a.data(), 10, 2.f);
    CHECK(deferred_host_work_queued() == 1);
  }
  CHECK(deferred_host_work_queued() == 0);  // and for its own work at the end
  CHECK(timers.totals().count("attention") == 1);
}

TEST_CASE("device: Buffers on the host are 64-byte aligned and free cleanly", "[device]") {
  REQUIRE(current_device() == Device::Cpu);
  Buffer<float> a(1000, 1.5f);
  CHECK(reinterpret_cast<uintptr_t>(a.data()) % 64 == 0);
  a.resize(100000, 2.0f);
  CHECK(a[999] == 1.5f);
  CHECK(a[1000] == 2.0f);
  CHECK(reinterpret_cast<uintptr_t>(a.data()) % 64 == 0);
  Buffer<double> b(a.begin(), a.end());
  CHECK(b[5] == 1.5);
}

TEST_CASE("device: OpenBLAS's idle threads do not spin after a threaded GEMM", "[device][threads]") {
  const char* timeout = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  REQUIRE(timeout != nullptr);  // set by the executable's .preinit_array when the environment has none
  if (std::strcmp(timeout, kOpenblasThreadTimeout) != 0) {
    WARN("OPENBLAS_THREAD_TIMEOUT=" << timeout << " from the environment: idle-spin check skipped");
    return;
  }
  auto cpu_seconds = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  };
  const int threads = openblas_get_num_threads();
  openblas_set_num_threads(2);
  const int n = 512;
  std::vector<float> a(size_t(n) * n, 1.0f), b(size_t(n) * n, 1.0f), c(size_t(n) * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  const double before = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double idle_cpu = cpu_seconds() - before;
  openblas_set_num_threads(threads);
  CHECK(c[0] == float(n));
  // OpenBLAS's default (2^28 cycles of sched_yield) costs about 0.1 s of CPU here; asleep, ~0.
  CHECK(idle_cpu < 0.02);
}

TEST_CASE("device: set_device(Cuda) is refused with the reason in a build without CUDA", "[device]") {
  if (cuda_compiled()) {
    CHECK(cuda_device_count() >= 0);
    return;
  }
  CHECK_THROWS_WITH(set_device(Device::Cuda), Catch::Contains("built without CUDA"));
  CHECK(current_device() == Device::Cpu);
}

TEST_CASE("device: cuBLAS row-major GEMM equals OpenBLAS for every transpose", "[device][cuda]") {
  if (!gpu_available()) {
    WARN("skipped: no GPU");
    return;
  }
  const int M = 37, N = 29, K = 41;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::vector<double> A(M * K), B(K * N), C0(M * N);
      for (auto& x : A) x = u(rng);
      for (auto& x : B) x = u(rng);
      for (auto& x : C0) x = u(rng);
      std::vector<double> host = C0;
      gemm(ta, tb, M, N, K, 0.7, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.3, host.data(), N);
      std::vector<double> dev;
      {
        OnGpu gpu;
        Buffer<double> dA(A.begin(), A.end()), dB(B.begin(), B.end()), dC(C0.begin(), C0.end());
        gemm(ta, tb, M, N, K, 0.7, dA.data(), ta ? M : K, dB.data(), tb ? K : N, 0.3, dC.data(), N);
        dev = download(dC);
      }
      INFO("trans_a " << ta << " trans_b " << tb);
      CHECK(rel_norm_diff(dev, host) < 1e-13);
    }
}

TEST_CASE("device: the whole model on the GPU matches the host model", "[device][cuda]") {
  if (!gpu_available()) {
    WARN("skipped: no GPU");
    return;
  }
  for (const std::string router : {"dense", "top1", "top2", "sigmoid", "softmax_topk", "top2+blocks"}) {
    INFO("router " << router);
    const Config cfg = device_test_config(router);
    const StepResult<double> host64 = run_step<double>(cfg, 13);
    const StepResult<float> host32 = run_step<float>(cfg, 13);
    StepResult<double> gpu64;
    StepResult<float> gpu32;
    {
      OnGpu gpu;
      gpu64 = run_step<double>(cfg, 13);
      gpu32 = run_step<float>(cfg, 13);
    }
    // fp64: only the summation order differs.
    CHECK(std::abs(gpu64.stats.ce_sum - host64.stats.ce_sum) <= 1e-12 * std::abs(host64.stats.ce_sum));
    CHECK(std::abs(gpu64.stats.aux_sum - host64.stats.aux_sum) <= 1e-12 * std::max(1.0, host64.stats.aux_sum));
    CHECK(rel_norm_diff(gpu64.grads, host64.grads) < 1e-12);
    // fp32 (no TF32): float rounding of differently ordered sums.
    CHECK(std::abs(gpu32.stats.ce_sum - host32.stats.ce_sum) <= 1e-5 * std::abs(host32.stats.ce_sum));
    CHECK(std::abs(gpu32.stats.z_sum - host32.stats.z_sum) <= 1e-5 * std::max(1.0, host32.stats.z_sum));
    CHECK(rel_norm_diff(gpu32.logits, host32.logits) < 1e-5);
    CHECK(rel_norm_diff(gpu32.grads, host32.grads) < 1e-4);
  }
}

TEST_CASE("device: cuBLAS bf16 GEMM equals the host emulation for every transpose", "[device][cuda][bf16]") {
  if (!gpu_available()) {
    WARN("skipped: no GPU");
    return;
  }
  // Both sides multiply the same bf16-rounded operands (tensor/bf16.hpp) exactly and sum in fp32:
  // only the summation order differs. The shapes take each of the GPU's paths: M and K multiples
  // of 64 (no padding), M padded (through the scratch product), K padded, both; beta = 0 with NaN
  // in C (not read, as cuBLAS) and beta = 0.3 (C joins). Each GEMM also runs with the operands'
  // bf16 copies (round_to_bf16 on the GPU: the host's bf16_bits exactly), which it reads where
  // nothing is padded.
  const test::GemmPrecisionScope bf16(Precision::Bf16);
  struct Shape { int M, N, K; };
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const Shape sh : {Shape{37, 29, 41}, Shape{64, 29, 128}, Shape{130, 7, 64}, Shape{64, 5, 70}})
    for (const float beta : {0.3f, 0.0f})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const int M = sh.M, N = sh.N, K = sh.K;
          std::vector<float> A(M * K), B(K * N), C0(M * N);
          for (auto& x : A) x = u(rng);
          for (auto& x : B) x = u(rng);
          for (auto& x : C0) x = beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : u(rng);
          std::vector<float> host = C0, unrounded = C0;
          gemm(ta, tb, M, N, K, 0.7f, A.data(), ta ? M : K, B.data(), tb ? K : N, beta, host.data(), N);
          gemm_fp32(ta, tb, M, N, K, 0.7f, A.data(), ta ? M : K, B.data(), tb ? K : N, beta, unrounded.data(), N);
          std::vector<float> dev, dev_copies;
          std::vector<uint16_t> a16, b16;
          {
            OnGpu gpu;
            Buffer<float> dA(A.begin(), A.end()), dB(B.begin(), B.end()), dC(C0.begin(), C0.end()), dC2 = dC;
            gemm(ta, tb, M, N, K, 0.7f, dA.data(), ta ? M : K, dB.data(), tb ? K : N, beta, dC.data(), N);
            dev = download(dC);
            Buffer<uint16_t> dA16(A.size()), dB16(B.size());
            round_to_bf16(dA.data(), int64_t(A.size()), dA16.data());
            round_to_bf16(dB.data(), int64_t(B.size()), dB16.data());
            gemm(ta, tb, M, N, K, 0.7f, dA.data(), ta ? M : K, dB.data(), tb ? K : N, beta, dC2.data(), N, dA16.data(),
                 dB16.data());
            dev_copies = download(dC2);
            a16 = download(dA16), b16 = download(dB16);
          }
          INFO("M " << M << " N " << N << " K " << K << " beta " << beta << " trans_a " << ta << " trans_b " << tb);
          REQUIRE(std::all_of(host.begin(), host.end(), [](float x) { return std::isfinite(x); }));
          CHECK(rel_norm_diff(dev, host) < 1e-6);
          CHECK(rel_norm_diff(dev_copies, host) < 1e-6);
          CHECK(rel_norm_diff(dev, unrounded) > 1e-4);  // the GPU rounded the operands
          size_t wrong_bits = 0;
          for (size_t i = 0; i < A.size(); ++i) wrong_bits += a16[i] != bf16_bits(A[i]);
          for (size_t i = 0; i < B.size(); ++i) wrong_bits += b16[i] != bf16_bits(B[i]);
          CHECK(wrong_bits == 0);
        }
}

TEST_CASE("device: the bf16 GEMM's rounding of strided and unaligned operands equals the host emulation",
          "[device][cuda][bf16]") {
  if (!gpu_available()) {
    WARN("skipped: no GPU");
    return;
  }
  // The rounding kernel's two forms (tensor/cuda_gemm_bf16.cu): rows of a matrix with a leading
  // dimension beyond its columns, and a contiguous operand starting off a 16-byte boundary.
  // M = K = 64 take the unpadded kernels; 45 and 33 the padding one.
  const test::GemmPrecisionScope bf16(Precision::Bf16);
  const int N = 70, pad = 5;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const int M : {64, 45})
  for (bool padded : {false, true}) {
    const int K = M == 64 ? 64 : 33;
    const int lda = K + (padded ? pad : 0), ldb = N + (padded ? pad : 0);
    std::vector<float> A(1 + size_t(M) * lda), B(1 + size_t(K) * ldb), C0(size_t(M) * N);
    for (auto& x : A) x = u(rng);
    for (auto& x : B) x = u(rng);
    for (auto& x : C0) x = u(rng);
    std::vector<float> host = C0;
    gemm(false, false, M, N, K, 1.f, A.data() + 1, lda, B.data() + 1, ldb, 0.5f, host.data(), N);
    std::vector<float> dev;
    {
      OnGpu gpu;
      Buffer<float> dA(A.begin(), A.end()), dB(B.begin(), B.end()), dC(C0.begin(), C0.end());
      gemm(false, false, M, N, K, 1.f, dA.data() + 1, lda, dB.data() + 1, ldb, 0.5f, dC.data(), N);
      dev = download(dC);
    }
    INFO("M " << M << " K " << K << " padded leading dimensions " << padded);
    CHECK(rel_norm_diff(dev, host) < 1e-6);
  }
}

TEST_CASE("device: the bf16 two-level batched GEMM equals the host emulation", "[device][cuda][bf16]") {
  if (!gpu_available()) {
    WARN("skipped: no GPU");
    return;
  }
  // gemm_batched over (b, h) pairs as attention lays them out (tensor/blas.hpp): head h of sequence
  // b at columns [h*D, (h+1)*D) of a token-major buffer, so the pairs are no single progression.
  // Each operand's span is rounded once (cuda_gemm_bf16_two_level_batched); with a gap of `gap`
  // unused rows after each sequence the span is more than twice the pairs' elements and the GPU
  // rounds per sequence instead: both paths against the host's per-pair emulation.
  const test::GemmPrecisionScope bf16(Precision::Bf16);
  const int outer = 3, inner = 4, T = 12, D = 8, A_l = inner * D;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const int gap : {0, 40})
    for (bool ta : {false, true}) {
      const int rows = T + gap;  // rows of one sequence's block in the token-major buffers
      const int64_t seq_stride = int64_t(rows) * A_l;
      std::vector<float> Q(size_t(outer) * seq_stride), Kb(Q.size());
      for (auto& x : Q) x = u(rng);
      for (auto& x : Kb) x = u(rng);
      // C_bh = 0.5 Q_bh K_bh^T + 0.25 C_bh [T, T] (scores); transposed, C_bh = 0.5 Q_bh^T K_bh [D, D]
      const int M = ta ? D : T, N = ta ? D : T, K = ta ? T : D;
      std::vector<float> host(size_t(outer) * inner * M * N);
      for (auto& x : host) x = u(rng);
      const std::vector<float> C0 = host;
      const auto run = [&](const float* q, const float* k, float* c) {
        const BatchedOperand<const float> a{q, A_l, seq_stride, D}, b{k, A_l, seq_stride, D};
        const BatchedOperand<float> cc{c, N, int64_t(inner) * M * N, int64_t(M) * N};
        gemm_batched(ta, !ta, M, N, K, 0.5f, a, b, 0.25f, cc, outer, inner);
      };
      run(Q.data(), Kb.data(), host.data());
      std::vector<float> dev;
      {
        OnGpu gpu;
        Buffer<float> dQ(Q.begin(), Q.end()), dK(Kb.begin(), Kb.end()), dC(C0.begin(), C0.end());
        run(dQ.data(), dK.data(), dC.data());
        dev = download(dC);
      }
      INFO("gap " << gap << " trans_a " << ta);
      CHECK(rel_norm_diff(dev, host) < 1e-6);
    }
}

TEST_CASE("device: the whole model in bf16 on the GPU matches the host bf16 model", "[device][cuda][bf16]") {
  if (!gpu_available()) {
    WARN("skipped: no GPU");
    return;
  }
  // model.precision = bf16 on both sides: the same rounded operands, sums in another order. The
  // fp32 tolerances hold (the host emulation matches PyTorch's bf16 model to them,
  // tests/reference/model_reference.py), unless a value next to a bf16 rounding boundary rounds
  // the other way on one side; the gradients' 1e-4 norm-wise bound leaves room for a few such.
  const test::GemmPrecisionScope bf16(Precision::Bf16);
  for (const std::string router : {"dense", "top1", "top2", "top2+blocks"}) {
    INFO("router " << router);
    const Config cfg = device_test_config(router);
    const StepResult<float> host = run_step<float>(cfg, 13);
    StepResult<float> gpu;
    {
      OnGpu on_gpu;
      gpu = run_step<float>(cfg, 13);
    }
    CHECK(std::abs(gpu.stats.ce_sum - host.stats.ce_sum) <= 1e-5 * std::abs(host.stats.ce_sum));
    CHECK(std::abs(gpu.stats.z_sum - host.stats.z_sum) <= 1e-5 * std::max(1.0, host.stats.z_sum));
    CHECK(rel_norm_diff(gpu.logits, host.logits) < 1e-5);
    CHECK(rel_norm_diff(gpu.grads, host.grads) < 1e-4);
  }
}

TEST_CASE("device: host Buffers from an arena give the same step, free everything, fit the plan in one chunk",
          "[device][arena]") {
  for (const std::string router : {"dense", "top2"}) {
    INFO("router " << router);
    Config cfg = device_test_config(router);
    cfg.model.d_model = 64;
    cfg.model.d_ff = 128;
    cfg.model.seq_len = 16;
    cfg.optim.batch_size = 2;  // run_step's rows
    const int V = 50;
    const StepResult<float> heap = run_step<float>(cfg, V);

    const MemoryPlan plan = plan_memory(cfg, V, MeshShape{}, 0, 0, 0);
    const size_t planned = plan.param_bytes + plan.grad_bytes + plan.activation_bytes + plan.workspace_bytes;
    Arena arena({[](size_t n) { return ::operator new(n, std::align_val_t(256)); },
                 [](void* p) { ::operator delete(p, std::align_val_t(256)); }},
                4096, 256);
    arena.reserve(planned + planned / 10);
    StepResult<float> pooled;
    {
      test::HostBufferArena guard(&arena);
      pooled = run_step<float>(cfg, V);
    }
    CHECK(pooled.stats.ce_sum == heap.stats.ce_sum);
    CHECK(pooled.stats.aux_sum == heap.stats.aux_sum);
    CHECK(pooled.logits == heap.logits);
    CHECK(pooled.grads == heap.grads);
    const Arena::Stats s = arena.stats();
    CHECK(s.in_use == 0);
    CHECK(s.chunks == 1);
    // The step's peak against the plan: the plan counts payloads; the arena adds a 64-byte header
    // and rounds each block to 256 bytes, and the layers keep a few small vectors the plan ignores
    // (1.5-2% here), so within 5%.
    INFO("arena high water " << s.high_water << " bytes, planned " << planned);
    CHECK(double(s.high_water) >= 0.95 * double(planned));
    CHECK(double(s.high_water) <= 1.05 * double(planned));
  }
}

TEST_CASE("device: with device-memory access the host reaches a Buffer only through the transfer copies", "[device][deferred]") {
  // DeviceAccess::Copies is cudaMalloc's rule: the Buffers' pages are inaccessible to the host always,
  // but inside copy_to_host / copy_from_host. The listing variant names each other access and goes
  // on (one instruction at a time), so the accesses below are counted, and the copies are not.
  test::DeferredHostDevice guard(DeviceAccess::CopiesListed);
  const size_t listed = listed_host_accesses();
  Buffer<float> b(8);  // zeroed on the device
  const std::vector<float> values{1, 2, 3, 4, 5, 6, 7, 8};
  upload(b, values.data(), values.size());
  CHECK(deferred_host_work_queued() > 0);  // the upload is queued in order with the device's work
  std::vector<float> back(8);
  download(b, 0, back.size(), back.data());
  CHECK(back == values);
  CHECK(download_one(b, 6) == 7.0f);
  {
    HostCopy<float> copy(b.data(), b.size());
    copy.data()[0] = -1.0f;
    copy.upload();
  }
  CHECK(download_one(b, 0) == -1.0f);
  std::vector<float> scratch;
  const std::span<const float> view = host_view(b, scratch);
  CHECK(view.data() == scratch.data());
  CHECK(view[3] == 4.0f);
  CHECK(listed_host_accesses() == listed);  // only copies so far
  const volatile float* p = b.data();
  const float read = p[3];  // a host read of device memory: listed, and it reads the value
  CHECK(read == 4.0f);
  CHECK(listed_host_accesses() == listed + 1);
  b[5] = 9.0f;  // a host write, at another place
  CHECK(listed_host_accesses() == listed + 2);
  CHECK(download_one(b, 5) == 9.0f);
  CHECK(listed_host_accesses() == listed + 2);
}

TEST_CASE("device: on the host path the transfer copies are plain copies and host_view is the Buffer", "[device]") {
  Buffer<double> b;
  const std::vector<double> values{0.5, 1.5, 2.5};
  upload(b, values.data(), values.size());
  CHECK(std::vector<double>(b.begin(), b.end()) == values);
  std::vector<double> scratch;
  CHECK(host_view(b, scratch).data() == b.data());
  CHECK(scratch.empty());
  CHECK(download_one(b, 2) == 2.5);
  HostCopy<double> copy(b.data(), b.size());
  CHECK(copy.data() == b.data());
}

TEST_CASE("device: MPI's host copies of device memory (HostStaged)", "[device][deferred]") {
  // MpiComm hands MPI a host range: device memory goes through a copy, read first where MPI reads
  // it and written back where MPI writes it; host memory is handed over as it is.
  std::vector<float> host{1, 2, 3};
  HostStaged plain(host.data(), host.size() * sizeof(float), true);
  CHECK(plain.host() == host.data());
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  Buffer<float> b(3);
  upload(b, host.data(), host.size());
  CHECK(device_memory(b.data()));
  CHECK(device_memory(b.data() + 2));
  CHECK_FALSE(device_memory(host.data()));
  HostStaged staged(b.data(), b.size() * sizeof(float), /*read=*/true);
  REQUIRE(staged.host() != static_cast<void*>(b.data()));
  float* h = static_cast<float*>(staged.host());
  CHECK(h[2] == 3.0f);
  h[1] = 20.0f;  // what MPI would write
  staged.write_back();
  CHECK(download_one(b, 1) == 20.0f);
}

TEST_CASE("device: host waits count every copy to the host and every other wait with work queued", "[device][deferred]") {
  // HostWaits (tensor/device.hpp): a copy to the host is one wait (its wait for the queued work
  // included), a device_synchronize() is one where work was queued; the host path counts none.
  std::vector<float> host(4);
  Buffer<float> plain(4);
  HostWaits w0 = host_waits();
  copy_to_host(host.data(), plain.data(), 4 * sizeof(float));
  device_synchronize();
  CHECK((host_waits() - w0).total() == 0);
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  Buffer<float> b(4);  // its zeroes are owed: work queued
  w0 = host_waits();
  device_synchronize();
  device_synchronize();  // nothing queued since
  CHECK((host_waits() - w0).synchronize == 1);
  CHECK((host_waits() - w0).copies == 0);
  fill_with(b.data(), 4, 2.f);
  copy_to_host(host.data(), b.data(), 4 * sizeof(float));  // waits for the fill: one wait, the copy's
  copy_to_host(host.data(), b.data(), 4 * sizeof(float));  // nothing queued: still a round trip
  CHECK((host_waits() - w0).synchronize == 1);
  CHECK((host_waits() - w0).copies == 2);
  CHECK(host[3] == 2.f);
}

TEST_CASE("device: MPI on host values does not wait for the device; on device memory its copy waits", "[device][deferred][mpi]") {
  // MpiComm (mesh/mpi_comm.cpp): device work never writes host memory, so a collective on the
  // host's values (the step's sums, the stop decision) leaves the queued work queued; device
  // memory goes through HostStaged, whose copy to the host waits.
  MPI_Comm self;
  MPI_Comm_dup(MPI_COMM_SELF, &self);
  MpiComm comm(self, "self");
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  Buffer<double> b(3);
  fill_with(b.data(), 3, 1.5);
  std::vector<double> sums{1, 2};
  const HostWaits w0 = host_waits();
  comm.all_reduce(sums.data(), sums.size(), Op::Sum);
  CHECK((host_waits() - w0).total() == 0);
  CHECK(deferred_host_work_queued() > 0);
  comm.all_reduce(b.data(), b.size(), Op::Sum);
  CHECK((host_waits() - w0).copies == 1);
  CHECK((host_waits() - w0).synchronize == 0);
  CHECK(download(b) == std::vector<double>{1.5, 1.5, 1.5});
}

TEST_CASE("device: a HostSection computes on the host while the device's Buffers stay put", "[device][deferred]") {
  // Decoding for eval.bleu_every on a device (docs/user-guide.md "Translation"): inside the section launches run
  // at once on the host and new Buffers are host memory; the device's Buffers stay inaccessible
  // (device memory's rule), so the host copies what it needs of them before.
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  Buffer<float> on_device(4);
  fill_with(on_device.data(), 4, 2.f);
  CHECK(deferred_host_work_queued() > 0);
  std::vector<float> copied(4);
  copy_to_host(copied.data(), on_device.data(), copied.size() * sizeof(float));
  {
    HostSection host;
    CHECK_FALSE(buffers_on_device());
    Buffer<float> here(4);
    CHECK_FALSE(device_memory(here.data()));
    fill_with(here.data(), 4, 3.f);  // runs now
    CHECK(deferred_host_work_queued() == 0);
    CHECK(here[3] == 3.f);
    add_into(here.data(), copied.data(), 4);
    CHECK(here[0] == 5.f);
  }
  CHECK(buffers_on_device());
  fill_with(on_device.data(), 2, 7.f);  // queued again
  CHECK(deferred_host_work_queued() > 0);
  CHECK(download(on_device) == std::vector<float>{7.f, 7.f, 2.f, 2.f});
}
