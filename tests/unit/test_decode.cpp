// Incremental decoding over the KV cache (src/decode/cached_model.hpp) against the full forward of
// the same prefixes (Transformer::forward, evaluation mode), for a dense model and MoE models with
// Switch top-1 and GShard top-2 routing. The full forward routes groups of moe.group_size tokens,
// the cached one each step's tokens as one group: capacity_factor_eval = E makes the capacity the
// whole group, so no choice is dropped in either and the two must agree.
// Tolerance (stated): |cached - full| <= tol * max(1, |full|), tol = 2e-5 (float), 1e-12 (double).
// "+blocks": the same with RMSNorm, rotary positions, SwiGLU and a leading dense block; "+gqa",
// "+mqa": grouped-query and multi-query attention (kv heads split, and replicated, over tensor)
// (decode_test_util.hpp). The [mpi] case: the cached decoding of a model sharded over pipe, data and tensor (experts over
// data or over tensor; encdec stages of encoder blocks only and of decoder blocks only) against the
// one-rank model's, within the same tolerance; and data ranks stepping their own streams together,
// those out of tokens with none (the inputs split over the data axis).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "decode/cached_model.hpp"
#include "decode/decoder.hpp"
#include "decode_test_util.hpp"
#include "mesh/mesh.hpp"
#include "parallel/pipeline_executor.hpp"
#include "run/decode_bytes.hpp"
#include "../test_util.hpp"

using namespace meshmoe;
using meshmoe::test::decode_config;
using meshmoe::test::full_logits;

namespace {

template <typename T>
double tolerance() {
  return sizeof(T) == sizeof(float) ? 2e-5 : 1e-12;
}

template <typename T>
void require_close(const T* got, const std::vector<T>& want, size_t at, int V, const std::string& what) {
  double worst = 0;
  for (int v = 0; v < V; ++v) {
    const double w = double(want[at * V + size_t(v)]);
    worst = std::max(worst, std::abs(double(got[v]) - w) / std::max(1.0, std::abs(w)));
  }
  INFO(what << ": worst relative difference " << worst);
  REQUIRE(worst <= tolerance<T>());
}

// Random sources of lengths 1 to T_seq (the encoder's inputs of the encdec cases).
std::vector<std::vector<int32_t>> random_sources(int count, int T_seq, int V, std::mt19937& rng) {
  std::vector<std::vector<int32_t>> sources(static_cast<size_t>(count));
  for (auto& s : sources) {
    s.resize(1 + rng() % unsigned(T_seq));
    for (auto& t : s) t = int32_t(rng() % V);
  }
  return sources;
}

// The full forward's logits [rows * T_seq, V] of `rows` sequences of T_seq tokens: the decoder
// model's, or (sources given) the encdec model's with sources[b] into the encoder.
template <typename T>
std::vector<T> oracle_logits(Transformer<T>& model, const std::vector<int32_t>& tokens, int rows, int T_seq,
                             const std::vector<std::vector<int32_t>>& sources) {
  if (sources.empty()) return full_logits(model, tokens, rows, T_seq);
  std::vector<std::vector<int32_t>> inputs;
  for (int b = 0; b < rows; ++b) inputs.emplace_back(tokens.begin() + b * T_seq, tokens.begin() + (b + 1) * T_seq);
  int T_full = 0;
  std::vector<T> full = test::full_encdec_logits(model, sources, inputs, T_full);
  REQUIRE(T_full == T_seq);
  return full;
}

Config arch_config(const std::string& ffn, bool encdec) {
  return encdec ? test::encdec_decode_config(ffn) : decode_config(ffn);
}

// B sequences decoded one token per step after a prefill of `prefill` tokens each (encdec: the
// decoder's inputs, each stream with its own source).
template <typename T>
void check_cached_equals_full(const std::string& ffn, bool encdec) {
  const int B = 2, T_seq = 10, prefill = 3;
  Config cfg = arch_config(ffn, encdec);
  const int V = 23;
  Transformer<T> model(cfg, V);
  model.init(11, 1.0);
  std::mt19937 rng(5);
  std::vector<int32_t> tokens(size_t(B) * T_seq);
  for (auto& t : tokens) t = int32_t(rng() % V);
  const auto sources = encdec ? random_sources(B, T_seq, V, rng) : std::vector<std::vector<int32_t>>{};
  const std::vector<T> full = oracle_logits(model, tokens, B, T_seq, sources);

  CachedModel<T> cached(model);
  if (encdec) cached.encode(sources);
  cached.reset(B, T_seq);
  std::vector<int32_t> step_tokens, stream, position;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < prefill; ++t) {
      step_tokens.push_back(tokens[size_t(b) * T_seq + t]);
      stream.push_back(b);
      position.push_back(t);
    }
  const Buffer<T>& logits = cached.step(step_tokens.data(), {int(step_tokens.size()), stream.data(), position.data()});
  for (int i = 0; i < int(step_tokens.size()); ++i)
    require_close(logits.data() + size_t(i) * V, full, size_t(stream[i]) * T_seq + position[i], V, "prefill");
  for (int t = prefill; t < T_seq; ++t) {
    step_tokens.clear();
    stream.clear();
    position.clear();
    for (int b = 0; b < B; ++b) {
      step_tokens.push_back(tokens[size_t(b) * T_seq + t]);
      stream.push_back(b);
      position.push_back(t);
    }
    const Buffer<T>& l = cached.step(step_tokens.data(), {B, stream.data(), position.data()});
    for (int b = 0; b < B; ++b) {
      REQUIRE(cached.where()[size_t(b)] == t);
      require_close(l.data() + size_t(b) * V, full, size_t(b) * T_seq + t, V, "step " + std::to_string(t));
    }
  }
}

