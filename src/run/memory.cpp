#include "run/memory.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>

#include "core/error.hpp"
#include "core/sizes.hpp"
#include "data/dataset.hpp"
#include "model/activation.hpp"
#include "model/moe/moe_options.hpp"
#include "model/shape_table.hpp"
#include "model/transformer.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "parallel/state_shards.hpp"
#include "run/decode_bytes.hpp"
#include "run/memory_limit.hpp"
#include "tensor/host_threads.hpp"

namespace meshmoe {

namespace {

constexpr size_t kF = sizeof(float);  // host training is fp32 (activations, weights, state)

// Ring all-reduce: each rank sends 2 (n-1)/n of the buffer; all-to-all: (n-1)/n of it.
double ring_allreduce(double bytes, int n) { return n > 1 ? 2.0 * (n - 1) / n * bytes : 0.0; }
double all_to_all(double bytes, int n) { return n > 1 ? double(n - 1) / n * bytes : 0.0; }

// A byte count of the plan as the size_t of MemoryPlan (Checked values are never negative here).
size_t bytes(Checked c) { return size_t(c.value()); }

void need(bool ok, const std::string& msg) {
  if (!ok) throw InputError(msg);
}

// Adafactor's state of one parameter of local shape s (adafactor.cpp): >= 2 dims are factored into
// batch x (rows + cols), the last two dims being rows and columns; a vector keeps one per element.
Checked adafactor_state_elems(const std::vector<Checked>& s) {
  Checked size = 1;
  for (const Checked d : s) size *= d;
  if (s.size() < 2) return size;
  const Checked rows = s[s.size() - 2], cols = s[s.size() - 1];
  const Checked batch = rows * cols == 0 ? Checked(0) : size / (rows * cols);
  return batch * (rows + cols);
}

// Optimizer state elements of data rank `data_rank` of D with optim.shard_state: the entries it owns
// (parallel/state_shards.hpp: whole data-replicated entries by size, and every entry split over data).
Checked owned_state_elems(const Config& cfg, const std::vector<std::vector<Checked>>& shapes,
                          const std::vector<bool>& over_data, int D, int data_rank) {
  std::vector<size_t> sizes;
  std::vector<Checked> state;
  for (const auto& s : shapes) {
    Checked n = 1;
    for (const Checked d : s) n *= d;
    sizes.push_back(size_t(n.value()));
    state.push_back(cfg.optim.name == OptimizerKind::Adafactor ? adafactor_state_elems(s) : 2 * n);
  }
  std::vector<size_t> replicated_sizes;
  for (size_t i = 0; i < shapes.size(); ++i)
    if (!over_data[i]) replicated_sizes.push_back(sizes[i]);
  const std::vector<int> part = partition_whole_entries(replicated_sizes, D);
  Checked owned = 0;
  for (size_t i = 0, r = 0; i < shapes.size(); ++i)
    if (over_data[i] || part[r++] == data_rank) owned += state[i];
  return owned;
}

// A plan whose Checked arithmetic overflowed: the deck's sizes named.
[[noreturn]] void throw_too_large(const Config& cfg, int vocab) {
  const auto& m = cfg.model;
  throw InputError("the model is too large: its memory plan overflows 64-bit byte counts (vocabulary " +
                   std::to_string(vocab) + ", model.d_model = " + std::to_string(m.d_model) +
                   ", model.d_ff = " + std::to_string(m.d_ff) + ", model.num_layers = " + std::to_string(m.num_layers) +
                   ", model.seq_len = " + std::to_string(m.seq_len) + ", moe.num_experts = " +
                   std::to_string(cfg.moe.num_experts) + ", moe.expert_d_ff = " + std::to_string(cfg.moe.expert_d_ff) +
                   ", optim.batch_size = " + std::to_string(cfg.optim.batch_size) + "); make it smaller");
}

ModelCounts model_counts_checked(const Config& cfg, const ShapeTable& table) {
  // Whole-model counts: the table of a one-rank mesh (the tied embedding once); a token visits k
  // of each MoE layer's E experts (expert choice: E C / S on average, rounded up).
  const ShapeLetters& sl = table.letters();
  const int vocab = sl.V;
  Config one_rank = cfg;
  one_rank.mesh.expert_parallel = 0;  // a placement key: no expert groups on one rank
  const ShapeTable whole_model(one_rank, vocab, MeshShape{1, 1, 1}, RankCoords{});
  const int visits = sl.moe && sl.moe_opt.expert_choice() ? (sl.experts.E * sl.C + sl.S - 1) / sl.S : sl.k;
  Checked params_total = 0, experts_skipped = 0;
  for (const LayerShapes& l : whole_model.layers())
    for (const ParamInfo& e : l.params) {
      params_total += Checked(e.size);
      if (l.kind == LayerKind::Experts)
        experts_skipped += Checked(e.size) / sl.experts.E * std::max(sl.experts.E - visits, 0);
    }
  ModelCounts c;
  c.params_total = params_total.value();
  c.params_activated = (params_total - experts_skipped).value();
  c.flops_per_token = train_flops_per_token(cfg, model_shape(cfg, vocab));
  return c;
}

MemoryPlan plan_memory_checked(const Config& cfg, const ShapeTable& table, const ModelCounts& whole) {
  // Mesh extents are spelled out (docs/ARCHITECTURE.md "Legend of dimension letters").
  const MeshShape& mesh = table.mesh();
  const int pipe = mesh.pipe, data = mesh.data, tensor = mesh.tensor;
  const int pipe_rank = table.coords().pipe, data_rank = table.coords().data, tensor_rank = table.coords().tensor;
  // The rank's letters, parameters and buffers (model/shape_table.hpp).
  const ShapeLetters& sl = table.letters();
  if (sl.N == 0) throw std::logic_error("plan_memory: a shape table without the micro-batch's buffers");
  const Checked V = sl.V, M = sl.M, N = sl.N, MB = cfg.optim.micro_batches;
  const Checked NM = N * M;

  MemoryPlan p;
  p.pipe_rank = pipe_rank, p.data_rank = data_rank, p.tensor_rank = tensor_rank;
  p.num_blocks = sl.num_blocks;
  p.first_block = sl.first_block;
  p.first_stage = sl.first_stage;
  p.last_stage = sl.last_stage;
  p.rows = sl.B;
  p.seq_len = sl.T;

  // ---- parameters: the shape table's entries ------------------------------------------------------
  Checked elems = 0, adafactor = 0;
  Checked expert_local = 0;  // elements of those split over data (expert weights)
  Checked expert_replicated = 0;  // of them, those with replicas (summed over their replica group)
  for (const ParamInfo& e : table.params()) {
    elems += Checked(e.size);
    adafactor += adafactor_state_elems(std::vector<Checked>(e.local_shape.begin(), e.local_shape.end()));
    if (e.sharded_over & kShardData) expert_local += Checked(e.size);
    if (e.sharded_over & kShardReplicas) expert_replicated += Checked(e.size);
  }
  p.params_rank = elems.value();
  p.param_bytes = p.grad_bytes = bytes(elems * kF);
  if (plans_bf16_copies(cfg)) p.param_bytes = bytes(elems * (kF + sizeof(uint16_t)));  // ParamStore::weights16
  p.optim_bytes = bytes((cfg.optim.name == OptimizerKind::Adafactor ? adafactor : 2 * elems) * kF);
  if (cfg.optim.shard_state && data > 1) {
    std::vector<std::vector<Checked>> shapes;  // this rank's ParamStore entries, and which are split over data
    std::vector<bool> over_data;
    for (const ParamInfo& e : table.params()) {
      shapes.emplace_back(e.local_shape.begin(), e.local_shape.end());
      over_data.push_back(e.sharded_over & kShardData);
    }
    p.optim_bytes = bytes(owned_state_elems(cfg, shapes, over_data, data, data_rank) * kF);
  }
  p.params_total = whole.params_total;
  p.params_activated = whole.params_activated;
  p.flops_per_token = whole.flops_per_token;

  // ---- activations: the shape table's buffers of one micro-batch -------------------------------------
  // Saved and forward-only buffers are what the first forward allocates, scratch the backward's;
  // what no backward reads (forward-only: the stage buffers, router logits, the all-to-all receive
  // buffer, the per-token losses) is not parked with recompute = none.
  const std::pair<const char*, std::vector<LayerKind>> part_kinds[] = {
      {"stage buffers", {LayerKind::Stage}},
      {"embedding", {LayerKind::Embedding}},
      {"layernorms", {LayerKind::LayerNorm}},
      {"attention", {LayerKind::Attention, LayerKind::CrossAttention}},
      {"dense ffn", {LayerKind::DenseFfn}},
      {"moe", {LayerKind::Router, LayerKind::Dispatcher, LayerKind::Experts, LayerKind::SharedExperts}},
      {"head + loss", {LayerKind::Head}}};
  Checked activations = 0, unparked = 0, w = 0;
  int moe_here = 0, dense_here = 0;
  for (const auto& [part, kinds] : part_kinds) {
    Checked a = 0;
    for (const LayerShapes& l : table.layers()) {
      if (std::find(kinds.begin(), kinds.end(), l.kind) == kinds.end()) continue;
      for (const BufferShape& buf : l.buffers) {
        if (buf.kind == BufferKind::Scratch) w += buf.bytes();
        else a += buf.bytes();
        if (buf.kind == BufferKind::ForwardOnly) unparked += buf.bytes();
      }
    }
    p.activation_parts.emplace_back(part, bytes(a));
    activations += a;
  }
  for (const LayerShapes& l : table.layers()) moe_here += l.kind == LayerKind::Router, dense_here += l.kind == LayerKind::DenseFfn;
  p.activation_bytes = bytes(activations);
  p.workspace_bytes = bytes(w);

  // ---- pipeline: the 1F1B schedule of this stage (PipelineExecutor::train) -----------------------
  const bool park = cfg.model.recompute == Recompute::None;
  int live = 0, forwards = 0, last_forward = -1;
  for (const PipelineOp& op : one_f_one_b(pipe_rank, pipe, int(MB.value()))) {
    if (op.forward) {
      ++forwards, last_forward = op.micro;
      p.in_flight = std::max(p.in_flight, ++live);
    } else {
      if (!park && last_forward != op.micro) ++forwards, last_forward = op.micro;  // recompute before backward
      --live;
    }
  }
  if (pipe > 1) {
    // a later stage holds the inputs of its in-flight micro-batches and the input gradients it
    // sends back; an earlier one the outputs it sends and the gradient it receives (isend buffers
    // live until the end of the step)
    Checked pipe_bytes = 0;
    // (encdec: each message holds the encoder's and the decoder's streams, Transformer::stage_streams)
    const Checked message = NM * (sl.encoder_layers > 0 ? 2 : 1);
    if (!p.first_stage) pipe_bytes += ((park ? 1 : p.in_flight) + MB) * message * kF;
    if (!p.last_stage) pipe_bytes += (MB + 1) * message * kF;
    p.pipeline_bytes = bytes(pipe_bytes);
    // recompute = none: the layers hold one in-flight micro-batch, the stashes the others
    if (park) p.stash_bytes = bytes((p.in_flight - 1) * (Checked(p.activation_bytes) - unparked));
  }

  // ---- bytes sent per step ----------------------------------------------------------------------
  const double act_bytes = double(NM) * kF;
  const bool any_moe = sl.moe, expert_on_data = sl.experts_over_data;
  const Checked E = sl.experts.E, E_l = sl.experts.E_l, G = sl.G, C = sl.C;
  const double fw = forwards, bw = double(MB);
  // data: gradient all-reduce of the data-replicated parameters (and of the experts' over their
  // replica groups); all-to-all dispatch and combine of every MoE layer in each forward and (their
  // transposes) in each backward, within the expert group of expert_parallel ranks
  const int ep = sl.expert_parallel;
  p.sent_data_allreduce = ring_allreduce(double(elems - expert_local) * kF, data);
  p.sent_data_replicas = ring_allreduce(double(expert_replicated) * kF, data / ep);
  if (expert_on_data && any_moe)
    p.sent_data_all_to_all = moe_here * (2 * fw + 2 * bw) * all_to_all(double(E * G * C * M) * kF, ep);
  p.sent_data = p.sent_data_allreduce + p.sent_data_replicas + p.sent_data_all_to_all;
  // tensor: Megatron all-reduce of the output (forward) and of the input gradient (backward) of
  // each attention and dense feed-forward; experts over data with their hidden units split: the
  // same pair on the expert rows; experts over tensor: the combine and its gradient
  double t_bytes = (fw + bw) * (p.num_blocks + dense_here) * act_bytes;
  if (any_moe)
    t_bytes += expert_on_data ? (fw + bw) * moe_here * double(E_l * ep * G * C * M) * kF : (fw + bw) * moe_here * act_bytes;
  // the shared experts' own pair with experts over data (over tensor they join the combine's)
  if (any_moe && expert_on_data && sl.moe_opt.shared_experts > 0) t_bytes += (fw + bw) * moe_here * act_bytes;
  p.sent_tensor = ring_allreduce(t_bytes, tensor);
  // pipe: activations forward, their gradients backward, once per micro-batch; the tied embedding's
  // gradient between the first and the last stage
  if (pipe > 1) {
    const double streams = sl.encoder_layers > 0 ? 2 : 1;
    if (!p.last_stage) p.sent_pipe_next = double(MB) * streams * act_bytes;
    if (!p.first_stage) p.sent_pipe_prev = double(MB) * streams * act_bytes;
    if (cfg.model.tied_embeddings && (p.first_stage || p.last_stage)) p.sent_pipe_tied = double(V * M) * kF;
    p.sent_pipe = p.sent_pipe_next + p.sent_pipe_prev + p.sent_pipe_tied;
  }
  // total_bytes() sums these: the sum must fit too
  (void)(Checked(p.param_bytes) + Checked(p.grad_bytes) + Checked(p.optim_bytes) + Checked(p.activation_bytes) +
         Checked(p.workspace_bytes) + Checked(p.pipeline_bytes) + Checked(p.stash_bytes));
  return p;
}

}  // namespace

ModelCounts model_counts(const Config& cfg, const ShapeTable& table) {
  try {
    return model_counts_checked(cfg, table);
  } catch (const SizeOverflow&) {
    throw_too_large(cfg, table.letters().V);
  }
}

MemoryPlan plan_memory(const Config& cfg, const ShapeTable& table, const ModelCounts& whole) {
  try {
    return plan_memory_checked(cfg, table, whole);
  } catch (const SizeOverflow&) {
    throw_too_large(cfg, table.letters().V);
  }
}

MemoryPlan plan_memory(const Config& cfg, int vocab, const MeshShape& mesh, int pipe_rank, int data_rank,
                       int tensor_rank) {
  need(vocab >= 1, "memory plan: the vocabulary size is unknown (set model.vocab_size or prepare data.path)");
  need(pipe_rank >= 0 && pipe_rank < mesh.pipe && data_rank >= 0 && data_rank < mesh.data && tensor_rank >= 0 &&
           tensor_rank < mesh.tensor,
       "memory plan: rank coordinates outside the mesh " + mesh.str());
  const ShapeTable table(cfg, vocab, mesh, RankCoords{pipe_rank, data_rank, tensor_rank}, true);
  const ModelCounts whole = model_counts(cfg, table);
  return plan_memory(cfg, table, whole);
}

namespace {
// The runtime of one rank (MPI, OpenBLAS, HDF5, the executable and its heap), measured with the
// trainer's peak-Pss line (Trainer::run) on the build machine (Debian 12's Open MPI, OpenBLAS and
// HDF5): `meshmoe train` of a model of 6.6K parameters on a 500 KB data set (2 steps, one BLAS
// thread; the "runtime-1" run of tests/scripts/memory_measured.sh, which runs alone) peaked at
// 30.6-30.9 MiB of Pss on one rank under every OpenBLAS kernel (Cooperlake, SkylakeX, Haswell, Zen,
// Sandybridge, Prescott), 18-20 MiB per rank on 2 ranks and 14-16.5 MiB on 4: about 12 MiB private
// and 18 MiB of shared pages (the libraries, Open MPI's shared-memory segments) that Pss divides
// among the processes that map them, on the node's ranks and any other process of the same
// libraries (a run beside another one measured 28.5 MiB). The baseline is the one-rank figure of a
// process alone on its node, rounded up to whole MiB with a margin for the executable's growth: on a
// node of n ranks the plan counts up to 18 (n - 1) / n MiB per rank more than they use.
constexpr size_t kRuntimeBaseline = size_t(32) << 20;
// Each BLAS thread beyond the first (run.threads, OPENBLAS_NUM_THREADS): its GEMM packing buffers and
// stack. run.threads = 2 raised the peak Pss of inputs/m4-switch-tiny.toml on one rank by 9.5 MiB
// (4 threads, of which the 2-core machine ran 2 at once: by 9.9 MiB).
constexpr size_t kBlasThreadBuffer = size_t(10) << 20;
}  // namespace

size_t runtime_memory_bytes(int blas_threads) {
  return kRuntimeBaseline + size_t(std::max(blas_threads, 1) - 1) * kBlasThreadBuffer;
}

void add_process_memory(const Config& cfg, int vocab, size_t dataset_bytes, MemoryPlan& plan) {
  if (cfg.run.device != Device::Cpu) return;  // the plan counts the GPU's memory, these are the host's
  plan.dataset_bytes = dataset_bytes;
  plan.runtime_bytes = runtime_memory_bytes(requested_run_threads(cfg.run.threads));
  plan.decoder_bytes = cfg.eval.bleu_every > 0 ? size_t(decode_memory_bytes(cfg, vocab, bleu_eval_shape(cfg))) : 0;
}

double pss_bytes() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string line;  // the first line names the address range, then "Pss:   1234 kB"
  while (std::getline(f, line))
    if (line.rfind("Pss:", 0) == 0) return std::strtod(line.c_str() + 4, nullptr) * 1024.0;
  return 0;
}

