// The whole model's backward against central finite differences in double precision: embedding,
// attention, dense and MoE feed-forwards, LayerNorms, tied head, masked cross-entropy, aux and z
// losses, dropout and router jitter all active, with capacity drops. Tolerance (stated):
// |analytic - numeric| <= 1e-6 * max(1, |numeric|), h = 1e-6.
// Also the encoder-decoder (model.arch = encdec: bidirectional encoder, cross-attention, packed
// examples of other lengths on the two sides). Last case: bitwise equality of one and two host
// threads, and of the loss gradient computed in the forward or in the backward.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "model/transformer.hpp"
#include "tensor/launch.hpp"
#include "../test_util.hpp"

using namespace meshmoe;

namespace {

Config tiny_config(const std::string& router, bool tied) {
  Config c;
  c.model.seq_len = 8;
  c.model.d_model = 8;
  c.model.num_layers = 2;
  c.model.num_heads = 2;
  c.model.d_ff = 12;
  c.model.activation = Activation::Gelu;
  c.model.tied_embeddings = tied;
  c.model.dropout = 0.1;
  c.moe.num_experts = 4;
  c.moe.every = 2;
  c.moe.router = test::option<RouterKind>(router);
  c.moe.second_expert = SecondExpertPolicy::Random;
  c.moe.group_size = 8;
  c.moe.capacity_factor_train = 1.0;
  c.moe.jitter_eps = 0.01;
  c.moe.z_loss_coef = 1e-2;
  c.moe.aux_loss_coef = 1e-1;
  return c;
}

struct Case {
  std::vector<int32_t> inputs, targets;
  std::vector<float> mask;
};

Case random_case(int B, int T, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  Case c;
  for (int i = 0; i < B * T; ++i) {
    c.inputs.push_back(int32_t(rng() % V));
    c.targets.push_back(int32_t(rng() % V));
    c.mask.push_back(rng() % 4 == 0 ? 0.f : 1.f);
  }
  return c;
}

// With soft targets (distillation) the cross-entropy term is the mixture of the two sums.
double total_loss(Transformer<double>& m, const StepContext& ctx, const MicroBatch& mb, const LossWeights& w,
                  ForwardStats* out = nullptr) {
  const ForwardStats f = m.forward(ctx, mb, w);
  if (out) *out = f;
  const double a = mb.soft_targets ? w.distill_alpha : 0.0;
  return w.ce * ((1 - a) * f.ce_sum + a * f.soft_sum) + w.aux * f.aux_sum + w.z * f.z_sum;
}

// distill_alpha >= 0: the micro-batch carries soft targets (random rows of probabilities) mixed in
// with that weight.
void check_model(const std::string& router, bool tied, bool encdec = false, double distill_alpha = -1) {
  const int B = 2, T = 8, V = 11;
  Config cfg = tiny_config(router, tied);
  if (encdec) cfg.model.arch = ModelArch::EncDec;
  Transformer<double> model(cfg, V);
  model.init(7, 1.0);
  const Case c = random_case(B, T, V, 3);
  MicroBatch mb{B, T, c.inputs.data(), c.targets.data(), c.mask.data()};
  // encdec: packed decoder rows; the encoder rows hold the same examples with their lengths in
  // reverse order (token j of the row reversed, example ids flipped back to ascending).
  std::vector<int32_t> segment, position, enc_inputs, enc_segment, enc_position;
  if (encdec) {
    test::random_packing(B, T, 9, 3, segment, position);
    const Case e = random_case(B, T, V, 4);
    enc_inputs = e.inputs;
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < T; ++j) {
        const int32_t last = segment[size_t(b * T + T - 1)];
        enc_segment.push_back(last - segment[size_t(b * T + T - 1 - j)]);
        const bool first = j == 0 || enc_segment.back() != enc_segment[enc_segment.size() - 2];
        enc_position.push_back(first ? 0 : enc_position.back() + 1);
      }
    REQUIRE(enc_segment != segment);
    mb.segment = segment.data(), mb.position = position.data();
    mb.enc_len = T, mb.enc_inputs = enc_inputs.data(), mb.enc_segment = enc_segment.data();
    mb.enc_position = enc_position.data();
  }
  const StepContext ctx{42, 5, true, 16, nullptr};
  double masked = 0;
  for (float m : c.mask) masked += m;
  LossWeights w{1.0 / masked, cfg.moe.aux_loss_coef / 2.0, cfg.moe.z_loss_coef / (B * T)};
  std::vector<float> soft;
  if (distill_alpha >= 0) {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    soft.resize(size_t(B) * T * V);
    for (int n = 0; n < B * T; ++n) {
      float z = 0;
      for (int v = 0; v < V; ++v) z += soft[size_t(n * V + v)] = u(rng) * u(rng);
      for (int v = 0; v < V; ++v) soft[size_t(n * V + v)] /= z;
    }
    mb.soft_targets = soft.data();
    w.distill_alpha = distill_alpha;
  }

