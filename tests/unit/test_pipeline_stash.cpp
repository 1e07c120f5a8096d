// Pipeline activations (docs/ARCHITECTURE.md "Pipeline activations"): a stage that parks a
// micro-batch's saved state in an ActivationStash, runs another micro-batch's forward, and swaps
// the first back, gets bitwise the gradients of forward then backward. The other micro-batch has
// other sizes, tokens, step and offset, so any member a layer's backward reads but its
// saved_state() does not list changes the result (or its size): the test catches a forgotten one.
// Then PipelineExecutor::train with model.recompute = none and block on pipe = 2 and 4 (and
// 2 x data 2 with experts over data: the all-to-all plans) against each other and against one
// rank: gradients bitwise equal (the same arithmetic in the same order), losses summed in
// another order within 1e-12 relative; none never recomputes and parks at most P-p-1.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <cstring>
#include <random>

#include "model/activation_stash.hpp"
#include "model/transformer.hpp"
#include "parallel/pipeline_executor.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "test_util.hpp"

using namespace meshmoe;

namespace {

// Dropout, expert dropout, router jitter, random second expert, No-Token-Left-Behind all on.
Config stash_config(bool moe, int layers) {
  Config c;
  c.run.seed = 5;
  c.model.seq_len = 8;
  c.model.d_model = 8;
  c.model.num_layers = layers;
  c.model.num_heads = 2;
  c.model.d_ff = 12;
  c.model.activation = Activation::Gelu;
  c.model.tied_embeddings = false;
  c.model.dropout = 0.2;
  c.moe.num_experts = 4;
  c.moe.every = moe ? 1 : 0;
  c.moe.router = RouterKind::Top2;
  c.moe.second_expert = SecondExpertPolicy::Random;
  c.moe.group_size = 8;
  c.moe.capacity_factor_train = 1.0;
  c.moe.jitter_eps = 0.05;
  c.moe.expert_dropout = 0.2;
  c.moe.no_token_left_behind = true;
  c.moe.z_loss_coef = 1e-2;
  c.moe.aux_loss_coef = 1e-1;
  return c;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

bool bitwise_equal(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// One stage (pipe_rank of pipe_size; no communication needed) of the model: forward(A), park A,
// forward(B), bring A back, backward(A), against forward(A), backward(A) on a twin.
void check_park_and_restore(const Config& cfg, int pipe_rank, int pipe_size) {
  const int V = 13, T = 8, M = int(cfg.model.d_model);
  const Placement sh = placement_at(cfg, MeshShape{pipe_size, 1, 1}, RankCoords{pipe_rank, 0, 0});
  Transformer<float> ref(cfg, V, sh), parked(cfg, V, sh);
  ref.init(3, 1.0);
  parked.init(3, 1.0);
  const Batch a = test::random_batch(2, T, V, 1, 5), b = test::random_batch(6, T / 2, V, 2, 5);  // B: other N and T
  const Micro ma{a, StepContext{5, 7, true, 16, nullptr}}, mb{b, StepContext{5, 8, true, 40, nullptr}};
  const LossWeights w{1.0 / 30, 0.01, 0.001}, wb{1.0 / 17, 0.03, 0.004};
  const std::vector<float> xa = random_floats(size_t(2) * T * M, 3), xb = random_floats(size_t(6) * T / 2 * M, 4);
  const std::vector<float> da = random_floats(size_t(2) * T * M, 5);
  const float* x_in_a = parked.first_stage() ? nullptr : xa.data();
  const float* d_out_a = parked.last_stage() ? nullptr : da.data();

  ref.params().zero_grad();
  const ForwardStats fr = ref.forward(ma.ctx, ma.view(), w, x_in_a);
  ref.backward(ma.ctx, w, d_out_a);

  parked.params().zero_grad();
  ActivationStash stash_a, stash_b;
  const ForwardStats fp = parked.forward(ma.ctx, ma.view(), w, x_in_a);
  stash_a.swap_with(parked);
  parked.forward(mb.ctx, mb.view(), wb, parked.first_stage() ? nullptr : xb.data());
  stash_b.swap_with(parked);
  stash_a.swap_with(parked);
  parked.backward(ma.ctx, w, d_out_a);

  CHECK(fp.ce_sum == fr.ce_sum);
  CHECK(fp.aux_sum == fr.aux_sum);
  const auto& P = parked.params();
  REQUIRE(P.size() == ref.params().size());
  for (const ParamInfo& p : P.infos()) {
    INFO(p.name);
    CHECK(bitwise_equal(P.grads() + p.flat_offset, ref.params().grads() + p.flat_offset, p.size));
  }
  if (!parked.first_stage()) {
    REQUIRE(parked.input_grad().size() == ref.input_grad().size());
    CHECK(bitwise_equal(parked.input_grad().data(), ref.input_grad().data(), ref.input_grad().size()));
  }
}

}  // namespace

TEST_CASE("pipeline: a parked micro-batch's state swapped back gives bitwise the same backward", "[pipeline]") {
  for (bool moe : {true, false})
    for (const auto& [stage, stages] : {std::pair{0, 1}, {0, 2}, {1, 2}}) {
      INFO((moe ? "MoE" : "dense") << ", stage " << stage << " of " << stages);
      Config c = stash_config(moe, 2);
      check_park_and_restore(c, stage, stages);
      c.model.tied_embeddings = true;
      c.moe.router = RouterKind::Top1;
      c.moe.dropless = true;
      c.model.activation = Activation::Geglu;
      c.moe.shared_experts = 2;  // the shared experts' saved state parks with the layer's
      check_park_and_restore(c, stage, stages);
    }
}

// model.recompute's names: test_deck.cpp, "deck: option keys".
TEST_CASE("pipeline: the ideal bubble", "[pipeline]") {
  CHECK(ideal_bubble(1, 4) == 0);
  CHECK(ideal_bubble(2, 4) == Approx(1.0 / 5));
  CHECK(ideal_bubble(4, 8) == Approx(3.0 / 11));
}

namespace {

struct StageRun {
  std::vector<float> grads;  // this rank's ParamStore gradients after the steps
  std::vector<std::string> names;
  std::vector<size_t> offsets, sizes;
  double ce = 0, aux = 0, z = 0;  // summed over the steps' forwards on this rank
  double recompute_s = 0;
  int parked_peak = 0;
};

// `steps` steps of PipelineExecutor::train on `mesh` (experts over data when data > 1), without
// optimizer updates: the gradients accumulate over the steps (each step has other random numbers).
StageRun run_pipeline(const Config& cfg, Mesh& mesh, Recompute recompute, int micro_batches, int steps) {
  const int V = 13, T = 8, B = 8;
  Transformer<float> model(cfg, V, model_sharding(mesh, cfg));
  model.init(9, 1.0);
  PhaseTimers timers;
  PipelineExecutor pipeline(model, mesh, timers, recompute);
  StageRun out;
  model.params().zero_grad();
  for (int step = 1; step <= steps; ++step) {
    const Batch batch = test::random_batch(B, T, V, uint32_t(100 + step), 5);
    std::vector<Micro> micros = split_micro_batches(batch, micro_batches, mesh.extent(Axis::Data),
                                                    mesh.coord(Axis::Data), 5, step, true, &timers);
    const LossWeights w{1.0 / 50, 0.01, 0.001};
    pipeline.train(micros, w, [&](const ForwardStats& f) {
      out.ce += f.ce_sum;
      out.aux += f.aux_sum;
      out.z += f.z_sum;
    });
    out.parked_peak = std::max(out.parked_peak, pipeline.parked_peak());
  }
  const auto& P = model.params();
  out.grads.assign(P.grads(), P.grads() + P.size());
  for (const ParamInfo& p : P.infos()) {
    out.names.push_back(p.name);
    out.offsets.push_back(p.flat_offset);
    out.sizes.push_back(p.size);
  }
  const auto it = timers.totals().find("pipeline_recompute");
  out.recompute_s = it == timers.totals().end() ? 0 : it->second;
  return out;
}

const float* find_grad(const StageRun& r, const std::string& name) {
  for (size_t i = 0; i < r.names.size(); ++i)
    if (r.names[i] == name) return r.grads.data() + r.offsets[i];
  return nullptr;
}

// On each group of `pipe * data` consecutive world ranks: recompute none against block on the
// same mesh, and (data = 1) against the whole model on one rank.
void check_pipeline(const Config& cfg, int pipe, int data, int micro_batches) {
  const int world = test::world_size(), rank = test::world_rank(), group = pipe * data;
  if (world % group != 0) return;
  MPI_Comm comm;
  MPI_Comm_split(MPI_COMM_WORLD, rank / group, rank, &comm);
  {
    Mesh mesh(comm, pipe, data, 1);
    const int stage = mesh.coord(Axis::Pipe);
    INFO("pipe " << pipe << " data " << data << " stage " << stage << ", " << micro_batches << " micro-batches");
    const StageRun none = run_pipeline(cfg, mesh, Recompute::None, micro_batches, 2);
    const StageRun block = run_pipeline(cfg, mesh, Recompute::Block, micro_batches, 2);
    CHECK(none.recompute_s == 0);
    CHECK(none.parked_peak == pipe - stage - 1);
    CHECK(block.parked_peak == 0);
    if (stage < pipe - 1) CHECK(block.recompute_s > 0);
    REQUIRE(none.grads.size() == block.grads.size());
    CHECK(bitwise_equal(none.grads.data(), block.grads.data(), none.grads.size()));
    CHECK(none.ce == block.ce);
    CHECK(none.aux == block.aux);
    CHECK(none.z == block.z);
    if (data == 1) {
      Mesh one(MPI_COMM_SELF, 1, 1, 1);
      const StageRun ref = run_pipeline(cfg, one, Recompute::None, micro_batches, 2);
      for (size_t i = 0; i < none.names.size(); ++i) {
        INFO(none.names[i]);
        const float* g = find_grad(ref, none.names[i]);
        REQUIRE(g);
        CHECK(bitwise_equal(none.grads.data() + none.offsets[i], g, none.sizes[i]));
      }
      double sums[3] = {none.ce, none.aux, none.z};
      MPI_Allreduce(MPI_IN_PLACE, sums, 3, MPI_DOUBLE, MPI_SUM, comm);
      CHECK(sums[0] == Approx(ref.ce).epsilon(1e-12));
      CHECK(sums[1] == Approx(ref.aux).epsilon(1e-12));
      CHECK(sums[2] == Approx(ref.z).epsilon(1e-12));
    }
  }
  MPI_Comm_free(&comm);
}

}  // namespace

TEST_CASE("pipeline: recompute none equals block and one rank, bitwise, on pipe 2 and 4", "[pipeline][mpi]") {
  for (bool moe : {true, false}) {
    INFO((moe ? "MoE" : "dense"));
    const Config c = stash_config(moe, 4);
    check_pipeline(c, 2, 1, 4);
    check_pipeline(c, 4, 1, 4);
    check_pipeline(c, 4, 1, 8);
  }
  Config c = stash_config(true, 4);
  c.moe.expert_axis = ExpertAxis::Data;
  check_pipeline(c, 2, 2, 2);
  c.moe.dropless = true;
  check_pipeline(c, 2, 2, 2);
}
