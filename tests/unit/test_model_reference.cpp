// The whole model against an independent PyTorch reference (tests/reference/model_reference.py;
// driver tests/scripts/model_vs_torch.sh). This hidden case ("[model-torch]") only RUNS the C++ side
// and writes, per configuration, $MESHMOE_TEST_TMPDIR/model_ref_<case>.h5:
//   /config (attrs)          every deck value the reference needs, resolved (expert d_ff, capacity)
//   /params/<name>           every parameter at init, logical shape (attr no_weight_decay)
//   /batch/{inputs,targets,mask,segment} [B, T] of the single forward/backward (segment: packed
//                            examples; the reference derives the positions itself), /ctx attrs seed, step, token_offset
//                            (encdec also /batch/{enc_inputs,enc_segment} [B, T], the encoder side)
//   /out/logits [N, V], /out attrs ce_sum, mask_sum, aux_sum, z_sum, w_ce, w_aux, w_z, loss
//   /grads/<name>            d loss / d param of that forward/backward
//   /routing/block<i>/{expert,slot} [N*k]   the router's decisions (the reference recomputes its own)
//   /train/batches/{inputs,targets,mask,segment} [steps, B, T] (encdec also enc_inputs, enc_segment)
//   /train/<adamw|adafactor>/{loss,grad_norm,lr} [steps]   total loss before each update, as the trainer
//   /train/<adamw|adafactor>/params_<t>/<name>   bf16 cases: the weights step t starts from
//   /train/<adamw|adafactor>/logits_<t> [N, V], grads_<t>/<name>   bf16 cases: that step's logits and
//                            gradients (before clipping), so that the reference compares every step
//                            as it compares the single forward/backward
// The comparison (tolerances stated there) is done by the Python script, which exits non-zero on
// any mismatch. The checks here only make sure each configuration exercises what it is meant to
// (capacity drops, declined second choices, NTLB reroutes, dropout), so the reference cannot pass
// on a configuration that silently tests less.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "../test_util.hpp"
#include "../support/optim_support.hpp"
#include "io/h5.hpp"
#include "deck/shape_rules.hpp"
#include "model/moe/router_equations.hpp"
#include "model/transformer.hpp"
#include "tensor/blas.hpp"
#include "optim/grad_clip.hpp"
#include "optim/optimizer.hpp"
#include "optim/schedule.hpp"

using namespace meshmoe;