  auto& P = model.params();
  P.zero_grad();
  ForwardStats f;
  total_loss(model, ctx, mb, w, &f);
  REQUIRE(f.aux_sum > 0);
  if (distill_alpha >= 0) REQUIRE(f.soft_sum > f.ce_sum / 4);
  model.backward(ctx, w);
  const std::vector<double> analytic(P.grads(), P.grads() + P.size());

  std::mt19937 pick(11);
  const double h = 1e-6;
  int checked = 0;
  for (const ParamInfo& p : P.infos()) {
    const int samples = int(std::min<size_t>(p.size, 12));
    for (int s = 0; s < samples; ++s) {
      const size_t i = p.flat_offset + (p.size <= 12 ? size_t(s) : pick() % p.size);
      double* wgt = P.weights() + i;
      const double saved = *wgt;
      *wgt = saved + h;
      const double lp = total_loss(model, ctx, mb, w);
      *wgt = saved - h;
      const double lm = total_loss(model, ctx, mb, w);
      *wgt = saved;
      const double numeric = (lp - lm) / (2 * h);
      INFO(p.name << " element " << (i - p.flat_offset) << ": analytic " << analytic[i] << " numeric " << numeric);
      CHECK(std::abs(analytic[i] - numeric) <= 1e-6 * std::max(1.0, std::abs(numeric)));
      ++checked;
    }
  }
  CHECK(checked > 100);
}

}  // namespace

TEST_CASE("transformer: whole-model gradients match finite differences (top-2, tied)", "[model]") {
  check_model("top2", true);
}

TEST_CASE("transformer: whole-model gradients match finite differences (top-1, untied)", "[model]") {
  check_model("top1", false);
}

TEST_CASE("transformer: encoder-decoder gradients match finite differences (top-2, untied)", "[model]") {
  check_model("top2", false, true);
}

TEST_CASE("transformer: distillation's soft-target loss, whole-model gradients match finite differences", "[model][distill]") {
  check_model("top1", true, false, 0.25);
  check_model("top2", false, true, 0.7);
}

TEST_CASE("transformer: model FLOPs per token follow the formula", "[model]") {
  Config cfg = tiny_config("top1", true);
  cfg.model.activation = Activation::Relu;
  const ModelShape s = model_shape(cfg, 11);
  const double M = 8, T = 8, V = 11, H = 12, E = 4;
  const double dense_block = 8 * M * M + 4 * T * M + 4 * M * H;
  const double moe_block = 8 * M * M + 4 * T * M + 2 * M * E + 1 * 4 * M * H;
  CHECK(train_flops_per_token(cfg, s) == Approx(3 * (2 * M * V + dense_block + moe_block)).epsilon(1e-12));
}

// The host loops and attention's (sequence, head) tasks on 2 threads (tensor/launch.hpp) give
// bitwise the loss and gradients of 1 thread (docs/ARCHITECTURE.md, Invariants): shapes large
// enough that every threaded path runs (T = 128: two causal row blocks per head).
// Also CrossEntropy::forward_with_gradient in a training forward (the trainer's setting): the same
// loss, gradients and dlogits, bit for bit, as the loss's gradient computed in the backward.
TEST_CASE("transformer: two host threads, and the loss gradient written in the forward, give bitwise the loss and gradients of one thread", "[model]") {
  const int B = 4, T = 128, V = 600;
  Config cfg = tiny_config("top2", true);
  cfg.model.seq_len = T;
  cfg.model.d_model = 64;
  cfg.model.num_heads = 4;
  cfg.model.d_ff = 128;
  cfg.moe.group_size = 64;
  Transformer<float> model(cfg, V);
  model.init(7, 1.0);
  const Case c = random_case(B, T, V, 5);
  const MicroBatch mb{B, T, c.inputs.data(), c.targets.data(), c.mask.data()};
  const StepContext ctx{42, 5, true, 16, nullptr};
  const LossWeights w{1.0 / (B * T), cfg.moe.aux_loss_coef / 2.0, cfg.moe.z_loss_coef / (B * T)};
  auto step = [&](int threads, bool loss_gradient_in_forward = false) {
    set_host_loop_threads(threads);
    model.set_loss_gradient_in_forward(loss_gradient_in_forward);
    auto& P = model.params();
    P.zero_grad();
    const ForwardStats f = model.forward(ctx, mb, w);
    model.backward(ctx, w);
    set_host_loop_threads(1);
    model.set_loss_gradient_in_forward(false);
    std::vector<double> out{f.ce_sum, f.aux_sum, f.z_sum};
    out.insert(out.end(), P.grads(), P.grads() + P.size());
    out.insert(out.end(), model.logits().begin(), model.logits().end());  // dlogits after the backward
    return out;
  };
  const std::vector<double> one = step(1), two = step(2);
  CHECK(one[0] > 0);
  CHECK(one == two);
  CHECK(step(1, true) == one);
  CHECK(step(2, true) == one);
}