namespace {
// v in the largest of the 5 units (steps of `step`) that keeps it >= 1: "%.0f" in the first unit,
// "%.2f" after, then `sep` and the unit's name.
std::string format_scaled(double v, double step, const char* const (&units)[5], const char* sep) {
  int u = 0;
  while (std::fabs(v) >= step && u < 4) v /= step, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s%s" : "%.2f%s%s", v, sep, units[u]);
  return buf;
}
}  // namespace

std::string format_bytes(double b) {
  static const char* const units[5] = {"B", "KiB", "MiB", "GiB", "TiB"};
  return format_scaled(b, 1024.0, units, " ");
}

std::string format_count(double n) {
  static const char* const units[5] = {"", "K", "M", "B", "T"};
  return format_scaled(n, 1000.0, units, "");
}

std::string expert_layout(const Config& cfg, const MeshShape& mesh, size_t max_groups) {
  if (cfg.moe.every <= 0 || cfg.moe.expert_axis != ExpertAxis::Data) return "";
  const int64_t E = cfg.moe.num_experts, P = expert_parallel(cfg, mesh.data), copies = mesh.data / P;
  std::ostringstream o;
  o << "experts: moe.num_experts = " << E << " in expert groups of mesh.expert_parallel = " << P << " data rank"
    << (P > 1 ? "s" : "") << " (" << E / P << " per rank)";
  if (copies > 1) o << ", each expert on " << copies << " replicas (mesh.data / mesh.expert_parallel)";
  else o << ", each expert once";
  o << "\n";
  auto list = [&](const char* label, const std::vector<std::vector<int>>& groups) {
    o << "  " << label << ":";
    for (size_t i = 0; i < groups.size() && i < max_groups; ++i) {
      o << " [" << format_ranks(groups[i]) << "]";
    }
    if (groups.size() > max_groups) o << " ... (" << groups.size() << " groups)";
    o << "\n";
  };
  list("expert groups (world ranks; MoE all-to-all)", mesh.expert_groups(int(P)));
  if (copies > 1) list("replica groups (world ranks; expert gradient all-reduce)", mesh.replica_groups(int(P)));
  return o.str();
}

