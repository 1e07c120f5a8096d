// The memory plan (src/run/memory.hpp) against reality (test::measure_memory,
// tests/support/memory_support.hpp) and against GShard section 5.1.
//
// Oracles:
// - parameter and gradient bytes: the built Transformer's ParamStore, EXACT;
// - optimizer state bytes: the optimizer's state() tensors, EXACT (AdamW and factored Adafactor);
// - activations: heap growth (mallinfo2 in-use bytes) of the first forward of one micro-batch, and
//   backward workspace: heap growth of the first backward, each within 10% (the plan counts the
//   buffers' payload; malloc adds a 16-byte header per block and the layers keep a few small
//   vectors the plan ignores);
// - GShard 5.1: E = 2 x ranks, fixed tokens per rank, experts over data: the planned bytes per rank
//   stay within 10% from 1 to 8 ranks, while the same decks with replicated experts do not.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "core/sizes.hpp"
#include "decode/beam_search.hpp"
#include "run/decode_bytes.hpp"
#include "run/memory.hpp"
#include "run/memory_limit.hpp"
#include "../test_util.hpp"
#include "../support/memory_support.hpp"

using namespace meshmoe;

namespace {

// The model size that dense_config and moe_config share.
Config small_model() {
  Config c;
  c.model.seq_len = 16;
  c.model.d_model = 32;
  c.model.num_layers = 4;
  c.model.num_heads = 4;
  c.model.d_ff = 64;
  return c;
}

Config dense_config() {
  Config c = small_model();
  c.model.activation = Activation::Geglu;
  c.model.tied_embeddings = false;
  c.model.dropout = 0.1;
  c.moe.every = 0;
  c.optim.batch_size = 8;
  c.optim.micro_batches = 2;
  return c;
}

Config moe_config() {
  Config c = small_model();
  c.model.activation = Activation::Gelu;
  c.moe.num_experts = 4;
  c.moe.every = 2;
  c.moe.router = RouterKind::Top2;
  c.moe.group_size = 16;
  c.moe.jitter_eps = 0.01;
  c.moe.expert_dropout = 0.1;
  c.optim.batch_size = 4;
  c.optim.micro_batches = 1;
  return c;
}

// Within 10% of the measured heap growth (stated in the file header).
void check_activations(const MemoryPlan& p, const test::MemoryMeasured& m) {
  INFO("planned activations " << p.activation_bytes << " B, forward heap growth " << m.forward_heap << " B");
  REQUIRE(m.forward_heap > 0);
  CHECK(std::fabs(double(p.activation_bytes) - double(m.forward_heap)) <= 0.10 * double(m.forward_heap));
  INFO("planned workspace " << p.workspace_bytes << " B, backward heap growth " << m.backward_heap << " B");
  REQUIRE(m.backward_heap > 0);
  CHECK(std::fabs(double(p.workspace_bytes) - double(m.backward_heap)) <= 0.10 * double(m.backward_heap));
}

void check_exact(const Config& cfg, int vocab, const MeshShape& mesh, int pipe, int data, int tensor) {
  const MemoryPlan p = plan_memory(cfg, vocab, mesh, pipe, data, tensor);
  const test::MemoryMeasured m = test::measure_memory(cfg, vocab, mesh, pipe, data, tensor);
  INFO("mesh " << mesh.str() << " at pipe " << pipe << " data " << data << " tensor " << tensor << ", optimizer "
               << cfg.optim.name);
  CHECK(p.param_bytes == m.param_bytes);
  CHECK(p.grad_bytes == m.grad_bytes);
  CHECK(p.optim_bytes == m.optim_bytes);
  check_activations(p, m);
}

}  // namespace