// Two continuations of one prompt interleaved in one stream, each token seeing the prompt and its
// own continuation only (GShard appendix A.1's flat layout), against the full forward of each
// (encdec: both read the stream's one source, as the hypotheses of a source do).
template <typename T>
void check_flat_stream_equals_full(const std::string& ffn, bool encdec) {
  const int P = 4, steps = 5, T_seq = P + steps;
  Config cfg = arch_config(ffn, encdec);
  const int V = 19;
  Transformer<T> model(cfg, V);
  model.init(3, 1.0);
  std::mt19937 rng(9);
  std::vector<int32_t> seqs(2 * size_t(T_seq));
  for (int t = 0; t < T_seq; ++t) {
    const int32_t a = int32_t(rng() % V);
    seqs[size_t(t)] = a;
    seqs[size_t(T_seq + t)] = t < P ? a : int32_t(rng() % V);  // the same prompt, then another path
  }
  const auto source = encdec ? random_sources(1, T_seq, V, rng) : std::vector<std::vector<int32_t>>{};
  const auto sources = encdec ? std::vector<std::vector<int32_t>>{source[0], source[0]} : source;
  const std::vector<T> full = oracle_logits(model, seqs, 2, T_seq, sources);

  const int capacity = P + 2 * steps;
  CachedModel<T> cached(model);
  if (encdec) cached.encode(source);
  cached.reset(1, capacity);
  std::vector<int32_t> stream(size_t(P), 0), position;
  for (int t = 0; t < P; ++t) position.push_back(t);
  cached.step(seqs.data(), {P, stream.data(), position.data()});
  std::vector<uint8_t> sees[2];
  for (auto& s : sees) s.assign(size_t(capacity), 0), std::fill(s.begin(), s.begin() + P, uint8_t(1));
  for (int t = P; t < T_seq; ++t) {
    const int32_t tok[2] = {seqs[size_t(t)], seqs[size_t(T_seq + t)]};
    const int32_t str[2] = {0, 0}, pos[2] = {t, t};
    std::vector<uint8_t> visible(sees[0]);
    visible.insert(visible.end(), sees[1].begin(), sees[1].end());
    const Buffer<T>& l = cached.step(tok, {2, str, pos, visible.data()});
    for (int h = 0; h < 2; ++h) {
      sees[h][size_t(cached.where()[size_t(h)])] = 1;
      require_close(l.data() + size_t(h) * V, full, size_t(h) * T_seq + t, V, "hypothesis " + std::to_string(h));
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("decode: KV-cache decoding equals the full forward (dense, Switch, GShard top-2)", "[decode]", float,
                   double) {
  for (const char* ffn : {"dense", "top1", "top2", "dense+blocks", "top2+blocks", "top2+blocks+gqa", "dense+blocks+mqa"}) {
    SECTION(ffn) {
      check_cached_equals_full<TestType>(ffn, false);
      check_flat_stream_equals_full<TestType>(ffn, false);
    }
  }
}

TEMPLATE_TEST_CASE("decode: encdec decoding (encoder once, cross-attention cache) equals the full encdec forward",
                   "[decode]", float, double) {
  for (const char* ffn : {"dense", "top1", "top2", "top2+blocks"}) {
    SECTION(ffn) {
      check_cached_equals_full<TestType>(ffn, true);
      check_flat_stream_equals_full<TestType>(ffn, true);
    }
  }
}

TEST_CASE("decode: encdec sources are checked; a stream needs its source", "[decode]") {
  Transformer<float> model(test::encdec_decode_config("dense"), 7);
  model.init(1, 1.0);
  CachedModel<float> cached(model);
  REQUIRE(cached.encdec());
  REQUIRE_THROWS_WITH(cached.encode({{1, 2}, {}}), Catch::Contains("a source of 0 tokens"));
  REQUIRE_THROWS_WITH(cached.encode({std::vector<int32_t>(17, 1)}), Catch::Contains("model.seq_len = 16"));
  REQUIRE_THROWS_WITH(cached.encode({{1, 7}}), Catch::Contains("outside the vocabulary"));
  cached.encode({{1, 2, 3}});
  cached.reset(2, 4);
  const int32_t tok[2] = {1, 2}, str[2] = {0, 1}, pos[2] = {0, 0};
  REQUIRE_THROWS_WITH(cached.step(tok, {2, str, pos}), Catch::Contains("stream 1 has no source"));
  Transformer<float> decoder(decode_config("dense"), 7);
  CachedModel<float> plain(decoder);
  REQUIRE_THROWS_AS(plain.encode({{1}}), std::logic_error);
}

TEST_CASE("decode: a step's MoE tokens are one group without capacity by default, however small the factor",
          "[decode]") {
  Config cfg = decode_config("top1");
  cfg.moe.capacity_factor_eval = 0.25;  // as in the next case, where it drops; moe.decode_capacity = dropless here
  REQUIRE(cfg.moe.decode_capacity == DecodeCapacity::Dropless);
  Transformer<double> model(cfg, 13);
  model.init(2, 1.0);
  CachedModel<double> cached(model);
  cached.reset(1, 8);
  const int32_t tok[4] = {5, 5, 5, 5}, str[4] = {0, 0, 0, 0}, pos[4] = {0, 1, 2, 3};
  const Buffer<double>& got = cached.step(tok, {4, str, pos});
  const MoeStats& st = model.moe_layers().front()->stats();
  REQUIRE(st.wanted == 4);
  REQUIRE(st.dropped == 0);
  REQUIRE(st.capacity == 4);
  // The full forward's groups are single tokens (decode_config: moe.group_size = 1): none drops there either.
  const std::vector<double> full = full_logits(model, std::vector<int32_t>(tok, tok + 4), 1, 4);
  for (int t = 0; t < 4; ++t) require_close(got.data() + size_t(t) * 13, full, size_t(t), 13, "token " + std::to_string(t));
}

TEST_CASE("decode: with moe.decode_capacity = eval a step's group has capacity_factor_eval's capacity; over it they drop",
          "[decode]") {
  Config cfg = decode_config("top1");
  cfg.moe.decode_capacity = DecodeCapacity::Eval;
  cfg.moe.capacity_factor_eval = 0.25;  // C = ceil(1 * n * 0.25 / 4) = 1 for n = 4 tokens
  Transformer<double> model(cfg, 13);
  model.init(2, 1.0);
  CachedModel<double> cached(model);
  cached.reset(1, 8);
  // The same token four times: they differ by their positions only and pick the same expert.
  const int32_t tok[4] = {5, 5, 5, 5}, str[4] = {0, 0, 0, 0}, pos[4] = {0, 1, 2, 3};
  cached.step(tok, {4, str, pos});
  const MoeStats& st = model.moe_layers().front()->stats();
  int64_t placed = 0;
  for (int64_t l : st.load) {
    REQUIRE(l <= 1);
    placed += l;
  }
  REQUIRE(st.wanted == 4);
  REQUIRE(st.dropped == 4 - placed);
  REQUIRE(st.dropped > 0);
}

TEST_CASE("decode: decoding keeps no bf16 copies of the norms' outputs, as the decode memory plan counts none",
          "[decode][memory][bf16][deferred]") {
  // On a bf16 GPU run the norms whose outputs GEMMs read keep bf16 copies in training
  // (LayerNorm::output16; the memory plan's "output, bf16"), but decoding never runs on the device:
  // generate and translate refuse run.device = "cuda" (check_decodable), and the translation scores
  // of a GPU run decode with the model's host copy in a HostSection (Trainer), whose Buffers are the
  // host's, where the layers keep no copies. So decode_memory_bytes counts none: with bf16 GEMMs on
  // a GPU it equals the fp32 bound, and the norms of the host copy hold no copy after a prefill of S
  // streams of P tokens and a step (the deferred host device takes the GPU's side around it, as
  // in the trainer). Dense and GShard top-2, decoder-only and encdec (ln_enc, ln_cross too).
  const int V = 23, S = 3, P = 5;
  const DecodeShape shape{S, 1, 2, P};
  for (const bool encdec : {false, true})
    for (const std::string ffn : {"dense", "top2"}) {
      INFO(ffn << (encdec ? ", encdec" : ""));
      Config cfg = arch_config(ffn, encdec);
      cfg.model.precision = Precision::Bf16;
      cfg.run.device = Device::Cuda;
      CHECK_THROWS_AS(check_decodable(cfg), InputError);
      Config fp32 = cfg;
      fp32.model.precision = Precision::Fp32;
      CHECK(decode_memory_bytes(cfg, V, shape) == decode_memory_bytes(fp32, V, shape));

      const test::GemmPrecisionScope bf16(Precision::Bf16);
      test::DeferredHostDevice device;
      REQUIRE(bf16_operand_copies<float>());  // the training model's side
      const HostSection host;
      Transformer<float> model(cfg, V);
      model.init(7, 1.0);
      std::vector<std::vector<int32_t>> prompts(S);
      for (int s = 0; s < S; ++s)
        for (int t = 0; t < P; ++t) prompts[size_t(s)].push_back(int32_t((5 * s + 3 * t + 1) % V));
      CachedModel<float> cached(model);
      if (encdec) cached.encode(prompts);
      cached.reset(S, P + 1);
      std::vector<int> last_row;
      cached.prefill(prompts, last_row);
      std::vector<int32_t> tokens(S, 2), stream, position(S, P);
      for (int s = 0; s < S; ++s) stream.push_back(s);
      cached.step(tokens.data(), {S, stream.data(), position.data()});
      device_synchronize();
      size_t held = model.final_norm().output16_bytes() + model.encoder_norm().output16_bytes();
      for (auto& b : model.blocks())
        held += b.ln1.output16_bytes() + b.ln2.output16_bytes() + (b.ln_cross ? b.ln_cross->output16_bytes() : 0);
      CHECK(held == 0);
    }
}

TEST_CASE("decode: a full cache stream is an error, not an overwrite", "[decode]") {
  Transformer<float> model(decode_config("dense"), 7);
  model.init(1, 1.0);
  CachedModel<float> cached(model);
  cached.reset(1, 2);
  const int32_t tok[3] = {1, 2, 3}, str[3] = {0, 0, 0}, pos[3] = {0, 1, 2};
  REQUIRE_THROWS_WITH(cached.step(tok, {3, str, pos}), Catch::Contains("capacity"));
}

TEST_CASE("decode: cached decoding on a pipe x data x tensor mesh equals the one-rank model's", "[decode][mpi]") {
  const int W = test::world_size();
  struct Shape {
    int pipe, data, tensor;
    const char* expert_axis;
  };
  std::vector<Shape> shapes;
  if (W == 2) shapes = {{1, 2, 1, "data"}, {1, 1, 2, "data"}, {1, 1, 2, "tensor"}, {2, 1, 1, "data"}};
  if (W == 4)
    shapes = {{1, 4, 1, "data"}, {1, 2, 2, "data"}, {1, 2, 2, "tensor"}, {2, 2, 1, "data"}, {2, 1, 2, "tensor"},
              {4, 1, 1, "data"}};
  if (shapes.empty()) SUCCEED("needs 2 or 4 ranks");
  for (const Shape& sh : shapes) {
    for (const auto& [encdec, ffn] : {std::pair{false, "top2"}, {true, "top2"}, {false, "top2+blocks"},
                                      {false, "top2+blocks+gqa"}, {false, "dense+blocks+mqa"}}) {
      Config cfg = arch_config(ffn, encdec);
      // pipe = 4 puts one of the encdec model's 2 + 2 blocks on each stage; the decoder's 2 blocks do not split in 4
      const int blocks = encdec ? 2 * cfg.model.num_layers : cfg.model.num_layers;
      if (blocks % sh.pipe != 0) continue;
      Mesh mesh(MPI_COMM_WORLD, sh.pipe, sh.data, sh.tensor);
      INFO("mesh pipe=" << sh.pipe << " data=" << sh.data << " tensor=" << sh.tensor << " experts over "
                        << sh.expert_axis << (encdec ? " encdec " : " decoder ") << ffn);
      cfg.mesh.pipe = sh.pipe;
      cfg.moe.expert_axis = test::option<ExpertAxis>(sh.expert_axis);
      const int V = 17, B = 3, T_seq = 7;
      Transformer<double> sharded(cfg, V, model_sharding(mesh, cfg)), whole(cfg, V);
      sharded.init(31, 1.0);
      whole.init(31, 1.0);
      CachedModel<double> a(sharded, &mesh.axis(Axis::Pipe)), b(whole);
      std::mt19937 rng(13);  // the same tokens on every rank
      if (encdec) {
        const auto sources = random_sources(B, T_seq, V, rng);
        a.encode(sources);
        b.encode(sources);
      }
      a.reset(B, T_seq);
      b.reset(B, T_seq);
      for (int t = 0; t < T_seq; ++t) {
        std::vector<int32_t> tok, stream, position;
        for (int s = 0; s < B; ++s) {
          tok.push_back(int32_t(rng() % V));
          stream.push_back(s);
          position.push_back(t);
        }
        const CachedTokens where{B, stream.data(), position.data()};
        const Buffer<double>& la = a.step(tok.data(), where);
        const Buffer<double>& whole_logits = b.step(tok.data(), where);
        const std::vector<double> lb(whole_logits.begin(), whole_logits.end());
        for (int s = 0; s < B; ++s) require_close(la.data() + size_t(s) * V, lb, size_t(s), V, "step " + std::to_string(t));
      }
    }
  }
}

// Inputs split over the data axis (docs/user-guide.md "The device mesh and parallelism"): every data group steps its own streams, the
// data ranks stepping together (more_steps, as data_group_cached_model sets it) because the MoE
// all-to-all spans them. Data rank 0 holds 3 streams for 5 steps, rank 1 one stream for 2 steps,
// ranks 2, 3 none at all: they step with no tokens (and encode no source) until rank 0 is done.
// Each rank's logits equal the one-rank model's on its own streams, within the stated tolerance.
TEST_CASE("decode: data ranks step their own streams together; a rank out of tokens steps with none", "[decode][mpi]") {
  const int W = test::world_size();
  struct Shape {
    int pipe, data, tensor;
  };
  std::vector<Shape> shapes;
  if (W == 2) shapes = {{1, 2, 1}};
  if (W == 4) shapes = {{1, 4, 1}, {1, 2, 2}, {2, 2, 1}};
  if (shapes.empty()) SUCCEED("needs 2 or 4 ranks");
  for (const Shape& sh : shapes)
    for (bool encdec : {false, true}) {
      Config cfg = arch_config("top2", encdec);
      Mesh mesh(MPI_COMM_WORLD, sh.pipe, sh.data, sh.tensor);
      INFO("mesh pipe=" << sh.pipe << " data=" << sh.data << " tensor=" << sh.tensor << (encdec ? " encdec" : " decoder"));
      cfg.mesh.pipe = sh.pipe;
      const int V = 17, T_seq = 7, d = mesh.coord(Axis::Data);
      const int B = d == 0 ? 3 : d == 1 ? 1 : 0, steps = d == 0 ? 5 : d == 1 ? 2 : 0;
      Transformer<double> sharded(cfg, V, model_sharding(mesh, cfg)), whole(cfg, V);
      sharded.init(31, 1.0);
      whole.init(31, 1.0);
      CachedModel<double> a(sharded, &mesh.axis(Axis::Pipe)), b(whole);
      Comm& data = mesh.axis(Axis::Data);
      a.more_steps = [&data](bool mine) {
        int any = mine ? 1 : 0;
        data.all_reduce(&any, 1, Op::Max);
        return any != 0;
      };
      std::mt19937 rng(13 + unsigned(d));  // each data group its own tokens, the same on its ranks
      const auto sources = random_sources(B, T_seq, V, rng);
      if (encdec) {
        a.encode(sources);
        if (B > 0) b.encode(sources);
      }
      a.reset(B, T_seq);
      if (B > 0) b.reset(B, T_seq);
      int t = 0;
      for (; a.keep_stepping(t < steps); ++t) {
        std::vector<int32_t> tok, stream, position;
        for (int s = 0; s < B && t < steps; ++s) {
          tok.push_back(int32_t(rng() % V));
          stream.push_back(s);
          position.push_back(t);
        }
        const CachedTokens where{int(tok.size()), stream.data(), position.data()};
        const Buffer<double>& la = a.step(tok.data(), where);
        if (tok.empty()) {
          REQUIRE(la.size() == 0);
          continue;
        }
        const Buffer<double>& whole_logits = b.step(tok.data(), where);
        const std::vector<double> lb(whole_logits.begin(), whole_logits.end());
        for (int s = 0; s < B; ++s) require_close(la.data() + size_t(s) * V, lb, size_t(s), V, "step " + std::to_string(t));
      }
      REQUIRE(t == 5);  // every rank stepped as long as data rank 0
    }
}
