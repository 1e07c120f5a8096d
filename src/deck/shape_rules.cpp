#include "deck/shape_rules.hpp"

#include <numeric>

#include "core/error.hpp"

namespace meshmoe {

namespace {
std::string kv(const char* name, int64_t v) { return std::string(name) + " = " + std::to_string(v); }
}  // namespace

std::vector<ShapeRule> shape_rules(const Config& cfg, int64_t pipe, int64_t data, int64_t tensor) {
  const auto& m = cfg.model;
  const auto& e = cfg.moe;
  const auto& o = cfg.optim;
  const bool moe_layers = e.every > 0;
  std::vector<ShapeRule> r;
  r.push_back({{"model.d_model", "model.num_heads"}, m.num_heads > 0 && m.d_model % m.num_heads == 0,
               kv("model.d_model", m.d_model) + " is not divisible by " + kv("model.num_heads", m.num_heads) +
                   " (each head gets d_model / num_heads channels)"});
  r.push_back({{"model.num_heads", "mesh.tensor"}, m.num_heads % tensor == 0,
               kv("model.num_heads", m.num_heads) + " is not divisible by " + kv("mesh.tensor", tensor) +
                   " (attention heads are split over the tensor axis)"});
  // Grouped-query attention: each key/value head serves num_heads / kv_heads query heads. No rule over
  // tensor: kv heads that tensor does not divide are replicated on every tensor rank (layer_shapes.hpp).
  if (m.kv_heads > 0)
    r.push_back({{"model.kv_heads", "model.num_heads"}, m.kv_heads <= m.num_heads && m.num_heads % m.kv_heads == 0,
                 kv("model.kv_heads", m.kv_heads) + " does not divide " + kv("model.num_heads", m.num_heads) +
                     " (each key/value head serves num_heads / kv_heads query heads; 0 means num_heads)"});
  r.push_back({{"model.d_ff", "mesh.tensor"}, m.d_ff % tensor == 0,
               kv("model.d_ff", m.d_ff) + " is not divisible by " + kv("mesh.tensor", tensor) +
                   " (feed-forward hidden units are split over the tensor axis)"});
  // Switch section 5.5: with experts over data, each expert's hidden layer is split over tensor.
  // (expert_d_ff = 0 means model.d_ff, checked just above.)
  if (moe_layers && e.expert_axis == ExpertAxis::Data && tensor > 1 && e.expert_d_ff > 0)
    r.push_back({{"moe.expert_d_ff", "mesh.tensor", "moe.expert_axis", "moe.every"}, e.expert_d_ff % tensor == 0,
                 kv("moe.expert_d_ff", e.expert_d_ff) + " is not divisible by " + kv("mesh.tensor", tensor) +
                     " (with moe.expert_axis = \"data\" each expert's hidden units are split over the tensor axis)"});
  // The shared experts: one feed-forward of hidden width n x expert d_ff, split over tensor (moe_layer.hpp).
  if (moe_layers && e.shared_experts > 0 && tensor > 1) {
    const int64_t shared_H = e.shared_experts * (e.expert_d_ff > 0 ? e.expert_d_ff : m.d_ff);
    r.push_back({{"moe.shared_experts", "moe.expert_d_ff", "mesh.tensor", "moe.every"}, shared_H % tensor == 0,
                 "moe.shared_experts x expert d_ff = " + std::to_string(shared_H) + " is not divisible by " +
                     kv("mesh.tensor", tensor) + " (the shared experts' hidden units are split over the tensor axis)"});
  }
  if (moe_layers && e.expert_axis == ExpertAxis::Tensor) {
    r.push_back({{"moe.num_experts", "mesh.tensor", "moe.expert_axis", "moe.every"}, e.num_experts % tensor == 0,
                 kv("moe.num_experts", e.num_experts) + " is not divisible by " + kv("mesh.tensor", tensor) +
                     " (moe.expert_axis = \"tensor\": every rank of that axis holds the same number of experts)"});
    r.push_back({{"mesh.expert_parallel", "moe.expert_axis", "moe.every"}, cfg.mesh.expert_parallel == 0,
                 kv("mesh.expert_parallel", cfg.mesh.expert_parallel) +
                     " needs moe.expert_axis = \"data\" (experts over tensor are whole on every data rank); set it to 0"});
  }
  if (moe_layers && e.expert_axis == ExpertAxis::Data) {
    // Expert groups of P consecutive data ranks, each holding every expert (expert replicas).
    const int64_t P = expert_parallel(cfg, data);
    r.push_back({{"mesh.expert_parallel", "mesh.data", "moe.expert_axis", "moe.every"}, data % P == 0,
                 kv("mesh.expert_parallel", P) + " does not divide " + kv("mesh.data", data) +
                     " (the data axis splits into expert groups of mesh.expert_parallel ranks)"});
    r.push_back({{"moe.num_experts", "mesh.expert_parallel", "mesh.data", "moe.expert_axis", "moe.every"},
                 e.num_experts % P == 0,
                 kv("moe.num_experts", e.num_experts) + " is not divisible by " + kv("mesh.expert_parallel", P) +
                     " (every rank of an expert group holds the same number of experts; 0 picks the largest that divides "
                     "both moe.num_experts and mesh.data)"});
  }
  if (m.arch == ModelArch::EncDec)  // the pipeline stages split the 2 L blocks of both stacks
    r.push_back({{"model.num_layers", "model.arch", "mesh.pipe"}, 2 * m.num_layers % pipe == 0,
                 "2 x " + kv("model.num_layers", m.num_layers) + " (model.arch = \"encdec\": encoder and decoder blocks) is not divisible by " +
                     kv("mesh.pipe", pipe) + " (every pipeline stage holds the same number of blocks)"});
  else
    r.push_back({{"model.num_layers", "mesh.pipe"}, m.num_layers % pipe == 0,
                 kv("model.num_layers", m.num_layers) + " is not divisible by " + kv("mesh.pipe", pipe) +
                     " (every pipeline stage holds the same number of layers)"});
  const int64_t shards = data * o.micro_batches;
  const bool batch_ok = o.batch_size % shards == 0;
  r.push_back({{"optim.batch_size", "mesh.data", "optim.micro_batches"}, batch_ok,
               kv("optim.batch_size", o.batch_size) + " is not divisible by mesh.data * optim.micro_batches = " +
                   std::to_string(data) + " * " + std::to_string(o.micro_batches) + " = " + std::to_string(shards),
               true});
  if (moe_layers && batch_ok) {
    const int64_t seqs = o.batch_size / shards, tokens = seqs * m.seq_len;
    r.push_back({{"moe.group_size", "model.seq_len", "optim.batch_size", "mesh.data", "optim.micro_batches", "moe.every"},
                 tokens % e.group_size == 0,
                 "tokens per micro-batch on each data rank, optim.batch_size / (mesh.data * optim.micro_batches) * "
                 "model.seq_len = " +
                     std::to_string(seqs) + " * " + std::to_string(m.seq_len) + " = " + std::to_string(tokens) +
                     ", is not divisible by " + kv("moe.group_size", e.group_size) +
                     " (each rank holds whole routing groups)",
                 true});
  }
  return r;
}

int64_t expert_parallel(const Config& cfg, int64_t data) {
  if (cfg.moe.every <= 0 || cfg.moe.expert_axis != ExpertAxis::Data) return 1;
  if (cfg.mesh.expert_parallel > 0) return cfg.mesh.expert_parallel;
  return std::gcd(cfg.moe.num_experts, data);
}

int64_t kv_heads_of(const Config& cfg) { return cfg.model.kv_heads > 0 ? cfg.model.kv_heads : cfg.model.num_heads; }

void require_rules(const std::vector<ShapeRule>& rules, bool with_batch) {
  for (const ShapeRule& r : rules)
    if (!r.ok && (with_batch || !r.batch)) throw InputError(r.message);
}

}  // namespace meshmoe