namespace {

constexpr int kB = 4, kT = 8, kV = 30, kSteps = 10;

struct RefCase {
  std::string name;
  Config cfg;
  // What the configuration must exercise in its single forward (checked, see the file comment).
  bool expect_drops = false, expect_declined = false, expect_rerouted = false;
  // Expert choice: some token taken by no expert and some by several.
  bool expect_uneven_tokens = false;
};

Config base_config(uint64_t seed) {
  Config c;
  c.run.seed = int64_t(seed);
  c.run.steps = kSteps;
  c.model.seq_len = kT;
  c.model.d_model = 16;
  c.model.num_layers = 2;
  c.model.num_heads = 2;
  c.model.d_ff = 32;
  c.model.activation = Activation::Relu;
  c.model.tied_embeddings = true;
  c.model.init_scale = 1.0;
  c.model.dropout = 0.0;
  c.moe.every = 0;
  c.moe.num_experts = 4;
  c.moe.group_size = 8;
  c.moe.capacity_factor_train = 1.0;
  c.moe.aux_loss_coef = 1e-2;
  c.moe.z_loss_coef = 0.0;
  c.optim.batch_size = kB;
  c.optim.grad_clip = 2.5;  // global grad norms are ~1.5-4: some steps clipped, some not
  c.optim.warmup_steps = 3;
  c.optim.weight_decay = 0.1;
  return c;
}

std::vector<RefCase> ref_cases() {
  std::vector<RefCase> v;
  // Seeds above 2^32 so the high word of the Philox key matters.
  {
    RefCase r{"dense_relu", base_config(5000000001ull)};
    v.push_back(r);
  }
  {
    // Switch: top-1, capacity factor 1.0 (C = 2 of 8 tokens per expert), jitter, dropout, expert
    // dropout, z-loss; every block MoE.
    RefCase r{"switch_top1", base_config(5000000002ull)};
    Config& c = r.cfg;
    c.moe.every = 1;
    c.moe.router = RouterKind::Top1;
    c.moe.jitter_eps = 0.01;
    c.model.dropout = 0.1;
    c.moe.expert_dropout = 0.2;
    c.moe.z_loss_coef = 1e-2;
    r.expect_drops = true;
    v.push_back(r);
  }
  {
    // GShard: top-2 with random routing of the second expert, gelu, expert width != d_ff, 4 layers.
    RefCase r{"gshard_top2", base_config(5000000003ull)};
    Config& c = r.cfg;
    c.model.num_layers = 4;
    c.model.activation = Activation::Gelu;
    c.moe.every = 2;
    c.moe.router = RouterKind::Top2;
    c.moe.second_expert = SecondExpertPolicy::Random;
    c.moe.expert_d_ff = 24;
    c.moe.z_loss_coef = 1e-3;
    r.expect_declined = true;
    v.push_back(r);
  }
  {
    // geglu (dense and experts), untied head, top-k with k = 3, jitter, dropout, expert dropout.
    RefCase r{"geglu_untied", base_config(5000000005ull)};
    Config& c = r.cfg;
    c.model.num_layers = 3;
    c.model.activation = Activation::Geglu;
    c.model.tied_embeddings = false;
    c.model.dropout = 0.1;
    c.moe.every = 2;
    c.moe.router = RouterKind::TopK;
    c.moe.top_k = 3;
    c.moe.capacity_factor_train = 0.75;
    c.moe.jitter_eps = 0.02;
    c.moe.expert_dropout = 0.1;
    c.moe.z_loss_coef = 1e-2;
    c.optim.grad_clip = 3.5;
    r.expect_drops = true;
    v.push_back(r);
  }
  {
    // model.arch = encdec: 2 encoder + 2 decoder blocks, the second of each stack top-2 MoE,
    // dropout (attention, cross-attention, feed-forward), untied head.
    RefCase r{"encdec_top2", base_config(5000000006ull)};
    Config& c = r.cfg;
    c.model.arch = ModelArch::EncDec;
    c.model.dropout = 0.1;
    c.model.tied_embeddings = false;
    c.moe.every = 2;
    c.moe.router = RouterKind::Top2;
    c.moe.second_expert = SecondExpertPolicy::Random;
    c.moe.z_loss_coef = 1e-3;
    v.push_back(r);
  }
  {
    // Top-2 with No-Token-Left-Behind, threshold second expert, tight capacity (C = 2, E = 6).
    RefCase r{"top2_ntlb", base_config(5000000004ull)};
    Config& c = r.cfg;
    c.moe.every = 2;
    c.moe.num_experts = 6;
    c.moe.router = RouterKind::Top2;
    c.moe.second_expert = SecondExpertPolicy::Threshold;
    c.moe.second_expert_threshold = 0.2;
    c.moe.capacity_factor_train = 0.5;
    c.moe.no_token_left_behind = true;
    c.moe.z_loss_coef = 1e-2;
    r.expect_drops = r.expect_rerouted = true;
    v.push_back(r);
  }
  {
    // Shared experts (DeepSeekMoE eq. 3): 2 of width 24 beside top-2 routing, geglu, every block MoE.
    RefCase r{"shared_experts", base_config(5000000007ull)};
    Config& c = r.cfg;
    c.model.activation = Activation::Geglu;
    c.moe.every = 1;
    c.moe.router = RouterKind::Top2;
    c.moe.second_expert = SecondExpertPolicy::Random;
    c.moe.expert_d_ff = 24;
    c.moe.shared_experts = 2;
    r.expect_declined = true;
    v.push_back(r);
  }
  {
    // Auxiliary-loss-free balancing: top-2 with NTLB rerouting overflows, the forward with given
    // selection biases (/bias/block<i>), the training runs updating them after every step from the
    // step's loads. The trainer drops the aux loss in this mode: aux_loss_coef 0 here.
    RefCase r{"bias_ntlb", base_config(5000000008ull)};
    Config& c = r.cfg;
    c.moe.every = 2;
    c.moe.num_experts = 6;
    c.moe.router = RouterKind::Top2;
    c.moe.second_expert = SecondExpertPolicy::Always;
    c.moe.capacity_factor_train = 1.0;  // C = 3: 18 slots for 16 choices, so the loads can differ
    c.moe.no_token_left_behind = true;
    c.moe.balance = BalanceKind::Bias;
    c.moe.bias_update_rate = 0.05;
    c.moe.aux_loss_coef = 0.0;
    c.moe.z_loss_coef = 1e-3;
    r.expect_rerouted = true;  // overflows, all placed again by NTLB
    v.push_back(r);
  }
  {
    // GShard Algorithm 1 line 22 literally: declined random second choices keep their slot, tight
    // capacity so that the empty slots cost later second choices their place (the reference checks).
    RefCase r{"gshard_line22", base_config(5000000009ull)};
    Config& c = r.cfg;
    c.moe.every = 2;
    c.moe.router = RouterKind::Top2;
    c.moe.second_expert = SecondExpertPolicy::Random;
    c.moe.declined_takes_slot = true;
    c.moe.capacity_factor_train = 0.75;
    r.expect_drops = r.expect_declined = true;
    v.push_back(r);
  }
  {
    // Expert choice (Zhou et al. 2022, section 3.1): each expert takes its C = 8 * 1.25 / 4 -> 3
    // best tokens of each group of 8; jitter, dropout, expert dropout, z-loss; every block MoE.
    RefCase r{"expert_choice", base_config(5000000010ull)};
    Config& c = r.cfg;
    c.moe.every = 1;
    c.moe.router = RouterKind::ExpertChoice;
    c.moe.capacity_factor_train = 1.25;
    c.moe.jitter_eps = 0.01;
    c.model.dropout = 0.1;
    c.moe.expert_dropout = 0.1;
    c.moe.z_loss_coef = 1e-2;
    r.expect_uneven_tokens = true;
    v.push_back(r);
  }
  {
    // Expert choice in an encoder-decoder (the encoder's routing is bidirectional anyway), geglu,
    // C = 2 of 8 tokens per expert.
    RefCase r{"encdec_expert_choice", base_config(5000000011ull)};
    Config& c = r.cfg;
    c.model.arch = ModelArch::EncDec;
    c.model.activation = Activation::Geglu;
    c.moe.every = 2;
    c.moe.router = RouterKind::ExpertChoice;
    c.moe.z_loss_coef = 1e-3;
    r.expect_uneven_tokens = true;
    v.push_back(r);
  }
  {
    // Mixtral's gate (moe.gate = softmax_topk, Mixtral section 2.1) on top-1, where it differs from
    // softmax (a gate of 1: the router learns from the aux and z losses), beside a routed scale.
    RefCase r{"softmax_topk_top1", base_config(5000000012ull)};
    Config& c = r.cfg;
    c.moe.every = 2;
    c.moe.router = RouterKind::Top1;
    c.moe.gate = MoeGate::SoftmaxTopk;
    c.moe.routed_scale = 1.5;
    c.moe.capacity_factor_train = 0.75;
    c.moe.z_loss_coef = 1e-2;
    r.expect_drops = true;
    v.push_back(r);
  }
  {
    // DeepSeek-V3's gate: sigmoid scores, top-3 of 8 fine-grained experts by score + selection bias,
    // gates normalised over the 3, routed scale 2.5, one shared expert; every block MoE.
    RefCase r{"sigmoid_bias", base_config(5000000013ull)};
    Config& c = r.cfg;
    c.model.activation = Activation::Geglu;
    c.moe.every = 1;
    c.moe.num_experts = 8;
    c.moe.expert_d_ff = 8;
    c.moe.router = RouterKind::TopK;
    c.moe.top_k = 3;
    c.moe.gate = MoeGate::Sigmoid;
    c.moe.routed_scale = 2.5;
    c.moe.shared_experts = 1;
    c.moe.balance = BalanceKind::Bias;
    c.moe.bias_update_rate = 0.05;
    c.moe.aux_loss_coef = 0.0;
    c.moe.z_loss_coef = 0.0;
    c.moe.capacity_factor_train = 0.75;
    r.expect_drops = true;
    v.push_back(r);
  }
  {
    // DeepSeekMoE's layer (section 3.1): top-3 of 8 experts with their softmax probabilities as gates
    // (moe.gate = softmax_unnormalised), 2 shared experts, swapped-in expert width.
    RefCase r{"deepseekmoe_gates", base_config(5000000015ull)};
    Config& c = r.cfg;
    c.moe.every = 2;
    c.moe.num_experts = 8;
    c.moe.expert_d_ff = 8;
    c.moe.router = RouterKind::TopK;
    c.moe.top_k = 3;
    c.moe.gate = MoeGate::SoftmaxUnnormalised;
    c.moe.shared_experts = 2;
    c.moe.capacity_factor_train = 0.75;
    c.moe.z_loss_coef = 1e-3;
    r.expect_drops = true;
    v.push_back(r);
  }
  {
    // Sigmoid gates with the load-balancing loss over s / sum(s) (DeepSeek-V3 eq. 19-20), top-2.
    RefCase r{"sigmoid_aux", base_config(5000000014ull)};
    Config& c = r.cfg;
    c.moe.every = 2;
    c.moe.router = RouterKind::Top2;
    c.moe.second_expert = SecondExpertPolicy::Random;
    c.moe.gate = MoeGate::Sigmoid;
    c.moe.aux_loss_coef = 0.1;
    c.moe.z_loss_coef = 0.0;
    r.expect_declined = true;
    v.push_back(r);
  }
  // model.precision = bf16 (docs/ARCHITECTURE.md "Precision"): the model's GEMM operands rounded
  // to bf16, the router in fp32; a dense model, GShard top-2 with gelu and random routing, Switch
  // top-1 with dropout and jitter, and the encoder-decoder (cross-attention GEMMs).
  const std::vector<RefCase> fp32 = v;
  for (const std::string name : {"dense_relu", "gshard_top2", "switch_top1", "encdec_top2"}) {
    RefCase b = *std::find_if(fp32.begin(), fp32.end(), [&](const RefCase& r) { return r.name == name; });
    b.name += "_bf16";
    b.cfg.model.precision = Precision::Bf16;
    v.push_back(b);
  }
  // Appended after the others: a case's batches are seeded by its index.
  {
    // The blocks of today's MoE models (docs/ARCHITECTURE.md "Blocks"): RMSNorm, rotary positions
    // (base 100: the angles turn visibly over 8 positions), SwiGLU experts and dense feed-forward,
    // the first block dense, then top-2 in every block.
    RefCase r{"blocks_top2", base_config(5000000012ull)};
    Config& c = r.cfg;
    c.model.num_layers = 3;
    c.model.norm = NormKind::RmsNorm;
    c.model.position = PositionKind::Rope;
    c.model.rope_base = 100;
    c.model.activation = Activation::Swiglu;
    c.moe.every = 1;
    c.moe.first_dense = 1;
    c.moe.router = RouterKind::Top2;
    c.moe.second_expert = SecondExpertPolicy::Always;
    c.moe.expert_d_ff = 24;
    v.push_back(r);
  }
  {
    // The same blocks in an encoder-decoder: rope on both self-attentions, not on the cross-attention.
    RefCase r{"blocks_encdec", base_config(5000000013ull)};
    Config& c = r.cfg;
    c.model.arch = ModelArch::EncDec;
    c.model.norm = NormKind::RmsNorm;
    c.model.position = PositionKind::Rope;
    c.model.rope_base = 100;
    c.model.activation = Activation::Swiglu;
    c.moe.every = 1;
    c.moe.first_dense = 1;
    c.moe.router = RouterKind::Top2;
    c.moe.second_expert = SecondExpertPolicy::Always;
    v.push_back(r);
  }
  {
    RefCase b = v[v.size() - 2];  // blocks_top2 in bf16
    b.name += "_bf16";
    b.cfg.model.precision = Precision::Bf16;
    v.push_back(b);
  }
  {
    // Grouped-query attention (model.kv_heads, docs/ARCHITECTURE.md "Blocks"): the blocks of
    // blocks_top2 with 2 key/value heads for 4 query heads; then multi-query (1) in bf16.
    RefCase g = v[v.size() - 3];  // blocks_top2
    g.name = "gqa_top2";
    g.cfg.model.num_heads = 4;
    g.cfg.model.kv_heads = 2;
    v.push_back(g);
    g.name = "mqa_top2_bf16";
    g.cfg.model.kv_heads = 1;
    g.cfg.model.precision = Precision::Bf16;
    v.push_back(g);
  }
  return v;
}

struct HostBatch {
  std::vector<int32_t> inputs, targets;     // [B, T]
  std::vector<float> mask;                  // [B, T]
  std::vector<int32_t> segment, position;   // [B, T] packed examples, as the batcher makes them
  // encdec: the encoder side [B, T], the same examples as `segment` (each at least one token),
  // sometimes a tail in no example
  std::vector<int32_t> enc_inputs, enc_segment, enc_position;
  MicroBatch micro() const {
    MicroBatch mb{kB, kT, inputs.data(), targets.data(), mask.data(), segment.data(), position.data()};
    if (!enc_inputs.empty())
      mb.enc_len = kT, mb.enc_inputs = enc_inputs.data(), mb.enc_segment = enc_segment.data(),
      mb.enc_position = enc_position.data();
    return mb;
  }
};

// The encoder side of `b`: in each row, as many examples as the decoder row has, cut at random
// (distinct starts, the first at 0), and in every other row the last token in a tail of its own.
void add_encoder_side(HostBatch& b, uint32_t seed) {
  std::mt19937 rng(seed ^ 0xe7cu);
  for (int r = 0; r < kB; ++r) {
    const int examples = b.segment[size_t(r * kT + kT - 1)] + 1;
    std::vector<int> starts(kT - 1);
    for (int j = 0; j < kT - 1; ++j) starts[size_t(j)] = j + 1;
    std::shuffle(starts.begin(), starts.end(), rng);
    starts.resize(size_t(examples - 1));
    starts.push_back(0);
    std::sort(starts.begin(), starts.end());
    const bool tail = r % 2 == 1 && starts.back() < kT - 2;
    for (int j = 0; j < kT; ++j) {
      int32_t seg = int32_t(std::upper_bound(starts.begin(), starts.end(), j) - starts.begin()) - 1;
      if (tail && j == kT - 1) seg = examples;
      const bool first = j == 0 || seg != b.enc_segment.back();
      b.enc_inputs.push_back(int32_t(rng() % kV));
      b.enc_segment.push_back(seg);
      b.enc_position.push_back(first ? 0 : b.enc_position.back() + 1);
    }
  }
}

// Deterministic batch; about a quarter of the targets masked, masked targets set to -1 (ignored).
// Each row is cut into packed examples at random places (a new one starts with probability 1/3).
HostBatch make_batch(uint32_t seed, bool encdec) {
  std::mt19937 rng(seed);
  HostBatch b;
  for (int i = 0; i < kB * kT; ++i) {
    b.inputs.push_back(int32_t(rng() % kV));
    const bool keep = rng() % 4 != 0;
    const int32_t t = int32_t(rng() % kV);
    b.targets.push_back(keep ? t : -1);
    b.mask.push_back(keep ? 1.f : 0.f);
  }
  test::random_packing(kB, kT, seed, 3, b.segment, b.position);
  if (encdec) add_encoder_side(b, seed);
  return b;
}

// As the trainer (src/train/trainer.cpp loss_weights): sum then scale over the whole step, the
// routing losses' weights from router_equations.hpp (the reference states them itself).
LossWeights loss_weights(const Config& cfg, const HostBatch& b) {
  double mask_total = 0;
  for (float m : b.mask) mask_total += m;
  const double tokens = double(kB) * kT;
  return LossWeights{.ce = 1.0 / std::max(1.0, mask_total),
                     .aux = balance_loss_weight(cfg.moe.balance, cfg.moe.aux_loss_coef, tokens, cfg.moe.group_size),
                     .z = z_loss_weight(cfg.moe.z_loss_coef, tokens)};
}

double total_loss(const ForwardStats& f, const LossWeights& w) {
  return w.ce * f.ce_sum + w.aux * f.aux_sum + w.z * f.z_sum;
}

void write_config(h5::File& f, const Config& c, int vocab) {
  h5::Group g = f.create_group("config");
  auto i64 = [&](const char* k, int64_t v) { g.set_attr(k, v); };
  auto f64 = [&](const char* k, double v) { g.set_attr(k, v); };
  auto str = [&](const char* k, const std::string& v) { g.set_attr(k, v); };
  i64("vocab", vocab);
  i64("batch", kB);
  i64("seq_len", c.model.seq_len);
  i64("d_model", c.model.d_model);
  str("arch", std::string(option_name(c.model.arch)));
  i64("num_layers", c.model.num_layers);
  i64("num_heads", c.model.num_heads);
  i64("d_ff", c.model.d_ff);
  str("activation", std::string(option_name(c.model.activation)));
  str("precision", std::string(option_name(c.model.precision)));
  i64("tied_embeddings", c.model.tied_embeddings);
  f64("dropout", c.model.dropout);
  f64("layernorm_eps", c.model.layernorm_eps);
  i64("moe_every", c.moe.every);
  i64("moe_first_dense", c.moe.first_dense);
  str("norm", std::string(option_name(c.model.norm)));
  str("position", std::string(option_name(c.model.position)));
  f64("rope_base", c.model.rope_base);
  i64("kv_heads", kv_heads_of(c));
  i64("num_experts", c.moe.num_experts);
  str("router", std::string(option_name(c.moe.router)));
  i64("top_k", c.moe.top_k);
  i64("expert_d_ff", c.moe.expert_d_ff > 0 ? c.moe.expert_d_ff : c.model.d_ff);
  i64("group_size", c.moe.group_size);
  f64("capacity_factor_train", c.moe.capacity_factor_train);
  i64("dropless", c.moe.dropless);
  str("second_expert", std::string(option_name(c.moe.second_expert)));
  f64("second_expert_threshold", c.moe.second_expert_threshold);
  i64("no_token_left_behind", c.moe.no_token_left_behind);
  i64("declined_takes_slot", c.moe.declined_takes_slot);
  f64("jitter_eps", c.moe.jitter_eps);
  f64("expert_dropout", c.moe.expert_dropout);
  i64("shared_experts", c.moe.shared_experts);
  str("balance", std::string(option_name(c.moe.balance)));
  f64("bias_update_rate", c.moe.bias_update_rate);
  str("gate", std::string(option_name(c.moe.gate)));
  f64("routed_scale", c.moe.routed_scale);
  f64("aux_loss_coef", c.moe.aux_loss_coef);
  f64("z_loss_coef", c.moe.z_loss_coef);
  i64("seed", c.run.seed);
  i64("run_steps", c.run.steps);
  f64("lr", c.optim.lr);
  str("schedule", std::string(option_name(c.optim.schedule)));
  i64("warmup_steps", c.optim.warmup_steps);
  f64("min_lr_ratio", c.optim.min_lr_ratio);
  f64("beta1", c.optim.beta1);
  f64("beta2", c.optim.beta2);
  f64("eps", c.optim.eps);
  f64("weight_decay", c.optim.weight_decay);
  f64("grad_clip", c.optim.grad_clip);
  f64("adafactor_decay", c.optim.adafactor_decay);
  f64("adafactor_clip", c.optim.adafactor_clip);
  f64("adafactor_eps", c.optim.adafactor_eps);
}

void write_batch(h5::Location& g, const std::string& prefix, const HostBatch& b) {
  g.write(prefix + "/inputs", b.inputs, {kB, kT});
  g.write(prefix + "/targets", b.targets, {kB, kT});
  g.write(prefix + "/mask", b.mask, {kB, kT});
  g.write(prefix + "/segment", b.segment, {kB, kT});
  if (b.enc_inputs.empty()) return;
  g.write(prefix + "/enc_inputs", b.enc_inputs, {kB, kT});
  g.write(prefix + "/enc_segment", b.enc_segment, {kB, kT});
}

// Writes either the weights or the gradients of every parameter under `group`.
void write_params(h5::File& f, const std::string& group, const ParamStore<float>& P, bool grads) {
  for (const ParamInfo& p : P.infos()) {
    const float* src = (grads ? P.grads() : P.weights()) + p.flat_offset;
    h5::Dataset d = f.write(group + "/" + p.name, std::vector<float>(src, src + p.size), p.logical_shape);
    if (!grads) d.set_attr("no_weight_decay", int64_t(p.no_weight_decay));
  }
}

// The trainer's update on one rank (src/train/trainer.cpp train_step): forward + backward, global
// grad norm -> clip_scale -> scale_grads -> optimizer step t with lr = schedule(t).
void train_run(h5::File& f, const RefCase& rc, const std::string& opt_name,
               const std::vector<HostBatch>& batches) {
  Config cfg = rc.cfg;
  cfg.optim.name = test::option<OptimizerKind>(opt_name);
  if (opt_name == "adafactor") {
    cfg.optim.lr = 1e-2;  // GShard appendix A.2 style: rsqrt decay after warm-up
    cfg.optim.schedule = ScheduleKind::Rsqrt;
  } else {
    cfg.optim.lr = 3e-3;
    cfg.optim.schedule = ScheduleKind::Cosine;
  }
  const test::GemmPrecisionScope precision(cfg.model.precision);
  Transformer<float> model(cfg, kV);
  model.init(uint64_t(cfg.run.seed), cfg.model.init_scale);
  auto& P = model.params();
  auto opt = make_optimizer(cfg, P);
  const Schedule sched = Schedule::from_config(cfg);
  std::vector<double> loss, norm, lr;
  for (int t = 1; t <= kSteps; ++t) {
    // bf16: the weights each step starts from, for the reference's step-by-step comparison.
    if (cfg.model.precision == Precision::Bf16)
      write_params(f, "train/" + opt_name + "/params_" + std::to_string(t), P, false);
    const HostBatch& b = batches[size_t(t - 1)];
    const LossWeights w = loss_weights(cfg, b);
    const StepContext ctx{uint64_t(cfg.run.seed), uint32_t(t), true, 0, nullptr};
    P.zero_grad();
    const ForwardStats fs = model.forward(ctx, b.micro(), w);
    const bool bf16 = cfg.model.precision == Precision::Bf16;
    const std::string at = "train/" + opt_name + "/";
    if (bf16)  // before backward overwrites them
      f.write(at + "logits_" + std::to_string(t), std::vector<float>(model.logits().begin(), model.logits().end()),
              {int64_t(kB) * kT, kV});
    model.backward(ctx, w);
    if (bf16) write_params(f, at + "grads_" + std::to_string(t), P, true);
    loss.push_back(total_loss(fs, w));
    norm.push_back(std::sqrt(test::grad_sum_squares(P)));
    lr.push_back(sched(t));
    REQUIRE(std::isfinite(norm.back()));
    opt->step(P, lr.back(), t, clip_scale(norm.back(), cfg.optim.grad_clip));
    for (auto& blk : model.blocks())  // moe.balance = bias: as Trainer::update_selection_biases
      if (blk.moe) {
        const auto& load = blk.moe->stats().load;
        blk.moe->router.update_bias(std::vector<double>(load.begin(), load.end()));
      }
  }
  if (cfg.moe.balance == BalanceKind::Bias)  // the biases moved: the curves test their update
    for (auto& blk : model.blocks())
      if (blk.moe) CHECK(blk.moe->router.bias_max_abs() >= 2 * cfg.moe.bias_update_rate);
  h5::Group g = f.create_group("train/" + opt_name);
  g.set_attr("lr_peak", cfg.optim.lr);
  g.set_attr("schedule", std::string(option_name(cfg.optim.schedule)));
  g.write("loss", loss);
  g.write("grad_norm", norm);
  g.write("lr", lr);
}

void run_case(const RefCase& rc, int index) {
  const Config& cfg = rc.cfg;
  const std::string path = test::scratch_dir() + "/model_ref_" + rc.name + ".h5";
  h5::File f = h5::File::create(path);
  write_config(f, cfg, kV);

  const test::GemmPrecisionScope precision(cfg.model.precision);
  Transformer<float> model(cfg, kV);
  model.init(uint64_t(cfg.run.seed), cfg.model.init_scale);
  auto& P = model.params();
  write_params(f, "params", P, false);

  // One forward/backward at a step and token offset other than the trainer's first, so that the
  // random streams' step and global-token keys are exercised.
  const bool encdec = cfg.model.arch == ModelArch::EncDec;
  const HostBatch b = make_batch(1000u + uint32_t(index), encdec);
  // The forward must see packed rows: some row holds several examples.
  REQUIRE(*std::max_element(b.segment.begin(), b.segment.end()) > 0);
  write_batch(f, "batch", b);
  const StepContext ctx{uint64_t(cfg.run.seed), 7, true, 96, nullptr};
  {
    h5::Group g = f.create_group("ctx");
    g.set_attr("seed", int64_t(ctx.seed));
    g.set_attr("step", int64_t(ctx.step));
    g.set_attr("token_offset", int64_t(ctx.token_offset));
  }
  // moe.balance = bias: the forward ranks with given selection biases, of the size of the router's
  // probability gaps, written as /bias/block<i> [E] for the reference.
  {
    std::mt19937 rng(77u + uint32_t(index));
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    for (size_t i = 0; i < model.blocks().size(); ++i) {
      if (!model.blocks()[i].moe) continue;
      Buffer<float>& bias = model.blocks()[i].moe->router.selection_bias;
      if (bias.empty()) continue;
      for (float& x : bias) x = u(rng);
      f.write("bias/block" + std::to_string(i), std::vector<float>(bias.begin(), bias.end()));
    }
  }
  const LossWeights w = loss_weights(cfg, b);
  P.zero_grad();
  const ForwardStats fs = model.forward(ctx, b.micro(), w);
  const Buffer<float> logits = model.logits();  // copy: backward overwrites them
  REQUIRE(logits.size() == size_t(kB) * kT * kV);

  int64_t drops = 0, declined = 0, rerouted = 0, unrouted = 0, several = 0;
  for (size_t i = 0; i < model.blocks().size(); ++i) {
    const auto& blk = model.blocks()[i];
    if (!blk.moe) continue;
    const Routing<float>& r = blk.moe->router.routing();
    const std::string g = "routing/block" + std::to_string(i);
    f.write(g + "/expert", std::vector<int32_t>(r.expert.begin(), r.expert.end()));
    f.write(g + "/slot", std::vector<int32_t>(r.slot.begin(), r.slot.end()));
    f.group(g).set_attr("capacity", int64_t(r.C));
    f.group(g).set_attr("k", int64_t(r.k));
    drops += r.dropped;
    declined += r.declined;
    rerouted += r.rerouted;
    const std::vector<int64_t>& per_token = blk.moe->stats().experts_per_token;
    unrouted += per_token[0];
    several += per_token[2] + per_token[3];
  }
  model.backward(ctx, w);

  f.write("out/logits", std::vector<float>(logits.begin(), logits.end()), {int64_t(kB) * kT, kV});
  {
    h5::Group g = f.group("out");
    g.set_attr("ce_sum", fs.ce_sum);
    g.set_attr("mask_sum", fs.mask_sum);
    g.set_attr("aux_sum", fs.aux_sum);
    g.set_attr("z_sum", fs.z_sum);
    g.set_attr("w_ce", w.ce);
    g.set_attr("w_aux", w.aux);
    g.set_attr("w_z", w.z);
    g.set_attr("loss", total_loss(fs, w));
  }
  write_params(f, "grads", P, true);

  INFO(rc.name << ": dropped " << drops << ", declined " << declined << ", rerouted " << rerouted);
  CHECK(std::isfinite(total_loss(fs, w)));
  if (cfg.moe.every > 0 && cfg.moe.router != RouterKind::ExpertChoice) CHECK(fs.aux_sum > 0);
  if (cfg.moe.router == RouterKind::ExpertChoice) CHECK(fs.aux_sum == 0);  // the paper adds none
  if (rc.expect_uneven_tokens) CHECK((unrouted > 0 && several > 0));
  if (rc.expect_drops) CHECK(drops > 0);
  if (rc.expect_declined) CHECK(declined > 0);
  if (rc.expect_rerouted) CHECK(rerouted > 0);

  std::vector<HostBatch> batches;
  for (int t = 0; t < kSteps; ++t) batches.push_back(make_batch(2000u + 100u * uint32_t(index) + uint32_t(t), encdec));
  {
    std::vector<int32_t> in, tg, sg, ein, esg;
    std::vector<float> mk;
    for (const HostBatch& hb : batches) {
      ein.insert(ein.end(), hb.enc_inputs.begin(), hb.enc_inputs.end());
      esg.insert(esg.end(), hb.enc_segment.begin(), hb.enc_segment.end());
      in.insert(in.end(), hb.inputs.begin(), hb.inputs.end());
      tg.insert(tg.end(), hb.targets.begin(), hb.targets.end());
      mk.insert(mk.end(), hb.mask.begin(), hb.mask.end());
      sg.insert(sg.end(), hb.segment.begin(), hb.segment.end());
    }
    f.write("train/batches/segment", sg, {kSteps, kB, kT});
    f.write("train/batches/inputs", in, {kSteps, kB, kT});
    f.write("train/batches/targets", tg, {kSteps, kB, kT});
    f.write("train/batches/mask", mk, {kSteps, kB, kT});
    if (encdec) {
      f.write("train/batches/enc_inputs", ein, {kSteps, kB, kT});
      f.write("train/batches/enc_segment", esg, {kSteps, kB, kT});
    }
  }
  train_run(f, rc, "adamw", batches);
  train_run(f, rc, "adafactor", batches);
}

}  // namespace

TEST_CASE("model vs PyTorch: write the C++ side of every reference configuration", "[.][model-torch]") {
  if (test::world_size() != 1) return;  // single-rank reference (tests/scripts/model_vs_torch.sh runs np=1)
  const auto cases = ref_cases();
  for (size_t i = 0; i < cases.size(); ++i) run_case(cases[i], int(i));
}