std::string memory_report(const Config& cfg, const MeshShape& mesh, const std::vector<std::vector<MemoryPlan>>& stages,
                          double node_bytes_per_rank) {
  // Every data and tensor rank of a stage holds equal shards: one column per pipeline stage. With
  // optim.shard_state the data ranks' optimizer state differs: the column is the largest, and a
  // line below lists them all.
  std::vector<MemoryPlan> plans;
  std::vector<std::vector<size_t>> state_per_data_rank(size_t(mesh.pipe));
  const bool sharded = cfg.optim.shard_state && mesh.data > 1;
  for (int s = 0; s < mesh.pipe; ++s) {
    plans.push_back(stages[size_t(s)][0]);
    for (int d = 0; sharded && d < mesh.data; ++d) {
      const MemoryPlan& p = stages[size_t(s)][size_t(d)];
      state_per_data_rank[size_t(s)].push_back(p.optim_bytes);
      if (p.optim_bytes > plans.back().optim_bytes) plans.back() = p;
    }
  }
  const MemoryPlan& p0 = plans[0];
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "model: %lld parameters, %lld activated per token, %.4g training FLOPs per token\n",
                (long long)p0.params_total, (long long)p0.params_activated, p0.flops_per_token);
  o << line;
  // The figures model cards publish: active = every parameter but the routed experts a token skips
  // (docs/user-guide.md "Presets and their published sizes").
  o << "parameters: " << format_count(double(p0.params_total)) << " total, "
    << format_count(double(p0.params_activated)) << " active per token\n";
  o << expert_layout(cfg, mesh);
  std::snprintf(line, sizeof line, "memory per rank (fp32; one micro-batch = %d x %d tokens; bytes):\n", p0.rows, p0.seq_len);
  o << line;
  const int per_stage = mesh.data * mesh.tensor;
  auto row = [&](const std::string& label, auto value) {
    std::snprintf(line, sizeof line, "  %-26s", label.c_str());
    o << line;
    for (const MemoryPlan& p : plans) {
      std::snprintf(line, sizeof line, "  %16s", value(p).c_str());
      o << line;
    }
    o << "\n";
  };
  auto num = [](auto v) { return std::to_string(v); };
  row("", [&](const MemoryPlan& p) { return "stage " + num(p.pipe_rank); });
  row("ranks", [&](const MemoryPlan& p) {
    const int a = p.pipe_rank * per_stage, b = a + per_stage - 1;
    return a == b ? num(a) : num(a) + "-" + num(b);
  });
  row("blocks", [&](const MemoryPlan& p) {
    return p.num_blocks == 1 ? num(p.first_block) : num(p.first_block) + "-" + num(p.first_block + p.num_blocks - 1);
  });
  row("parameters (count)", [&](const MemoryPlan& p) { return num(p.params_rank); });
  row("parameters", [&](const MemoryPlan& p) { return num(p.param_bytes); });
  row("gradients", [&](const MemoryPlan& p) { return num(p.grad_bytes); });
  row("optimizer state (" + std::string(option_name(cfg.optim.name)) + ")", [&](const MemoryPlan& p) { return num(p.optim_bytes); });
  row("activations", [&](const MemoryPlan& p) { return num(p.activation_bytes); });
  for (size_t i = 0; i < p0.activation_parts.size(); ++i)
    row("  " + p0.activation_parts[i].first, [&](const MemoryPlan& p) { return num(p.activation_parts[i].second); });
  row("backward workspace", [&](const MemoryPlan& p) { return num(p.workspace_bytes); });
  row("micro-batches in flight", [&](const MemoryPlan& p) { return num(p.in_flight); });
  row("pipeline buffers", [&](const MemoryPlan& p) { return num(p.pipeline_bytes); });
  row("parked activations", [&](const MemoryPlan& p) { return num(p.stash_bytes); });
  if (cfg.run.device == Device::Cpu) {  // add_process_memory
    row("model total", [&](const MemoryPlan& p) { return num(p.model_bytes()); });
    row("dataset in memory", [&](const MemoryPlan& p) { return num(p.dataset_bytes); });
    row("runtime (MPI, BLAS, HDF5)", [&](const MemoryPlan& p) { return num(p.runtime_bytes); });
    if (cfg.eval.bleu_every > 0) row("decoder caches (BLEU)", [&](const MemoryPlan& p) { return num(p.decoder_bytes); });
  }
  row("total", [&](const MemoryPlan& p) { return num(p.total_bytes()); });
  row("total", [&](const MemoryPlan& p) { return format_bytes(double(p.total_bytes())); });
  o << "bytes sent per rank per step (ring all-reduce 2(n-1)/n, all-to-all (n-1)/n):\n";
  row("data", [&](const MemoryPlan& p) { return num((long long)std::llround(p.sent_data)); });
  row("tensor", [&](const MemoryPlan& p) { return num((long long)std::llround(p.sent_tensor)); });
  row("pipe", [&](const MemoryPlan& p) { return num((long long)std::llround(p.sent_pipe)); });
  if (cfg.moe.every > 0 && cfg.moe.expert_axis == ExpertAxis::Data)
    row("  of data: MoE all-to-all", [&](const MemoryPlan& p) { return num((long long)std::llround(p.sent_data_all_to_all)); });
  for (int s = 0; sharded && s < mesh.pipe; ++s) {
    const auto& b = state_per_data_rank[size_t(s)];
    const double mean = double(std::accumulate(b.begin(), b.end(), size_t(0))) / double(b.size());
    o << "optimizer state sharded over " << mesh.data << " data ranks (optim.shard_state; whole parameters), stage " << s
      << ", data ranks 0-" << mesh.data - 1 << ":";
    for (size_t v : b) o << " " << v;
    std::snprintf(line, sizeof line, " bytes (largest %.3fx the mean)\n",
                  mean > 0 ? double(*std::max_element(b.begin(), b.end())) / mean : 1.0);
    o << line;
  }
  // ParamStore::allocate's one copy of the weights per node (docs/ARCHITECTURE.md "Sharded
  // optimizer state"): the rows above stay per rank, and so does the memory check (an upper bound).
  if (sharded && cfg.run.shm_collectives && (cfg.moe.every <= 0 || cfg.moe.expert_axis != ExpertAxis::Data)) {
    o << "weights: one copy per node for a stage's data ranks on it (optim.shard_state, no parameter split over "
         "data, run.shm_collectives; the data axis on one node, or across nodes with the same number >= 2 of its "
         "ranks on each), not one per data rank:";
    for (const MemoryPlan& p : plans) o << " stage " << p.pipe_rank << " " << format_bytes(double(p.param_bytes));
    o << " per node\n";
  }
  if (node_bytes_per_rank > 0)
    for (const MemoryPlan& p : plans)
      if (double(p.total_bytes()) > node_bytes_per_rank)
        o << "warning: stage " << p.pipe_rank << " needs " << format_bytes(double(p.total_bytes()))
          << " per rank but this node has " << format_bytes(node_bytes_per_rank)
          << " per rank (available memory / ranks on the node): use more ranks, smaller micro-batches or a smaller model\n";
  return o.str();
}

}  // namespace meshmoe
