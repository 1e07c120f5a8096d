// The Hugging Face Mixtral layout (src/checkpoint/hf_layout.hpp) against element-by-element
// oracles: a Linear weight is meshmoe's operand transposed (q_proj[j, m] = wq[m, j]), an expert's
// w1[h, m] = w_in[e, m, 0, h], w3[h, m] = w_in[e, m, 1, h], w2[m, h] = w_out[e, h, m]; the inverse
// gives back every tensor bitwise; the deck checks name every key the layout cannot hold; a file
// with a missing or misshapen expert is refused naming it.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "checkpoint/hf_layout.hpp"
#include "core/error.hpp"

using namespace meshmoe;

namespace {

LogicalTensor counting(const std::string& name, std::vector<int64_t> shape, float base) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  LogicalTensor t{name, std::move(shape), std::vector<float>(size_t(n))};
  for (int64_t i = 0; i < n; ++i) t.data[size_t(i)] = base + 0.001f * float(i);  // every element distinct
  return t;
}

// A Mixtral-shaped model of 2 layers: M 4, heads x D 4, E 3, He 5, V 7, untied.
std::vector<LogicalTensor> tiny_model() {
  const int64_t M = 4, E = 3, He = 5, V = 7;
  std::vector<LogicalTensor> out = {counting("embed.wte", {V, M}, 1)};
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    const float base = 10.0f * float(i + 1);
    out.push_back(counting(b + "ln1.gain", {M}, base + 1));
    for (const char* w : {"attn.wq", "attn.wk", "attn.wv", "attn.wo"}) out.push_back(counting(b + w, {M, M}, base + 2));
    out.push_back(counting(b + "ln2.gain", {M}, base + 3));
    out.push_back(counting(b + "moe.router.wg", {M, E}, base + 4));
    out.push_back(counting(b + "moe.experts.w_in", {E, M, 2, He}, base + 5));
    out.push_back(counting(b + "moe.experts.w_out", {E, He, M}, base + 6));
  }
  out.push_back(counting("ln_f.gain", {M}, 2));
  out.push_back(counting("head.wout", {V, M}, 3));
  return out;
}

std::map<std::string, const SafeTensor*> by_name(const std::vector<SafeTensor>& ts) {
  std::map<std::string, const SafeTensor*> m;
  for (const SafeTensor& t : ts) m[t.name] = &t;
  return m;
}

}  // namespace