TEST_CASE("memory plan: parameters, optimizer state and activations of the built model", "[memory]") {
  const int V = 50;
  SECTION("dense, one rank, AdamW and Adafactor") {
    Config c = dense_config();
    check_exact(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    c.optim.name = OptimizerKind::Adafactor;
    check_exact(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
  }
  SECTION("dense, tensor = 2 (Megatron blocks) and pipe = 2 (both stages, untied and tied)") {
    Config c = dense_config();
    c.optim.name = OptimizerKind::Adafactor;
    check_exact(c, V, MeshShape{1, 1, 2}, 0, 0, 1);
    check_exact(c, V, MeshShape{2, 1, 1}, 0, 0, 0);
    check_exact(c, V, MeshShape{2, 1, 1}, 1, 0, 0);
    c.model.tied_embeddings = true;
    check_exact(c, V, MeshShape{2, 1, 1}, 1, 0, 0);
    check_exact(c, V, MeshShape{2, 2, 2}, 1, 1, 1);
  }
  SECTION("grouped-query attention: key/value heads split over tensor = 2 (kv_heads 2) and replicated (kv_heads 1)") {
    Config c = dense_config();
    c.model.position = PositionKind::Rope;
    for (const int kv : {2, 1}) {
      c.model.kv_heads = kv;
      check_exact(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
      check_exact(c, V, MeshShape{1, 1, 2}, 0, 0, 1);
      check_exact(c, V, MeshShape{1, 1, 4}, 0, 0, 3);
    }
  }
  SECTION("encoder-decoder (model.arch = encdec): dense and MoE, one rank, tensor = 2, pipe = 2 and 4") {
    Config c = dense_config();
    c.model.arch = ModelArch::EncDec;
    check_exact(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    check_exact(c, V, MeshShape{1, 1, 2}, 0, 0, 1);
    for (int stage = 0; stage < 4; ++stage) check_exact(c, V, MeshShape{4, 1, 1}, stage, 0, 0);  // 2 of the 8 blocks each
    c = moe_config();
    c.model.arch = ModelArch::EncDec;
    check_exact(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    check_exact(c, V, MeshShape{2, 1, 1}, 0, 0, 0);  // the encoder
    check_exact(c, V, MeshShape{2, 1, 1}, 1, 0, 0);  // ln_enc and the decoder
  }
  SECTION("MoE (top-2, jitter, expert dropout), one rank and two pipeline stages") {
    Config c = moe_config();
    check_exact(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    c.optim.name = OptimizerKind::Adafactor;
    check_exact(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    c.moe.router = RouterKind::Top1;
    c.moe.jitter_eps = 0;
    c.moe.expert_dropout = 0;
    c.optim.micro_batches = 2;
    c.optim.batch_size = 4;
    c.moe.group_size = 8;
    check_exact(c, V, MeshShape{2, 1, 1}, 0, 0, 0);
    check_exact(c, V, MeshShape{2, 1, 1}, 1, 0, 0);
    // geglu experts: w_in [E, M, 2, H], whose Adafactor state factors [2, H] per (expert, row)
    c.model.activation = Activation::Geglu;
    check_exact(c, V, MeshShape{2, 1, 1}, 0, 0, 0);
  }
  SECTION("shared experts (moe.shared_experts) with bias balancing: one rank, tensor = 2 on either expert axis") {
    Config c = moe_config();
    c.moe.shared_experts = 2;
    c.moe.balance = BalanceKind::Bias;
    check_exact(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    check_exact(c, V, MeshShape{1, 1, 2}, 0, 0, 1);
    c.moe.expert_axis = ExpertAxis::Tensor;
    check_exact(c, V, MeshShape{1, 1, 2}, 0, 0, 1);
  }
  SECTION("expert choice (moe.router = expert_choice): one rank, tensor = 2 on either expert axis") {
    Config c = moe_config();
    c.moe.router = RouterKind::ExpertChoice;
    check_exact(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    check_exact(c, V, MeshShape{1, 1, 2}, 0, 0, 1);
    c.moe.expert_axis = ExpertAxis::Tensor;
    check_exact(c, V, MeshShape{1, 1, 2}, 0, 0, 1);
  }
  SECTION("expert replicas (mesh.expert_parallel): E / P experts and P x G x C expert rows per rank") {
    // E = 4 on data = 4 in expert groups of 2, and E = 2 on data = 4 by default (gcd): each rank
    // holds 2 resp. 1 experts, as the built model does; with P = 1 every expert on every rank.
    Config c = moe_config();
    c.optim.batch_size = 8;
    c.optim.micro_batches = 1;
    for (const auto& [E, P] : {std::pair{4, 2}, std::pair{2, 0}, std::pair{4, 1}}) {
      c.moe.num_experts = E;
      c.mesh.expert_parallel = P;
      for (const OptimizerKind opt : {OptimizerKind::AdamW, OptimizerKind::Adafactor}) {
        c.optim.name = opt;
        for (int data = 0; data < 4; ++data) check_exact(c, V, MeshShape{1, 4, 1}, 0, data, 0);
      }
    }
    c.optim.name = OptimizerKind::AdamW;
    c.moe.num_experts = 4;
    c.mesh.expert_parallel = 2;
    const MemoryPlan rep = plan_memory(c, V, MeshShape{1, 4, 1}, 0, 3, 0);
    c.mesh.expert_parallel = 4;
    const MemoryPlan once = plan_memory(c, V, MeshShape{1, 4, 1}, 0, 3, 0);
    // one expert = w_in [M, H] + w_out [H, M] = 2 x 32 x 64; 2 MoE layers; 2 experts per rank instead of 1
    CHECK(rep.param_bytes == once.param_bytes + 2 * (2 * 32 * 64) * sizeof(float));
  }
  SECTION("optim.shard_state: each data rank's owned state (whole parameters), every data rank") {
    // Dense with tensor and pipe (tied embedding on both stages), MoE with experts over data (kept
    // by their rank) and over tensor; AdamW and Adafactor. The data ranks' state adds up to the
    // unsharded state of the replicated parameters once plus every rank's own experts.
    Config dense = dense_config(), moe = moe_config();
    dense.model.tied_embeddings = true;
    moe.optim.batch_size = 8;
    Config moe_tensor = moe;
    moe_tensor.moe.expert_axis = ExpertAxis::Tensor;
    for (const OptimizerKind opt : {OptimizerKind::AdamW, OptimizerKind::Adafactor})
      for (auto [c, mesh] : {std::pair{dense, MeshShape{2, 2, 2}}, std::pair{moe, MeshShape{1, 4, 1}},
                             std::pair{moe_tensor, MeshShape{1, 2, 2}}}) {
        c.optim.name = opt;
        c.optim.shard_state = true;
        for (int pipe = 0; pipe < mesh.pipe; ++pipe) {
          size_t sharded_sum = 0;
          for (int data = 0; data < mesh.data; ++data) {
            check_exact(c, V, mesh, pipe, data, mesh.tensor - 1);
            sharded_sum += plan_memory(c, V, mesh, pipe, data, 0).optim_bytes;
          }
          Config unsharded = c;
          unsharded.optim.shard_state = false;
          const size_t whole = plan_memory(unsharded, V, mesh, pipe, 0, 0).optim_bytes;
          if (c.moe.every > 0 && c.moe.expert_axis == ExpertAxis::Data) CHECK(sharded_sum > whole);  // each rank's experts
          else CHECK(sharded_sum == whole);
          CHECK(plan_memory(c, V, mesh, pipe, 0, 0).optim_bytes < whole);
        }
      }
  }
  SECTION("whole-model counts: a one-rank plan holds every parameter") {
    for (bool tied : {false, true}) {
      Config c = moe_config();
      c.model.tied_embeddings = tied;
      const MemoryPlan p = plan_memory(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
      const test::MemoryMeasured m = test::measure_memory(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
      CHECK(size_t(p.params_total) * sizeof(float) == m.param_bytes);
      // activated: all but the E - k = 2 experts a token skips in each of the 2 MoE layers;
      // one expert = w_in [M, H] + w_out [H, M] = 2 x 32 x 64
      CHECK(p.params_activated == p.params_total - 2 * 2 * (2 * 32 * 64));
    }
    // shared experts: every token visits them, so they add to both counts and to the FLOPs
    Config c = moe_config();
    const MemoryPlan p = plan_memory(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    c.moe.shared_experts = 3;
    const MemoryPlan q = plan_memory(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    CHECK(q.params_total == p.params_total + 2 * 3 * (2 * 32 * 64));
    CHECK(q.params_activated == p.params_activated + 2 * 3 * (2 * 32 * 64));
    // per token and MoE layer, forward 2 x 2 x 32 x 64 FLOPs per shared expert, x 3 for the training step
    CHECK(q.flops_per_token == Approx(p.flops_per_token + 3.0 * 2 * 3 * (2.0 * 2 * 32 * 64)).epsilon(1e-12));
    // expert choice at factor 1.25: C = ceil(16 * 1.25 / 4) = 5 tokens per expert and group of 16,
    // E C / S = 1.25 experts per token: 1.25 expert FFNs in the FLOPs (top-2: 2), 2 activated
    // (rounded up) of the E = 4 experts
    c = moe_config();
    c.moe.router = RouterKind::ExpertChoice;
    c.moe.capacity_factor_train = 1.25;
    const MemoryPlan ec = plan_memory(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    CHECK(ec.params_total == p.params_total);
    CHECK(ec.params_activated == p.params_activated);
    CHECK(ec.flops_per_token == Approx(p.flops_per_token - 3.0 * 2 * 0.75 * (2.0 * 2 * 32 * 64)).epsilon(1e-12));
  }
}

TEST_CASE("memory plan: the weights' bf16 copy with bf16 GEMMs on a GPU, 2 bytes a parameter, as the store holds it",
          "[memory][bf16]") {
  // The store keeps weights16() (model/params.hpp) only where the layers keep bf16 copies
  // (plans_bf16_copies: bf16 on the GPU; here the deferred host device takes the GPU's side): the
  // plan's parameters are then 4 + 2 bytes each, otherwise 4. The store's real bytes against it.
  for (Config cfg : {dense_config(), moe_config()}) {
    const int V = 50;
    cfg.model.precision = Precision::Bf16;
    const MemoryPlan host = plan_memory(cfg, V, MeshShape{}, 0, 0, 0);
    cfg.run.device = Device::Cuda;
    const MemoryPlan gpu = plan_memory(cfg, V, MeshShape{}, 0, 0, 0);
    cfg.model.precision = Precision::Fp32;
    const MemoryPlan gpu_fp32 = plan_memory(cfg, V, MeshShape{}, 0, 0, 0);
    const size_t params = size_t(gpu.params_rank);
    CHECK(host.param_bytes == params * sizeof(float));
    CHECK(gpu_fp32.param_bytes == params * sizeof(float));
    CHECK(gpu.param_bytes == params * (sizeof(float) + sizeof(uint16_t)));
    CHECK(gpu.grad_bytes == host.grad_bytes);
    const test::GemmPrecisionScope bf16(Precision::Bf16);
    {
      Transformer<float> model(cfg, V);
      CHECK(model.params().weights16_bytes() == 0);  // the host rounds per GEMM
    }
    test::DeferredHostDevice device;
    Transformer<float> model(cfg, V);
    CHECK(model.params().size() == params);
    CHECK(model.params().size() * sizeof(float) + model.params().weights16_bytes() == gpu.param_bytes);
  }
}

TEST_CASE("memory plan: the layers' bf16 copies with bf16 GEMMs on a GPU, as the deferred device allocates them",
          "[memory][bf16][deferred]") {
  // Where the layers keep bf16 copies (plans_bf16_copies; the deferred host device takes the GPU's
  // side and allocates them in its arena, which measure_memory then measures), the copies' bytes of
  // each phase: the plan's activations with bf16 GEMMs less those with fp32 GEMMs against the same
  // difference of the first forward's arena growth, and the plan's backward workspace against the
  // first backward's. Exactly: the copies are Buffers of the arena, which rounds a block to 256
  // bytes, and each copy of these decks is a multiple of it (the norms' outputs, the feed-forwards'
  // h and dy|dpre, attention's and cross-attention's backward copies, the dispatch gather's copy of
  // the experts' input, the experts' x|h and dy|dpre). MoE on one rank and tensor = 2 (the experts'
  // hidden units split); dense with dropout, tensor = 2; grouped key/value heads; the fused attention
  // kernel; encdec on one rank and every stage of pipe = 4, whose last stage's cross-attentions round
  // the encoder output themselves (ln_enc is the stage before's). The all-to-all's expert-side copy
  // is the shape table's ("shape table: the bf16 copies ..."): the stand-in Comms copy device memory
  // as host memory.
  const int V = 50;
  test::DeferredHostDevice device;
  struct Case {
    const char* what;
    Config cfg;
    MeshShape mesh;
    RankCoords at;
  };
  Config grouped = dense_config(), fused = dense_config(), encdec = dense_config();
  grouped.model.kv_heads = 2;
  fused.model.attention_kernel = AttentionKernel::Fused;
  encdec.model.arch = ModelArch::EncDec;
  std::vector<Case> cases{{"moe", moe_config(), {1, 1, 1}, {}},
                          {"moe", moe_config(), {1, 1, 2}, {}},
                          {"dense", dense_config(), {1, 1, 1}, {}},
                          {"dense", dense_config(), {1, 1, 2}, {0, 0, 1}},
                          {"grouped", grouped, {1, 1, 2}, {}},
                          {"fused attention", fused, {1, 1, 1}, {}},
                          {"encdec", encdec, {1, 1, 1}, {}}};
  for (int stage = 0; stage < 4; ++stage) cases.push_back({"encdec", encdec, {4, 1, 1}, {stage, 0, 0}});
  for (const Case& c : cases) {
    INFO(c.what << " on mesh " << c.mesh.str() << " at pipe " << c.at.pipe << " tensor " << c.at.tensor);
    int64_t forward[2], backward[2], activations[2], workspace[2];
    for (const Precision p : {Precision::Fp32, Precision::Bf16}) {
      Config cfg = c.cfg;
      cfg.model.precision = p;
      cfg.run.device = Device::Cuda;
      const test::GemmPrecisionScope scope(p);
      const MemoryPlan plan = plan_memory(cfg, V, c.mesh, c.at.pipe, c.at.data, c.at.tensor);
      const test::MemoryMeasured m = test::measure_memory(cfg, V, c.mesh, c.at.pipe, c.at.data, c.at.tensor);
      const int bf16 = int(p == Precision::Bf16);
      activations[bf16] = int64_t(plan.activation_bytes), workspace[bf16] = int64_t(plan.workspace_bytes);
      forward[bf16] = m.forward_heap, backward[bf16] = m.backward_heap;
    }
    INFO("forward copies planned " << activations[1] - activations[0] << " B, allocated " << forward[1] - forward[0]
                                   << " B; backward copies planned " << workspace[1] - workspace[0] << " B, allocated "
                                   << backward[1] - backward[0] << " B");
    CHECK(activations[1] > activations[0]);
    CHECK(workspace[1] > workspace[0]);
    CHECK(activations[1] - activations[0] == forward[1] - forward[0]);
    CHECK(workspace[1] - workspace[0] == backward[1] - backward[0]);
  }
}

TEST_CASE("memory plan: the norms' bf16 output copies with bf16 GEMMs on a GPU, as the layers hold them",
          "[memory][bf16]") {
  // A norm whose output GEMMs read keeps its bf16 copy (LayerNorm::output16) where the layers keep
  // copies (the deferred host device takes the GPU's side): the shape table's "output, bf16"
  // buffers of the norms against the copies the first forward of a micro-batch of the plan's rows
  // allocates, exactly; the ln2 before an MoE layer keeps none (its router reads fp32).
  const int V = 50;
  for (Config cfg : {dense_config(), moe_config()}) {
    INFO("moe.every " << cfg.moe.every);
    cfg.model.precision = Precision::Bf16;
    cfg.run.device = Device::Cuda;
    const ShapeTable table(cfg, V, MeshShape{}, {}, true);
    size_t planned = 0;
    for (const LayerShapes& l : table.layers())
      for (const BufferShape& b : l.buffers)
        if (l.kind == LayerKind::LayerNorm && std::string(b.name) == "output, bf16") planned += size_t(b.bytes().value());
    const int B = table.letters().B, T = table.letters().T, N = B * T;
    CHECK(planned == size_t(N) * 32 * 2 * (cfg.moe.every > 0 ? 4 + 2 + 1 : 4 + 4 + 1));  // ln1 x 4, dense ln2, ln_f
    const test::GemmPrecisionScope bf16(Precision::Bf16);
    test::DeferredHostDevice device;
    Transformer<float> model(cfg, table, placement_at(cfg, MeshShape{}, {}));
    model.init(5, 1.0);
    std::vector<int32_t> tokens(size_t(N), 3);
    std::vector<float> mask(size_t(N), 1.f);
    const MicroBatch mb{B, T, tokens.data(), tokens.data(), mask.data()};
    model.forward(StepContext{42, 1, true, 0, nullptr}, mb, LossWeights{1.0 / N, 0, 0});
    device_synchronize();
    size_t held = model.final_norm().output16_bytes();
    for (auto& b : model.blocks()) {
      held += b.ln1.output16_bytes() + b.ln2.output16_bytes();
      CHECK((b.ln2.output16_bytes() == 0) == bool(b.moe));
    }
    CHECK(held == planned);
  }
}

TEST_CASE("memory plan: active parameters of fine-grained experts with shared ones; the plan's count line", "[memory]") {
  // 16 experts of width 16 (moe.expert_d_ff) with top-8 and 2 shared experts against 4 experts of
  // width d_ff = 64 with top-2, M = 32, 2 MoE layers, gelu (one expert: w_in [M, H] + w_out [H, M]).
  const int V = 50, M = 32;
  const Config base = moe_config();
  Config c = base;
  c.moe.num_experts = 16;
  c.moe.expert_d_ff = 16;
  c.moe.router = RouterKind::TopK;
  c.moe.top_k = 8;
  c.moe.shared_experts = 2;
  c.moe.gate = MoeGate::Sigmoid;  // the gate adds no parameter
  const MemoryPlan p = plan_memory(base, V, MeshShape{1, 1, 1}, 0, 0, 0);
  const MemoryPlan q = plan_memory(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
  const int64_t coarse = 2 * M * 64, fine = 2 * M * 16;
  // total: the experts (routed and shared) and the wider router change
  CHECK(q.params_total == p.params_total + 2 * (-4 * coarse + 16 * fine + 2 * fine + M * (16 - 4)));
  // active: all but the 16 - 8 routed experts a token skips in each MoE layer; the shared ones count
  CHECK(q.params_activated == q.params_total - 2 * (16 - 8) * fine);
  CHECK(format_count(46702792704.0) == "46.70B");
  CHECK(format_count(1281951744.0) == "1.28B");
  CHECK(format_count(2500.0) == "2.50K");
  CHECK(format_count(999.0) == "999");
  CHECK(format_bytes(512.0) == "512 B");
  CHECK(format_bytes(1536.0) == "1.50 KiB");
  CHECK(format_bytes(3.0 * 1024 * 1024 * 1024) == "3.00 GiB");
  const std::vector<std::vector<MemoryPlan>> stages{std::vector<MemoryPlan>{q}};
  const std::string report = memory_report(c, MeshShape{1, 1, 1}, stages, 0);
  CHECK_THAT(report, Catch::Contains("parameters: " + format_count(double(q.params_total)) + " total, " +
                                     format_count(double(q.params_activated)) + " active per token\n"));
}

TEST_CASE("memory plan: bytes sent per step follow the ring and all-to-all formulas", "[memory]") {
  const int V = 50;
  Config c = dense_config();  // 4 blocks, micro-batch 2 x 16 tokens of width 32 on data = 2
  const double NM4 = double(8 / (2 * 2)) * 16 * 32 * 4;
  const MemoryPlan d2 = plan_memory(c, V, MeshShape{1, 2, 1}, 0, 1, 0);
  CHECK(d2.sent_data == Approx(double(d2.param_bytes)).epsilon(1e-12));  // 2 (2-1)/2 x all params
  CHECK(d2.sent_tensor == 0);
  CHECK(d2.sent_pipe == 0);
  // tensor = 2, data = 1: rows 4; 2 micro-batches x (fwd + bwd) x (attention + ffn) x 4 blocks
  const MemoryPlan t2 = plan_memory(c, V, MeshShape{1, 1, 2}, 0, 0, 0);
  CHECK(t2.sent_tensor == Approx(2.0 * 2 * 2 * 4 * (2 * NM4)).epsilon(1e-12));
  // pipe = 2, data = 1, untied: stage 0 sends 2 micro-batches of activations, stage 1 their gradients
  const MemoryPlan p0 = plan_memory(c, V, MeshShape{2, 1, 1}, 0, 0, 0);
  const MemoryPlan p1 = plan_memory(c, V, MeshShape{2, 1, 1}, 1, 0, 0);
  CHECK(p0.sent_pipe == Approx(2 * 2 * NM4));
  CHECK(p1.sent_pipe == Approx(2 * 2 * NM4));
  CHECK(p0.in_flight == 2);
  CHECK(p1.in_flight == 1);
  // expert replicas: E = 4 on data = 4 in expert groups of 2. Data: the dense parameters' ring
  // all-reduce over 4 ranks, the experts' over their 2 replicas, and per MoE layer 2 all-to-alls
  // forward and 2 backward of E x G x C x M floats over the 2 ranks of the expert group.
  Config m = moe_config();
  m.optim.batch_size = 8;
  m.optim.micro_batches = 1;
  m.mesh.expert_parallel = 2;
  const MemoryPlan r = plan_memory(m, V, MeshShape{1, 4, 1}, 0, 1, 0);
  const double expert_floats = 2.0 * 2 * (2 * 32 * 64);  // 2 layers x 2 local experts x (w_in + w_out)
  const double dense = double(r.param_bytes) - expert_floats * 4;
  const double G = 2 * 16 / 16, C = std::ceil(2 * 16 * 1.25 / 4);  // 2 x 16 tokens per rank, top-2, factor 1.25
  const double a2a = 2 * (2 + 2) * (1.0 / 2) * (4 * G * C * 32 * 4);
  CHECK(r.sent_data == Approx(2.0 * 3 / 4 * dense + 2.0 * 1 / 2 * expert_floats * 4 + a2a).epsilon(1e-12));
  // The plan prints the all-to-all's share of the data axis on a row of its own (docs/user-guide.md
  // "The papers' models at their scale"); a dense model has no such row.
  CHECK(r.sent_data_all_to_all == Approx(a2a).epsilon(1e-12));
  char row[128];
  std::snprintf(row, sizeof row, "\n  %-26s  %16lld\n", "  of data: MoE all-to-all", std::llround(a2a));
  CHECK_THAT(memory_report(m, MeshShape{1, 4, 1}, {{r}}, 0), Catch::Contains(row));
  CHECK_THAT(memory_report(c, MeshShape{1, 2, 1}, {{d2}}, 0), !Catch::Contains("MoE all-to-all"));
}

TEST_CASE("memory plan: GShard section 5.1, memory per rank stays flat as experts grow with ranks", "[memory]") {
  const int V = 64, rows_per_rank = 4;
  auto deck = [&](int ranks, const std::string& axis) {
    Config c;
    c.model.seq_len = 32;
    c.model.d_model = 64;
    c.model.num_layers = 4;
    c.model.num_heads = 4;
    c.model.d_ff = 256;
    c.moe.num_experts = 2 * ranks;
    c.moe.every = 2;
    c.moe.router = RouterKind::Top2;
    c.moe.group_size = 32;
    c.moe.expert_axis = test::option<ExpertAxis>(axis);
    c.optim.name = OptimizerKind::Adafactor;
    c.optim.batch_size = rows_per_rank * ranks;
    c.optim.micro_batches = 1;
    return c;
  };
  std::vector<double> sharded, replicated;
  for (int ranks : {1, 2, 4, 8}) {
    const MeshShape mesh{1, ranks, 1};
    sharded.push_back(double(plan_memory(deck(ranks, "data"), V, mesh, 0, ranks - 1, 0).total_bytes()));
    // negative control: the same decks with every expert on every rank (expert axis of extent 1)
    replicated.push_back(double(plan_memory(deck(ranks, "tensor"), V, mesh, 0, ranks - 1, 0).total_bytes()));
  }
  const auto [lo, hi] = std::minmax_element(sharded.begin(), sharded.end());
  INFO("per-rank bytes at 1, 2, 4, 8 ranks: " << sharded[0] << " " << sharded[1] << " " << sharded[2] << " " << sharded[3]);
  CHECK(*hi <= 1.10 * *lo);  // within 10% (GShard Figure / section 5.1: O(1) memory per device)
  CHECK(replicated.back() > 1.5 * replicated.front());

  // Cross-check with the built model for the 1- and 2-rank placements.
  {
    const Config c = deck(1, "data");
    const MemoryPlan p = plan_memory(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    const test::MemoryMeasured m = test::measure_memory(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    CHECK(p.param_bytes == m.param_bytes);
    CHECK(p.optim_bytes == m.optim_bytes);
    check_activations(p, m);
  }
  {
    const Config c = deck(2, "data");
    const MeshShape mesh{1, 2, 1};
    const MemoryPlan p = plan_memory(c, V, mesh, 0, 1, 0);
    const test::MemoryMeasured m = test::measure_memory(c, V, mesh, 0, 1, 0);
    // Experts are sharded over data: this rank holds E / 2 of them, exactly as planned.
    CHECK(m.param_bytes == p.param_bytes);
    CHECK(p.optim_bytes == m.optim_bytes);
    check_activations(p, m);  // expert rows E_local x D x G x C = E x G x C either way
  }
}

TEST_CASE("memory plan: a deck that does not split over the mesh is an InputError", "[memory]") {
  Config c = dense_config();
  CHECK_THROWS_AS(plan_memory(c, 50, MeshShape{1, 1, 3}, 0, 0, 0), InputError);  // 4 heads over 3
  CHECK_THROWS_AS(plan_memory(c, 50, MeshShape{3, 1, 1}, 0, 0, 0), InputError);  // 4 layers over 3
  CHECK_THROWS_AS(plan_memory(c, 0, MeshShape{1, 1, 1}, 0, 0, 0), InputError);   // unknown vocabulary
  Config m = moe_config();
  m.moe.num_experts = 3;
  m.moe.router = RouterKind::Top1;
  m.mesh.expert_parallel = 2;
  CHECK_THROWS_AS(plan_memory(m, 50, MeshShape{1, 2, 1}, 0, 0, 0), InputError);  // 3 experts over 2
  m.mesh.expert_parallel = 4;
  CHECK_THROWS_AS(plan_memory(m, 50, MeshShape{1, 2, 1}, 0, 0, 0), InputError);  // expert groups of 4 in 2 data ranks
  m.mesh.expert_parallel = 0;  // gcd(3, 2) = 1: every data rank holds every expert
  CHECK(plan_memory(m, 50, MeshShape{1, 2, 1}, 0, 0, 0).param_bytes == plan_memory(m, 50, MeshShape{1, 1, 1}, 0, 0, 0).param_bytes);
}

TEST_CASE("checked sizes: arithmetic throws instead of wrapping", "[memory]") {
  const Checked big = int64_t(1) << 62;
  CHECK((big + (big - 1)).value() == INT64_MAX);
  CHECK_THROWS_AS(big + big, SizeOverflow);
  CHECK_THROWS_AS(big * 2, SizeOverflow);
  CHECK_THROWS_AS(Checked(INT64_MIN) - 1, SizeOverflow);
  CHECK_THROWS_AS(Checked(uint64_t(1) << 63), SizeOverflow);
  CHECK((Checked(3) * 4 + 5 - 2).value() == 15);
  CHECK((Checked(17) / 5).value() == 3);
  CHECK((Checked(17) % 5).value() == 2);
  CHECK(Checked(1000000000) * 1000000000 == Checked(int64_t(1000000000000000000)));
  CHECK(to_string(Checked(-7)) == "-7");
}

TEST_CASE("byte sizes: K, M, G, T suffixes are powers of 1024; anything else is refused", "[memory]") {
  CHECK(parse_byte_size("512") == 512);
  CHECK(parse_byte_size("1K") == 1024);
  CHECK(parse_byte_size("512M") == int64_t(512) << 20);
  CHECK(parse_byte_size("24G") == int64_t(24) << 30);
  CHECK(parse_byte_size("24gib") == int64_t(24) << 30);
  CHECK(parse_byte_size(" 3 GB ") == int64_t(3) << 30);
  CHECK(parse_byte_size("2T") == int64_t(2) << 40);
  CHECK(parse_byte_size("4194304T") == int64_t(1) << 62);
  std::string why;
  for (const char* bad : {"", "G", "12X", "-1G", "0", "0M", "1.5G", "4194305T", "99999999999999999999", "1 P"}) {
    INFO("'" << bad << "'");
    CHECK_FALSE(parse_byte_size(bad, &why).has_value());
    CHECK_FALSE(why.empty());
    why.clear();
  }
}

TEST_CASE("memory plan: a model too large for 64-bit byte counts is an InputError naming the keys", "[memory]") {
  Config c = dense_config();
  c.model.d_model = 268435456;  // 2^28: four [M, M] attention matrices per block already pass 2^63 bytes
  c.model.num_heads = 4;
  c.model.num_layers = 64;
  try {
    plan_memory(c, 50, MeshShape{1, 1, 1}, 0, 0, 0);
    FAIL("no error");
  } catch (const InputError& e) {
    const std::string m = e.what();
    CHECK(m.find("too large") != std::string::npos);
    CHECK(m.find("model.d_model = 268435456") != std::string::npos);
  }
  // A width beyond the layers' 32-bit indices is refused by name too.
  c.model.d_model = int64_t(1) << 40;
  CHECK_THROWS_WITH(plan_memory(c, 50, MeshShape{1, 1, 1}, 0, 0, 0), Catch::Contains("model.d_model"));
  // Large but representable: exact totals, optimizer state (AdamW) = 2 x parameters.
  c.model.d_model = 65536, c.model.num_heads = 8;
  const MemoryPlan p = plan_memory(c, 50, MeshShape{1, 1, 1}, 0, 0, 0);
  CHECK(p.params_rank >= int64_t(64) * 4 * 65536 * 65536);
  CHECK(p.optim_bytes == 2 * p.param_bytes);
  CHECK(p.total_bytes() > p.param_bytes + p.grad_bytes + p.optim_bytes);
}

TEST_CASE("memory limit: cgroup v1 and v2 limits, the smallest ancestor, unlimited values ignored", "[memory]") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("meshmoe_cgroup_test_" + std::to_string(::getpid()));
  fs::remove_all(root);
  auto put = [&](const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  };
  // v1: the memory controller's hierarchy; the parent's limit is the smaller one
  put(root / "memory/memory.limit_in_bytes", "9223372036854771712");
  put(root / "memory/job/memory.limit_in_bytes", "3221225472");
  put(root / "memory/job/step/memory.limit_in_bytes", "9223372036854771712");
  std::string file;
  auto v1 = cgroup_memory_limit("5:cpu,cpuacct:/other\n4:memory:/job/step\n0::/\n", root.string(), &file);
  REQUIRE(v1.has_value());
  CHECK(*v1 == 3221225472.0);
  CHECK(file == (root / "memory/job/memory.limit_in_bytes").string());
  // v2: "max" is no limit; the cgroup's own limit
  put(root / "a/memory.max", "max");
  put(root / "a/b/memory.max", "1073741824");
  auto v2 = cgroup_memory_limit("0::/a/b\n", root.string(), &file);
  REQUIRE(v2.has_value());
  CHECK(*v2 == 1073741824.0);
  CHECK(file == (root / "a/b/memory.max").string());
  CHECK_FALSE(cgroup_memory_limit("0::/a\n", root.string(), &file).has_value());
  CHECK_FALSE(cgroup_memory_limit("4:memory:/\n", root.string(), &file).has_value());
  CHECK_FALSE(cgroup_memory_limit("", root.string(), &file).has_value());
  fs::remove_all(root);
  // This process: some positive figure with its source, and run.max_memory replaces it.
  const MemoryLimit here = available_memory();
  CHECK(here.bytes > 0);
  CHECK_FALSE(here.source.empty());
  const MemoryLimit set = available_memory("3G");
  CHECK(set.bytes == 3.0 * 1024 * 1024 * 1024);
  CHECK(set.source == "run.max_memory = \"3G\"");
  CHECK_THROWS_AS(available_memory("3Q"), InputError);
}

TEST_CASE("memory plan: the dataset, the runtime and the BLEU decoder's caches join the total", "[memory]") {
  Config cfg = dense_config();
  cfg.run.threads = 3;
  const int V = 50;
  MemoryPlan p = plan_memory(cfg, V, MeshShape{1, 1, 1}, 0, 0, 0);
  const size_t model = p.total_bytes();
  CHECK(model == p.model_bytes());
  add_process_memory(cfg, V, 12345, p);
  CHECK(p.dataset_bytes == 12345);
  // 32 MiB measured baseline and 10 MiB per BLAS thread beyond the first (run/memory.cpp)
  CHECK(p.runtime_bytes == (size_t(32) << 20) + 2 * (size_t(10) << 20));
  CHECK(p.runtime_bytes == runtime_memory_bytes(3));
  CHECK(p.decoder_bytes == 0);  // no translation scores during training
  CHECK(p.total_bytes() == model + 12345 + p.runtime_bytes);
  cfg.eval.bleu_every = 10;
  add_process_memory(cfg, V, 12345, p);
  // greedy, 16 sources, at most 64 new tokens (the default the trainer decodes with) and
  // model.seq_len = 16 (Trainer::evaluate_bleu)
  CHECK(kBleuMaxLen == BeamOptions{}.max_len);
  const DecodeShape s = bleu_eval_shape(cfg);
  CHECK((s.streams == kBleuBatch && s.hyps == 1 && s.max_new == 16 && s.prompt == 16));
  CHECK(p.decoder_bytes == size_t(decode_memory_bytes(cfg, V, s)));
  CHECK(p.decoder_bytes > 0);
  CHECK(p.total_bytes() == model + 12345 + p.runtime_bytes + p.decoder_bytes);
  // A GPU plan counts the device's memory: the host's dataset and runtime are not in it.
  cfg.run.device = Device::Cuda;
  MemoryPlan gpu = plan_memory(cfg, V, MeshShape{1, 1, 1}, 0, 0, 0);
  add_process_memory(cfg, V, 12345, gpu);
  CHECK(gpu.total_bytes() == model);
}

TEST_CASE("memory: Pss of this process grows by the pages it touches", "[memory]") {
  if (!std::ifstream("/proc/self/smaps_rollup")) {
    SUCCEED("no /proc/self/smaps_rollup (Linux < 4.14): Pss is not measured here");
    return;
  }
  const double before = pss_bytes();
  REQUIRE(before > 0);
  std::vector<char> block(size_t(64) << 20, 1);  // 64 MiB, every page written
  const double after = pss_bytes();
  INFO("Pss " << before << " B before, " << after << " B after touching 64 MiB");
  CHECK(after - before >= 0.95 * double(block.size()));
  CHECK(after - before <= 1.05 * double(block.size()));
}
