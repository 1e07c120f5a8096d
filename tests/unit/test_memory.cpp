// The memory plan (src/train/memory.hpp) against reality and against GShard section 5.1.
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

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "train/memory.hpp"

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
  c.model.activation = "geglu";
  c.model.tied_embeddings = false;
  c.model.dropout = 0.1;
  c.moe.every = 0;
  c.optim.batch_size = 8;
  c.optim.micro_batches = 2;
  return c;
}

Config moe_config() {
  Config c = small_model();
  c.model.activation = "gelu";
  c.moe.num_experts = 4;
  c.moe.every = 2;
  c.moe.router = "top2";
  c.moe.group_size = 16;
  c.moe.jitter_eps = 0.01;
  c.moe.expert_dropout = 0.1;
  c.optim.batch_size = 4;
  c.optim.micro_batches = 1;
  return c;
}

// Within 10% of the measured heap growth (stated in the file header).
void check_activations(const MemoryPlan& p, const MemoryMeasured& m) {
  INFO("planned activations " << p.activation_bytes << " B, forward heap growth " << m.forward_heap << " B");
  REQUIRE(m.forward_heap > 0);
  CHECK(std::fabs(double(p.activation_bytes) - double(m.forward_heap)) <= 0.10 * double(m.forward_heap));
  INFO("planned workspace " << p.workspace_bytes << " B, backward heap growth " << m.backward_heap << " B");
  REQUIRE(m.backward_heap > 0);
  CHECK(std::fabs(double(p.workspace_bytes) - double(m.backward_heap)) <= 0.10 * double(m.backward_heap));
}

void check_exact(const Config& cfg, int vocab, const MeshShape& mesh, int pipe, int data, int tensor) {
  const MemoryPlan p = plan_memory(cfg, vocab, mesh, pipe, data, tensor);
  const MemoryMeasured m = measure_memory(cfg, vocab, mesh, pipe, data, tensor);
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
    c.optim.name = "adafactor";
    check_exact(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
  }
  SECTION("dense, tensor = 2 (Megatron blocks) and pipe = 2 (both stages, untied and tied)") {
    Config c = dense_config();
    c.optim.name = "adafactor";
    check_exact(c, V, MeshShape{1, 1, 2}, 0, 0, 1);
    check_exact(c, V, MeshShape{2, 1, 1}, 0, 0, 0);
    check_exact(c, V, MeshShape{2, 1, 1}, 1, 0, 0);
    c.model.tied_embeddings = true;
    check_exact(c, V, MeshShape{2, 1, 1}, 1, 0, 0);
    check_exact(c, V, MeshShape{2, 2, 2}, 1, 1, 1);
  }
  SECTION("MoE (top-2, jitter, expert dropout), one rank and two pipeline stages") {
    Config c = moe_config();
    check_exact(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    c.optim.name = "adafactor";
    check_exact(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    c.moe.router = "top1";
    c.moe.jitter_eps = 0;
    c.moe.expert_dropout = 0;
    c.optim.micro_batches = 2;
    c.optim.batch_size = 4;
    c.moe.group_size = 8;
    check_exact(c, V, MeshShape{2, 1, 1}, 0, 0, 0);
    check_exact(c, V, MeshShape{2, 1, 1}, 1, 0, 0);
  }
  SECTION("whole-model counts: a one-rank plan holds every parameter") {
    for (bool tied : {false, true}) {
      Config c = moe_config();
      c.model.tied_embeddings = tied;
      const MemoryPlan p = plan_memory(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
      const MemoryMeasured m = measure_memory(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
      CHECK(size_t(p.params_total) * sizeof(float) == m.param_bytes);
      // activated: all but the E - k = 2 experts a token skips in each of the 2 MoE layers;
      // one expert = w_in [M, H] + w_out [H, M] = 2 x 32 x 64
      CHECK(p.params_activated == p.params_total - 2 * 2 * (2 * 32 * 64));
    }
  }
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
    c.moe.router = "top2";
    c.moe.group_size = 32;
    c.moe.expert_axis = axis;
    c.optim.name = "adafactor";
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
    const MemoryMeasured m = measure_memory(c, V, MeshShape{1, 1, 1}, 0, 0, 0);
    CHECK(p.param_bytes == m.param_bytes);
    CHECK(p.optim_bytes == m.optim_bytes);
    check_activations(p, m);
  }
  {
    const Config c = deck(2, "data");
    const MeshShape mesh{1, 2, 1};
    const MemoryPlan p = plan_memory(c, V, mesh, 0, 1, 0);
    const MemoryMeasured m = measure_memory(c, V, mesh, 0, 1, 0);
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
  m.moe.router = "top1";
  CHECK_THROWS_AS(plan_memory(m, 50, MeshShape{1, 2, 1}, 0, 0, 0), InputError);  // 3 experts over 2
}
