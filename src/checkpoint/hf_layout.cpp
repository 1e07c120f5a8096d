// The Hugging Face Mixtral layout (hf_layout.hpp; the table of docs/export.md).
#include "checkpoint/hf_layout.hpp"

#include <cctype>
#include <charconv>
#include <optional>

#include "core/error.hpp"
#include "deck/options.hpp"

namespace meshmoe {

namespace {

// dst [cols, rows] = src [rows, cols]^T, row-major; src rows lie `src_stride` floats apart.
void transpose_into(const float* src, int64_t rows, int64_t cols, int64_t src_stride, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * src_stride + c];
}

SafeTensor transposed(const std::string& name, const std::vector<int64_t>& shape, const float* src, int64_t src_stride) {
  SafeTensor t{name, {shape[1], shape[0]}, std::vector<float>(size_t(shape[0] * shape[1]))};
  transpose_into(src, shape[0], shape[1], src_stride, t.data.data());
  return t;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// "blocks.<i>.<rest>" -> (i, rest); otherwise i = -1.
std::pair<int64_t, std::string> split_block(const std::string& name, const std::string& head) {
  if (name.rfind(head, 0) != 0) return {-1, ""};
  size_t q = head.size();
  while (q < name.size() && std::isdigit(static_cast<unsigned char>(name[q]))) ++q;
  if (q == head.size() || q >= name.size() || name[q] != '.') return {-1, ""};
  return {std::stoll(name.substr(head.size(), q - head.size())), name.substr(q + 1)};
}

// meshmoe's names of one block and the Mixtral names they take (a Linear weight transposed).
struct BlockName {
  const char* meshmoe;
  const char* hf;
  bool transpose;
};
constexpr BlockName kBlockNames[] = {
    {"ln1.gain", "input_layernorm.weight", false},
    {"attn.wq", "self_attn.q_proj.weight", true},
    {"attn.wk", "self_attn.k_proj.weight", true},
    {"attn.wv", "self_attn.v_proj.weight", true},
    {"attn.wo", "self_attn.o_proj.weight", true},
    {"ln2.gain", "post_attention_layernorm.weight", false},
    {"moe.router.wg", "block_sparse_moe.gate.weight", true},
};
struct TopName {
  const char* meshmoe;
  const char* hf;
};
constexpr TopName kTopNames[] = {
    {"embed.wte", "model.embed_tokens.weight"}, {"ln_f.gain", "model.norm.weight"}, {"head.wout", "lm_head.weight"}};

}  // namespace

void check_hf_layout_deck(const Config& cfg, const std::string& what) {
  std::vector<std::string> bad;
  auto need = [&](bool ok, const std::string& key, const std::string& value, const std::string& wanted) {
    if (!ok) bad.push_back(what + ": " + key + " = " + value + ": the Hugging Face Mixtral layout needs " + wanted);
  };
  auto name = [](auto v) { return "\"" + std::string(option_name(v)) + "\""; };
  const auto& m = cfg.model;
  const auto& moe = cfg.moe;
  need(m.arch == ModelArch::Decoder, "model.arch", name(m.arch), "\"decoder\"");
  need(m.norm == NormKind::RmsNorm, "model.norm", name(m.norm), "\"rmsnorm\"");
  need(m.position == PositionKind::Rope, "model.position", name(m.position), "\"rope\"");
  need(m.activation == Activation::Swiglu, "model.activation", name(m.activation), "\"swiglu\" (w1, w3 and w2 of each expert)");
  need(moe.every == 1, "moe.every", std::to_string(moe.every), "1 (every block a sparse MoE block)");
  need(moe.first_dense == 0, "moe.first_dense", std::to_string(moe.first_dense), "0 (no dense block)");
  need(moe.shared_experts == 0, "moe.shared_experts", std::to_string(moe.shared_experts), "0 (no shared expert)");
  need(moe.routed_scale == 1.0, "moe.routed_scale", std::to_string(moe.routed_scale), "1");
  need(moe.balance != BalanceKind::Bias, "moe.balance", name(moe.balance),
       "\"aux_loss\" (the selection bias ranks the experts, and Mixtral's router has none)");
  need(moe.router != RouterKind::ExpertChoice, "moe.router", name(moe.router), "\"top1\", \"top2\" or \"topk\" (tokens choose experts)");
  // Mixtral: softmax over all experts, then the top k renormalised to sum 1. moe.gate = softmax
  // computes the same for top2 and topk (docs/user-guide.md "Routing options"), not for top1.
  const bool renormalised = moe.gate == MoeGate::SoftmaxTopk ||
                            (moe.gate == MoeGate::Softmax && (moe.router == RouterKind::Top2 || moe.router == RouterKind::TopK));
  need(renormalised, "moe.gate", name(moe.gate) + " with moe.router = " + name(moe.router),
       "\"softmax_topk\" (or \"softmax\" with top2 or topk: the chosen probabilities renormalised to sum 1)");
  need(!(moe.router == RouterKind::Top2 && moe.second_expert == SecondExpertPolicy::Threshold), "moe.second_expert",
       name(moe.second_expert), "\"random\" or \"always\" (evaluation dispatches every second choice; the threshold drops some)");
  if (!bad.empty()) throw InputError(bad);
}

std::vector<SafeTensor> to_hf_layout(const std::vector<LogicalTensor>& tensors) {
  std::vector<SafeTensor> out;
  for (const LogicalTensor& t : tensors) {
    bool done = false;
    for (const TopName& n : kTopNames)
      if (t.name == n.meshmoe) out.push_back({n.hf, t.shape, t.data}), done = true;
    const auto [i, rest] = split_block(t.name, "blocks.");
    if (!done && i >= 0) {
      const std::string layer = "model.layers." + std::to_string(i) + ".";
      for (const BlockName& n : kBlockNames) {
        if (rest != n.meshmoe) continue;
        out.push_back(n.transpose ? transposed(layer + n.hf, t.shape, t.data.data(), t.shape[1]) : SafeTensor{layer + n.hf, t.shape, t.data});
        done = true;
      }
      const std::string experts = layer + "block_sparse_moe.experts.";
      if (rest == "moe.experts.w_in" && t.shape.size() == 4 && t.shape[2] == 2) {  // [E, M, 2, He]
        const int64_t E = t.shape[0], M = t.shape[1], He = t.shape[3];
        for (int64_t e = 0; e < E; ++e)
          for (int64_t half = 0; half < 2; ++half)  // [:, 0, :] is W1 (through silu), [:, 1, :] W3
            out.push_back(transposed(experts + std::to_string(e) + (half == 0 ? ".w1.weight" : ".w3.weight"), {M, He},
                                     t.data.data() + e * M * 2 * He + half * He, 2 * He));
        done = true;
      }
      if (rest == "moe.experts.w_out" && t.shape.size() == 3) {  // [E, He, M]
        const int64_t E = t.shape[0], He = t.shape[1], M = t.shape[2];
        for (int64_t e = 0; e < E; ++e)
          out.push_back(transposed(experts + std::to_string(e) + ".w2.weight", {He, M}, t.data.data() + e * He * M, M));
        done = true;
      }
    }
    if (!done) throw Error("export --layout hf: the Hugging Face Mixtral layout has no name for " + t.name + " " + shape_text(t.shape));
  }
  return out;
}

bool is_hf_layout(const SafeTensorsFile& file) {
  for (const SafeTensor& t : file.tensors)
    if (t.name.rfind("model.", 0) == 0 || t.name == "lm_head.weight") return true;
  return false;
}

SafeTensorsFile from_hf_layout(const SafeTensorsFile& file, const std::string& path) {
  SafeTensorsFile out;
  out.metadata = file.metadata;
  struct Expert {
    const SafeTensor *w1 = nullptr, *w2 = nullptr, *w3 = nullptr;
  };
  std::map<int64_t, std::map<int64_t, Expert>> experts;  // layer -> expert -> its three weights
  auto refuse = [&](const std::string& why) { throw InputError("--init-from " + path + " (Hugging Face Mixtral layout): " + why); };
  for (const SafeTensor& t : file.tensors) {
    for (const TopName& n : kTopNames)
      if (t.name == n.hf) out.tensors.push_back({n.meshmoe, t.shape, t.data});
    const auto [i, rest] = split_block(t.name, "model.layers.");
    if (i < 0) continue;
    const std::string block = "blocks." + std::to_string(i) + ".";
    for (const BlockName& n : kBlockNames) {
      if (rest != n.hf) continue;
      if (n.transpose && t.shape.size() != 2) refuse(t.name + " is " + shape_text(t.shape) + ", not a matrix");
      out.tensors.push_back(n.transpose ? transposed(block + n.meshmoe, t.shape, t.data.data(), t.shape[1])
                                        : SafeTensor{block + n.meshmoe, t.shape, t.data});
    }
    const auto [e, w] = split_block(rest, "block_sparse_moe.experts.");
    if (e < 0) continue;
    Expert& x = experts[i][e];
    if (w == "w1.weight") x.w1 = &t;
    if (w == "w2.weight") x.w2 = &t;
    if (w == "w3.weight") x.w3 = &t;
  }
  for (const auto& [i, by_expert] : experts) {
    const std::string layer = "model.layers." + std::to_string(i) + ".block_sparse_moe.experts.";
    const int64_t E = int64_t(by_expert.size());
    if (by_expert.rbegin()->first != E - 1) refuse(layer + "*: the experts are not numbered 0.." + std::to_string(E - 1));
    const Expert& first = by_expert.begin()->second;
    if (!first.w1 || first.w1->shape.size() != 2) refuse(layer + "0.w1.weight is missing or not a matrix");
    const int64_t He = first.w1->shape[0], M = first.w1->shape[1];
    const std::vector<int64_t> in_shape{He, M}, out_shape{M, He};
    for (const auto& [e, x] : by_expert) {
      const std::string name = layer + std::to_string(e);
      struct Check {
        const char* suffix;
        const SafeTensor* t;
        const std::vector<int64_t>& want;
      };
      for (const Check& c : {Check{".w1.weight", x.w1, in_shape}, Check{".w3.weight", x.w3, in_shape}, Check{".w2.weight", x.w2, out_shape}}) {
        if (!c.t) refuse(name + c.suffix + " is missing");
        if (c.t->shape != c.want)
          refuse(name + c.suffix + " is " + shape_text(c.t->shape) + ", expert 0's weights make it " + shape_text(c.want));
      }
    }
    SafeTensor w_in{"blocks." + std::to_string(i) + ".moe.experts.w_in", {E, M, 2, He}, std::vector<float>(size_t(E * M * 2 * He))};
    SafeTensor w_out{"blocks." + std::to_string(i) + ".moe.experts.w_out", {E, He, M}, std::vector<float>(size_t(E * He * M))};
    for (const auto& [e, x] : by_expert) {
      // w1 [He, M] is W1^T: element (h, m) goes to w_in[e, m, 0, h] (a transpose into rows 2 He apart).
      for (int64_t h = 0; h < He; ++h)
        for (int64_t m = 0; m < M; ++m) {
          w_in.data[size_t(((e * M + m) * 2 + 0) * He + h)] = x.w1->data[size_t(h * M + m)];
          w_in.data[size_t(((e * M + m) * 2 + 1) * He + h)] = x.w3->data[size_t(h * M + m)];
        }
      transpose_into(x.w2->data.data(), M, He, He, w_out.data.data() + e * He * M);
    }
    out.tensors.push_back(std::move(w_in));
    out.tensors.push_back(std::move(w_out));
  }
  return out;
}

std::string hf_config_json(const Config& cfg, int64_t vocab, int64_t bos_id, int64_t eos_id, int64_t pad_id) {
  const auto& m = cfg.model;
  const auto& moe = cfg.moe;
  const int64_t k = moe.router == RouterKind::Top1 ? 1 : moe.router == RouterKind::Top2 ? 2 : moe.top_k;
  auto num = [](double v) {  // the shortest text that reads back as v
    char buf[40];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
  };
  auto line = [](const std::string& key, const std::string& value) { return "  \"" + key + "\": " + value; };
  const std::vector<std::string> lines = {
      line("architectures", "[\"MixtralForCausalLM\"]"),
      line("model_type", "\"mixtral\""),
      line("hidden_size", std::to_string(m.d_model)),
      line("intermediate_size", std::to_string(moe.expert_d_ff > 0 ? moe.expert_d_ff : m.d_ff)),
      line("num_hidden_layers", std::to_string(m.num_layers)),
      line("num_attention_heads", std::to_string(m.num_heads)),
      line("num_key_value_heads", std::to_string(kv_heads_of(cfg))),
      line("head_dim", std::to_string(m.d_model / m.num_heads)),
      line("num_local_experts", std::to_string(moe.num_experts)),
      line("num_experts_per_tok", std::to_string(k)),
      line("hidden_act", "\"silu\""),
      line("rms_norm_eps", num(m.layernorm_eps)),
      line("rope_theta", num(m.rope_base)),
      line("vocab_size", std::to_string(vocab)),
      line("max_position_embeddings", std::to_string(m.seq_len)),
      line("tie_word_embeddings", m.tied_embeddings ? "true" : "false"),
      line("sliding_window", "null"),
      line("attention_dropout", "0.0"),
      line("router_aux_loss_coef", num(moe.aux_loss_coef)),
      line("bos_token_id", std::to_string(bos_id)),
      line("eos_token_id", std::to_string(eos_id)),
      line("pad_token_id", std::to_string(pad_id)),
      line("torch_dtype", "\"float32\""),
  };
  std::string out = "{\n";
  for (size_t i = 0; i < lines.size(); ++i) out += lines[i] + (i + 1 < lines.size() ? ",\n" : "\n");
  return out + "}\n";
}

}  // namespace meshmoe