TEST_CASE("hf layout: names, shapes and elements of the Mixtral tensors; the inverse is bitwise", "[hf_layout]") {
  const std::vector<LogicalTensor> model = tiny_model();
  std::map<std::string, const LogicalTensor*> src;
  for (const LogicalTensor& t : model) src[t.name] = &t;
  const std::vector<SafeTensor> hf = to_hf_layout(model);
  const auto out = by_name(hf);
  REQUIRE(hf.size() == 1 + 2 * (7 + 3 * 3) + 2);
  REQUIRE(out.at("model.embed_tokens.weight")->data == src.at("embed.wte")->data);
  REQUIRE(out.at("lm_head.weight")->data == src.at("head.wout")->data);
  REQUIRE(out.at("model.norm.weight")->data == src.at("ln_f.gain")->data);
  REQUIRE(out.at("model.layers.1.input_layernorm.weight")->data == src.at("blocks.1.ln1.gain")->data);
  REQUIRE(out.at("model.layers.1.post_attention_layernorm.weight")->data == src.at("blocks.1.ln2.gain")->data);
  const int64_t M = 4, E = 3, He = 5;
  for (const auto& [hf_name, mm] : std::map<std::string, std::string>{{"q_proj", "wq"}, {"k_proj", "wk"}, {"v_proj", "wv"}, {"o_proj", "wo"}}) {
    const SafeTensor& t = *out.at("model.layers.1.self_attn." + hf_name + ".weight");
    const LogicalTensor& s = *src.at("blocks.1.attn." + mm);
    REQUIRE(t.shape == std::vector<int64_t>{M, M});
    for (int64_t j = 0; j < M; ++j)
      for (int64_t m = 0; m < M; ++m) REQUIRE(t.data[size_t(j * M + m)] == s.data[size_t(m * M + j)]);
  }
  const SafeTensor& gate = *out.at("model.layers.0.block_sparse_moe.gate.weight");
  REQUIRE(gate.shape == std::vector<int64_t>{E, M});
  for (int64_t e = 0; e < E; ++e)
    for (int64_t m = 0; m < M; ++m) REQUIRE(gate.data[size_t(e * M + m)] == src.at("blocks.0.moe.router.wg")->data[size_t(m * E + e)]);
  const LogicalTensor& w_in = *src.at("blocks.1.moe.experts.w_in");
  const LogicalTensor& w_out = *src.at("blocks.1.moe.experts.w_out");
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "model.layers.1.block_sparse_moe.experts." + std::to_string(e) + ".";
    const SafeTensor &w1 = *out.at(p + "w1.weight"), &w3 = *out.at(p + "w3.weight"), &w2 = *out.at(p + "w2.weight");
    REQUIRE(w1.shape == std::vector<int64_t>{He, M});
    REQUIRE(w3.shape == std::vector<int64_t>{He, M});
    REQUIRE(w2.shape == std::vector<int64_t>{M, He});
    for (int64_t h = 0; h < He; ++h)
      for (int64_t m = 0; m < M; ++m) {
        REQUIRE(w1.data[size_t(h * M + m)] == w_in.data[size_t(((e * M + m) * 2 + 0) * He + h)]);
        REQUIRE(w3.data[size_t(h * M + m)] == w_in.data[size_t(((e * M + m) * 2 + 1) * He + h)]);
        REQUIRE(w2.data[size_t(m * He + h)] == w_out.data[size_t((e * He + h) * M + m)]);
      }
  }
  SafeTensorsFile file;
  file.tensors = hf;
  REQUIRE(is_hf_layout(file));
  const SafeTensorsFile back = from_hf_layout(file, "x.safetensors");
  REQUIRE(back.tensors.size() == model.size());
  for (const SafeTensor& t : back.tensors) {
    INFO(t.name);
    REQUIRE(src.count(t.name) == 1);
    REQUIRE(t.shape == src.at(t.name)->shape);
    REQUIRE(t.data == src.at(t.name)->data);
  }
  SafeTensorsFile meshmoe_names;
  meshmoe_names.tensors.push_back({"embed.wte", {1}, {1.0f}});
  REQUIRE_FALSE(is_hf_layout(meshmoe_names));
}

TEST_CASE("hf layout: a tensor it has no name for, a missing or misshapen expert", "[hf_layout]") {
  std::vector<LogicalTensor> model = tiny_model();
  model.push_back(counting("blocks.0.ln1.bias", {4}, 0));
  REQUIRE_THROWS_WITH(to_hf_layout(model), Catch::Contains("no name for blocks.0.ln1.bias [4]"));
  model.pop_back();
  SafeTensorsFile file;
  file.tensors = to_hf_layout(model);
  auto drop = [](SafeTensorsFile f, const std::string& name) {
    std::erase_if(f.tensors, [&](const SafeTensor& t) { return t.name == name; });
    return f;
  };
  REQUIRE_THROWS_WITH(from_hf_layout(drop(file, "model.layers.0.block_sparse_moe.experts.1.w3.weight"), "f.st"),
                      Catch::Contains("f.st") && Catch::Contains("experts.1.w3.weight is missing"));
  SafeTensorsFile gap = file;
  for (const char* w : {"w1", "w2", "w3"}) gap = drop(gap, std::string("model.layers.1.block_sparse_moe.experts.1.") + w + ".weight");
  REQUIRE_THROWS_WITH(from_hf_layout(gap, "f.st"), Catch::Contains("not numbered 0..1"));
  for (SafeTensor& t : file.tensors)
    if (t.name == "model.layers.0.block_sparse_moe.experts.2.w2.weight") t.shape = {5, 4};
  REQUIRE_THROWS_WITH(from_hf_layout(file, "f.st"), Catch::Contains("experts.2.w2.weight is [5, 4], expert 0's weights make it [4, 5]"));
}

TEST_CASE("hf layout: the deck checks name every key the layout cannot hold", "[hf_layout]") {
  Config cfg;
  cfg.model.norm = NormKind::RmsNorm;
  cfg.model.position = PositionKind::Rope;
  cfg.model.activation = Activation::Swiglu;
  cfg.moe.every = 1;
  cfg.moe.gate = MoeGate::SoftmaxTopk;
  REQUIRE_NOTHROW(check_hf_layout_deck(cfg, "t"));
  cfg.moe.gate = MoeGate::Softmax;  // top2 (the default): the same gates
  REQUIRE_NOTHROW(check_hf_layout_deck(cfg, "t"));
  cfg.moe.router = RouterKind::Top1;  // softmax top1 gates with p, not 1
  REQUIRE_THROWS_WITH(check_hf_layout_deck(cfg, "t"), Catch::Contains("moe.gate = \"softmax\" with moe.router = \"top1\""));
  cfg.moe.gate = MoeGate::SoftmaxTopk;
  REQUIRE_NOTHROW(check_hf_layout_deck(cfg, "t"));
  Config old;  // the defaults: the GShard era
  try {
    check_hf_layout_deck(old, "export --layout hf: c.h5");
    FAIL("no refusal");
  } catch (const InputError& e) {
    const auto& m = e.messages();
    REQUIRE(m.size() == 4);
    REQUIRE(m[0] == "export --layout hf: c.h5: model.norm = \"layernorm\": the Hugging Face Mixtral layout needs \"rmsnorm\"");
    REQUIRE_THAT(m[1], Catch::Contains("model.position = \"learned\""));
    REQUIRE_THAT(m[2], Catch::Contains("model.activation = \"relu\""));
    REQUIRE_THAT(m[3], Catch::Contains("moe.every = 2"));
  }
  for (auto set : std::vector<void (*)(Config&)>{
           [](Config& c) { c.model.arch = ModelArch::EncDec; }, [](Config& c) { c.moe.first_dense = 1; },
           [](Config& c) { c.moe.shared_experts = 1; }, [](Config& c) { c.moe.routed_scale = 2.5; },
           [](Config& c) { c.moe.balance = BalanceKind::Bias; }, [](Config& c) { c.moe.router = RouterKind::ExpertChoice; },
           [](Config& c) { c.moe.gate = MoeGate::Sigmoid; },
           [](Config& c) { c.moe.router = RouterKind::Top2, c.moe.second_expert = SecondExpertPolicy::Threshold; }}) {
    Config c = cfg;
    set(c);
    REQUIRE_THROWS_AS(check_hf_layout_deck(c, "t"), InputError);
  }
}

TEST_CASE("hf layout: config.json holds MixtralConfig's keys", "[hf_layout]") {
  Config cfg;
  cfg.model.d_model = 64;
  cfg.model.num_heads = 4;
  cfg.model.num_layers = 3;
  cfg.model.seq_len = 32;
  cfg.model.rope_base = 1e6;
  cfg.model.tied_embeddings = false;
  cfg.moe.num_experts = 8;
  cfg.moe.router = RouterKind::TopK;
  cfg.moe.top_k = 2;
  cfg.moe.expert_d_ff = 96;
  const std::string j = hf_config_json(cfg, 300, 257, 258, 256);
  for (const char* kv : {"\"hidden_size\": 64,", "\"intermediate_size\": 96,", "\"num_hidden_layers\": 3,",
                         "\"num_attention_heads\": 4,", "\"num_key_value_heads\": 4,", "\"head_dim\": 16,",
                         "\"num_local_experts\": 8,", "\"num_experts_per_tok\": 2,", "\"rope_theta\": 1e+06,",
                         "\"vocab_size\": 300,", "\"max_position_embeddings\": 32,", "\"tie_word_embeddings\": false,",
                         "\"rms_norm_eps\": 1e-05,", "\"model_type\": \"mixtral\","}) {
    INFO(kv);
    REQUIRE_THAT(j, Catch::Contains(kv));
  }
}
