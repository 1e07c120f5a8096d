#include "model/shape_table.hpp"

#include <algorithm>
#include <limits>

#include "core/error.hpp"
#include "model/layernorm_bodies.hpp"
#include "model/placement.hpp"

namespace meshmoe {

namespace {

// The layers index with int: every width must fit, with room for geglu's doubled input width.
void check_dimension_limits(const Config& cfg) {
  constexpr int64_t kMaxDim = std::numeric_limits<int>::max() / 2;
  for (const auto& [key, v] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"model.seq_len", cfg.model.seq_len},       {"model.d_model", cfg.model.d_model},
           {"model.num_layers", cfg.model.num_layers}, {"model.num_heads", cfg.model.num_heads},
           {"model.d_ff", cfg.model.d_ff},             {"moe.num_experts", cfg.moe.num_experts},
           {"moe.expert_d_ff", cfg.moe.expert_d_ff},   {"moe.group_size", cfg.moe.group_size},
           {"moe.top_k", cfg.moe.top_k},               {"optim.batch_size", cfg.optim.batch_size},
           {"optim.micro_batches", cfg.optim.micro_batches}})
    if (v > kMaxDim)
      throw InputError("the model is too large: " + std::string(key) + " = " + std::to_string(v) + " is above " +
                       std::to_string(kMaxDim) + " (dimensions are 32-bit indices)");
}

}  // namespace

bool plans_bf16_copies(const Config& cfg) {
  return cfg.model.precision == Precision::Bf16 && cfg.run.device == Device::Cuda;
}

ModelShape model_shape(const Config& cfg, int vocab) {
  ModelShape s;
  s.vocab = vocab;
  s.seq_len = int(cfg.model.seq_len);
  s.d_model = int(cfg.model.d_model);
  s.encoder_layers = cfg.model.arch == ModelArch::EncDec ? int(cfg.model.num_layers) : 0;
  s.num_layers = int(cfg.model.num_layers) + s.encoder_layers;
  s.num_heads = int(cfg.model.num_heads);
  s.kv_heads = int(kv_heads_of(cfg));
  s.d_ff = int(cfg.model.d_ff);
  s.moe_every = int(cfg.moe.every);
  s.moe_first_dense = int(std::min<int64_t>(cfg.moe.first_dense, cfg.model.num_layers));
  return s;
}

CheckedShapes::CheckedShapes(const Config& cfg, int vocab, const MeshShape& mesh, bool with_batch)
    : cfg_(&cfg), vocab_(vocab), mesh_(mesh), with_batch_(with_batch) {
  check_dimension_limits(cfg);
  require_rules(shape_rules(cfg, mesh.pipe, mesh.data, mesh.tensor), with_batch);
}

ShapeTable::ShapeTable(const Config& cfg, int vocab, const MeshShape& mesh, RankCoords at, bool with_buffers)
    : ShapeTable(CheckedShapes(cfg, vocab, mesh, with_buffers), placement_at(cfg, mesh, at)) {}

ShapeTable::ShapeTable(const CheckedShapes& checked, const Placement& place)
    : mesh_(checked.mesh()), at_{place.pipe_rank, place.data_rank, place.tensor_rank} {
  const Config& cfg = checked.cfg();
  const int vocab = checked.vocab();
  const MeshShape& mesh = mesh_;
  const RankCoords& at = at_;
  if (MeshShape{place.pipe_size, place.data_size, place.tensor_size} != mesh)
    throw std::logic_error("ShapeTable: a placement on another mesh than " + mesh.str());
  if (at.pipe < 0 || at.pipe >= mesh.pipe || at.data < 0 || at.data >= mesh.data || at.tensor < 0 ||
      at.tensor >= mesh.tensor)
    throw std::logic_error("ShapeTable: rank coordinates outside the mesh " + mesh.str());
  ShapeLetters& s = letters_;
  s.V = vocab, s.T = int(cfg.model.seq_len), s.M = int(cfg.model.d_model), s.H = int(cfg.model.d_ff);
  model_ = model_shape(cfg, vocab);
  s.layers = model_.num_layers, s.encoder_layers = model_.encoder_layers, s.heads = int(cfg.model.num_heads);
  s.stage = at.pipe, s.stages = mesh.pipe;
  s.num_blocks = s.layers / mesh.pipe;
  s.first_block = at.pipe * s.num_blocks;
  s.first_stage = at.pipe == 0, s.last_stage = at.pipe == mesh.pipe - 1;
  // Megatron (docs/ARCHITECTURE.md "The mesh"): tensor rank t holds heads [t heads / n, (t+1) heads / n) and
  // hidden units [t H / n, (t+1) H / n).
  // Grouped-query attention: their key/value heads split alike, or replicated (layer_shapes.hpp).
  s.attn = attention_shape(s.M, s.heads, split_evenly(s.heads, at.tensor, mesh.tensor), model_.kv_heads);
  s.ffn = ffn_shape(s.M, s.H, cfg.model.activation, split_evenly(s.H, at.tensor, mesh.tensor));
  s.moe = model_.num_moe_layers() > 0;
  if (s.moe) {
    s.moe_opt = moe_options(cfg, 0);
    if (place.expert_axis != cfg.moe.expert_axis || place.expert_parallel != expert_parallel(cfg, mesh.data))
      throw std::logic_error("ShapeTable: the placement's experts are not the deck's (build it with placement_at)");
    s.expert_parallel = place.expert_parallel;
    s.experts_over_data = place.expert_axis == ExpertAxis::Data;
    s.experts = place.expert_shape(s.M, s.moe_opt.num_experts, s.moe_opt.d_ff, s.moe_opt.activation);
    s.k = s.moe_opt.k();
    if (s.moe_opt.shared_experts > 0) s.shared = place.shared_shape(s.M, s.moe_opt.shared_hidden(), s.moe_opt.activation);
  }

  // The layers in the order the Transformer registers them (flat layout: embedding, blocks, ln_f, head).
  auto add = [&](std::string prefix, LayerKind kind, int block, std::vector<ParamInfo> params) {
    layers_.push_back(
        {.prefix = std::move(prefix), .kind = kind, .block = block, .params = std::move(params), .buffers = {}});
  };
  const NormKind norm = cfg.model.norm;
  const bool learned_positions = cfg.model.position == PositionKind::Learned;
  add("stage", LayerKind::Stage, -1, {});
  if (s.first_stage)
    add("embed", LayerKind::Embedding, -1, embedding_params("embed", s.V, s.T, s.M, learned_positions));
  // encdec: the encoder's pass through the same embedding (its own saved tokens and positions)
  if (s.encoder_layers > 0) add("embed.encoder", LayerKind::Embedding, -1, {});
  for (int i = s.first_block; i < s.first_block + s.num_blocks; ++i) {
    const std::string b = "blocks." + std::to_string(i);
    if (s.encoder_layers > 0 && i == s.encoder_layers) add("ln_enc", LayerKind::LayerNorm, -1, norm_params("ln_enc", s.M, norm));
    add(b + ".ln1", LayerKind::LayerNorm, i, norm_params(b + ".ln1", s.M, norm));
    add(b + ".attn", LayerKind::Attention, i, attention_params(b + ".attn", s.attn));
    if (model_.has_cross_attention(i)) {
      add(b + ".ln_cross", LayerKind::LayerNorm, i, norm_params(b + ".ln_cross", s.M, norm));
      add(b + ".cross", LayerKind::CrossAttention, i, attention_params(b + ".cross", s.attn));
    }
    add(b + ".ln2", LayerKind::LayerNorm, i, norm_params(b + ".ln2", s.M, norm));
    if (is_moe_block(i)) {
      add(b + ".moe.router", LayerKind::Router, i, router_params(b + ".moe.router", s.M, s.experts.E));
      add(b + ".moe.dispatch", LayerKind::Dispatcher, i, {});
      add(b + ".moe.experts", LayerKind::Experts, i, expert_params(b + ".moe.experts", s.experts));
      if (s.moe_opt.shared_experts > 0)
        add(b + ".moe.shared", LayerKind::SharedExperts, i,
            shared_expert_params(b + ".moe.shared", s.shared, s.moe_opt.d_ff));
    } else {
      add(b + ".mlp", LayerKind::DenseFfn, i, mlp_params(b + ".mlp", s.ffn));
    }
  }
  if (s.last_stage) {
    add("ln_f", LayerKind::LayerNorm, -1, norm_params("ln_f", s.M, norm));
    // Tied embeddings: the head reads embed.wte, on a later stage than the first its own copy of the
    // same logical parameter (the two gradients are summed).
    std::vector<ParamInfo> head;
    if (!cfg.model.tied_embeddings) head = head_params("head", s.V, s.M);
    else if (!s.first_stage) head = {embedding_params("embed", s.V, s.T, s.M, learned_positions)[0]};
    add("head", LayerKind::Head, -1, std::move(head));
  }
  if (checked.with_batch()) add_buffers(cfg, mesh);
}

// What each layer's first training forward and backward allocate for one micro-batch, read off the
// layers' members (the comments in their headers give the same shapes).
void ShapeTable::add_buffers(const Config& cfg, const MeshShape& mesh) {
  ShapeLetters& s = letters_;
  s.B = int(cfg.optim.batch_size / (cfg.optim.micro_batches * mesh.data));
  s.N = s.B * s.T;
  const int64_t B = s.B, T = s.T, N = s.N, M = s.M, V = s.V;
  const int64_t heads_l = s.attn.heads_l, A_l = s.attn.A_l;
  const bool dropout = cfg.model.dropout > 0;
  int64_t E = 0, E_l = 0, He_l = 0, We_l = 0, G = 0, C = 0, k = 0, Et = 0, R = 0;
  if (s.moe) {
    const MoeOptions& o = s.moe_opt;
    s.S = o.group_size, s.G = s.N / s.S, s.C = o.capacity(true);
    E = s.experts.E, E_l = s.experts.E_l, He_l = s.experts.ffn.H_l, We_l = s.experts.ffn.W_l;
    G = s.G, C = s.C, k = s.k;
    // The dispatcher's expert-major buffers hold E' experts: all E on the all-to-all side, E_l where
    // index-select picks its own. Only the filled slots are used, but the buffers keep the room of
    // the full layout (MoeLayer::reserve_full_layout).
    Et = s.experts_over_data ? E : E_l;
    // Expert rows of this rank: E_l experts x (expert_parallel x G groups over data | G) x C slots.
    R = E_l * (s.experts_over_data ? s.expert_parallel : 1) * G * C;
  }
  constexpr size_t f32 = sizeof(float), f64 = sizeof(double), i32 = sizeof(int32_t), i64 = sizeof(int64_t), u8 = 1,
                   u16 = sizeof(uint16_t);
  // The layers' bf16 copies of GEMM operands (tensor/blas.hpp bf16_operand_copies): bf16 GEMMs on a GPU.
  const bool bf16_copies = plans_bf16_copies(cfg);
  using K = BufferKind;
  const bool fused = cfg.model.attention_kernel == AttentionKernel::Fused;  // self-attention without [T, T] buffers
  // The cross-attentions read ln_enc's output copy where ln_enc is this stage's (Transformer::encoder_output16).
  const bool enc_copy_here =
      std::any_of(layers_.begin(), layers_.end(), [](const LayerShapes& l) { return l.prefix == "ln_enc"; });
  for (LayerShapes& l : layers_) {
    auto buf = [&](const char* name, const char* letters, std::vector<int64_t> dims, size_t elem, K kind = K::Saved) {
      l.buffers.push_back(
          {.name = name, .letters = letters, .dims = std::move(dims), .elem_bytes = elem, .kind = kind});
    };
    // A feed-forward (mlp.hpp) of hidden units f.H_l: H_l, W_l in the letters are f's.
    auto ffn_buffers = [&](const FfnShape& f, bool with_dropout, bool partial_dx) {
      const int64_t H_l = f.H_l, W_l = f.W_l;
      buf("x", "[N, M]", {N, M}, f32);
      buf("pre", "[N, W_l]", {N, W_l}, f32);
      buf("h", "[N, H_l]", {N, H_l}, f32);
      if (bf16_copies) buf("h, bf16", "[N, H_l]", {N, H_l}, u16);
      if (with_dropout) buf("dropout keep mask", "[N, M]", {N, M}, u8);
      buf("dy", "[N, M]", {N, M}, f32, K::Scratch);
      buf("dh", "[N, H_l]", {N, H_l}, f32, K::Scratch);
      buf("dpre", "[N, W_l]", {N, W_l}, f32, K::Scratch);
      if (partial_dx) buf("partial dx", "[N, M]", {N, M}, f32, K::Scratch);
      if (bf16_copies) buf("dy, dpre, bf16", "[N, max(M, W_l)]", {N, std::max(M, W_l)}, u16, K::Scratch);
    };
    switch (l.kind) {
      case LayerKind::Stage:  // Transformer x_, h_, f_, segment_, position_ (forward), d_, dh_ (backward)
        buf("x, h, f", "3 x [N, M]", {3, N, M}, f32, K::ForwardOnly);
        buf("segment ids, positions", "2 x [N]", {2, N}, i32, K::ForwardOnly);
        buf("d, dh", "2 x [N, M]", {2, N, M}, f32, K::Scratch);
        if (s.encoder_layers > 0) {  // encdec: the encoder output, its segment ids and positions, its gradient
          buf("encoder output", "[N, M]", {N, M}, f32, K::ForwardOnly);
          buf("encoder tokens, segment ids, positions", "3 x [N]", {3, N}, i32, K::ForwardOnly);
          buf("d encoder output", "[N, M]", {N, M}, f32, K::Scratch);
          // on a pipeline: the stage's message out and the input gradient back (Transformer::stage_streams)
          if (!s.last_stage) buf("stage message", "[2, N, M]", {2, N, M}, f32, K::ForwardOnly);
          if (!s.first_stage) buf("d stage message", "[2, N, M]", {2, N, M}, f32, K::Scratch);
        }
        break;
      case LayerKind::Embedding:
        buf("tokens, positions", "2 x [N]", {2, N}, i32);
        break;
      case LayerKind::LayerNorm:  // rmsnorm: no bias, one table of partials
        buf("xhat", "[N, M]", {N, M}, f32);
        buf("rstd", "[N]", {N}, f32);
        buf("parameter gradient partials", cfg.model.norm == NormKind::RmsNorm ? "[N / 64, M]" : "2 x [N / 64, M]",
            {cfg.model.norm == NormKind::RmsNorm ? 1 : 2,
             (N + LayerNormParamGradPartials<float>::kRows - 1) / LayerNormParamGradPartials<float>::kRows, M},
            f32, K::Scratch);
        // the output's bf16 copy where GEMMs read it (LayerNorm::set_feeds_gemms: every norm but the
        // ln2 before an MoE layer)
        if (bf16_copies && !(l.prefix.ends_with(".ln2") && is_moe_block(l.block)))
          buf("output, bf16", "[N, M]", {N, M}, u16);
        break;
      case LayerKind::Attention:
        buf("x", "[N, M]", {N, M}, f32);
        buf("q, k, v", "3 x [N, A_l]", {3, N, A_l}, f32);
        if (s.attn.grouped()) buf("k, v projections", "2 x [N, KV_l]", {2, N, s.attn.KV_l}, f32, K::ForwardOnly);
        // fused (model/fused_attention.hpp): each row's log-sum-exp instead of the [T, T] probabilities
        if (fused) buf("row log-sum-exp", "[B, heads_l, T]", {B, heads_l, T}, f32);
        if (fused) buf("segment ids", "[N]", {N}, i32);
        else buf("softmax probabilities", "[B, heads_l, T, T]", {B, heads_l, T, T}, f32);
        buf("output before wo", "[N, A_l]", {N, A_l}, f32);
        if (cfg.model.position == PositionKind::Rope) buf("rope positions", "[N]", {N}, i32);
        if (dropout) buf("dropout keep mask", "[N, M]", {N, M}, u8);
        buf("dy", "[N, M]", {N, M}, f32, K::Scratch);
        buf("datt", "[N, A_l]", {N, A_l}, f32, K::Scratch);
        buf("dq, dk, dv", "3 x [N, A_l]", {3, N, A_l}, f32, K::Scratch);
        if (s.attn.grouped()) buf("dk, dv of the key/value heads", "2 x [N, KV_l]", {2, N, s.attn.KV_l}, f32, K::Scratch);
        if (s.attn.grouped() && s.attn.kv_replicated())
          buf("dk, dv summed over tensor", "2 x [N, KV_l]", {2, N, s.attn.KV_l}, f32, K::Scratch);
        if (fused) buf("row dO . O", "[B, heads_l, T]", {B, heads_l, T}, f32, K::Scratch);
        else buf("dP", "[B, heads_l, T, T]", {B, heads_l, T, T}, f32, K::Scratch);
        if (s.attn.sharded()) buf("partial dx", "[N, M]", {N, M}, f32, K::Scratch);
        // the backward's copies of dy, then of dq, dk, dv (x's is ln1's output copy: the forward
        // rounds nothing of its own)
        if (bf16_copies && s.attn.grouped())
          buf("dy | dq, dk, dv, bf16", "[N, max(M, A_l + 2 KV_l)]", {N, std::max(M, A_l + 2 * s.attn.KV_l)}, u16,
              K::Scratch);
        else if (bf16_copies)
          buf("dy | dq, dk, dv, bf16", "[N, max(M, 3 A_l)]", {N, std::max(M, 3 * A_l)}, u16, K::Scratch);
        if (bf16_copies && !fused && l.block >= s.encoder_layers) {  // causal: not the encoder's
          buf("softmax probabilities, bf16", "[B, heads_l, T, T]", {B, heads_l, T, T}, u16);
          buf("dS, bf16", "[B, heads_l, T, T]", {B, heads_l, T, T}, u16, K::Scratch);
        }
        break;
      case LayerKind::CrossAttention:  // encoder sequences of T tokens too: N encoder tokens
        buf("x, encoder output", "2 x [N, M]", {2, N, M}, f32);
        buf("q, k, v", "3 x [N, A_l]", {3, N, A_l}, f32);
        buf("softmax probabilities", "[B, heads_l, T, T]", {B, heads_l, T, T}, f32);
        buf("output before wo", "[N, A_l]", {N, A_l}, f32);
        if (dropout) buf("dropout keep mask", "[N, M]", {N, M}, u8);
        buf("dy", "[N, M]", {N, M}, f32, K::Scratch);
        buf("datt, dq, dk, dv", "4 x [N, A_l]", {4, N, A_l}, f32, K::Scratch);
        buf("dP", "[B, heads_l, T, T]", {B, heads_l, T, T}, f32, K::Scratch);
        if (s.attn.sharded()) buf("partial dx", "[N, M]", {N, M}, f32, K::Scratch);
        // the backward's copies of dy, then of dq, dk, dv; of the encoder output too where ln_enc's
        // output copy is another stage's: then the forward rounds it into the same room, which the
        // backward grows
        if (bf16_copies && enc_copy_here)
          buf("dy | dq, dk, dv, bf16", "[N, max(M, 3 A_l)]", {N, std::max(M, 3 * A_l)}, u16, K::Scratch);
        if (bf16_copies && !enc_copy_here) {
          buf("encoder output, bf16", "[N, M]", {N, M}, u16, K::ForwardOnly);
          buf("dq, dk, dv, bf16", "[N, 3 A_l]", {N, 3 * A_l}, u16, K::Scratch);
        }
        break;
      case LayerKind::DenseFfn:
        ffn_buffers(s.ffn, dropout, s.ffn.sharded());
        break;
      case LayerKind::SharedExperts:  // no dropout; with experts over tensor the dispatcher's dx holds the partial dx
        buf("output", "[N, M]", {N, M}, f32, K::ForwardOnly);
        ffn_buffers(s.shared, false, s.shared.sharded() && s.experts_over_data);
        break;
      case LayerKind::Router: {
        const bool jitter = s.moe_opt.jitter_eps > 0;
        buf("input", "[N, M]", {N, M}, f32);
        if (jitter) buf("jittered input", "[N, M]", {N, M}, f32);
        buf("logits", "[N, E]", {N, E}, f32, K::ForwardOnly);
        buf("probabilities", "[N, E]", {N, E}, f32);
        buf("log-sum-exp", "[N]", {N}, f64);
        buf("top choices", "[N k]", {N * k}, i32);
        buf("norm", "[N]", {N}, f64);
        buf("expert fractions", "[G, E]", {G, E}, f64);
        buf("expert, slot", "2 x [N k]", {2, N * k}, i32);
        buf("gate", "[N k]", {N * k}, f32);
        buf("load", "[E]", {E}, i64);
        if (jitter) buf("dx of the jittered input", "[N, M]", {N, M}, f32, K::Scratch);
        buf("dgate", "[N k]", {N * k}, f32, K::Scratch);
        break;
      }
      case LayerKind::Dispatcher: {
        buf("slot -> token", "[E', G, C]", {Et, G, C}, i32);
        buf("slot -> global token", "[E', G, C]", {Et, G, C}, i64);
        buf("expert buffers in, out", "2 x [E', G, C, M]", {2, Et, G, C, M}, f32);
        // the gather's bf16 copy of the experts' input rows (the experts keep their own): the
        // token side's rows where they are the experts' input, the expert side's after the all-to-all
        const bool all_to_all = s.experts_over_data && s.expert_parallel > 1;
        if (bf16_copies && !all_to_all) buf("expert input, bf16", "[E', G, C, M]", {Et, G, C, M}, u16, K::ForwardOnly);
        if (bf16_copies && all_to_all) buf("expert input, bf16", "[R, M]", {R, M}, u16, K::ForwardOnly);
        if (all_to_all) {
          // all-to-all: the receive buffer [R, M] (the expert-side input and output buffers live
          // only during the forward), the global token of each row, counts and offsets per source
          // and expert
          buf("receive buffer", "[R, M]", {R, M}, f32, K::ForwardOnly);
          buf("row tokens", "[R]", {R}, i64);
          const int64_t P = s.expert_parallel;
          buf("counts and offsets", "[2 expert_parallel + 3 expert_parallel E_l]", {2 * P + 3 * P * E_l}, i64);
          buf("rows per local expert", "[E_l]", {E_l}, i32);
        }
        buf("dout", "[E' G C, M]", {Et * G * C, M}, f32, K::Scratch);
        if (!s.experts_over_data && mesh.tensor > 1) buf("dx", "[N, M]", {N, M}, f32, K::Scratch);
        break;
      }
      case LayerKind::Experts:
        buf("x", "[R, M]", {R, M}, f32);
        buf("pre", "[R, W_l]", {R, We_l}, f32);
        buf("h", "[R, H_l]", {R, He_l}, f32);
        if (bf16_copies) buf("x, h, bf16", "[R, M + H_l]", {R, M + He_l}, u16);
        if (s.moe_opt.expert_dropout > 0) buf("dropout scale", "[R, H_l]", {R, He_l}, f32);
        buf("dxe", "[R, M]", {R, M}, f32, K::Scratch);
        // every local expert's rows at once (a grouped GEMM per role); dh overwrites h
        buf("dpre", "[R, W_l]", {R, We_l}, f32, K::Scratch);
        if (bf16_copies) buf("dy, dpre, bf16", "[R, max(M, W_l)]", {R, std::max(M, We_l)}, u16, K::Scratch);
        break;
      case LayerKind::Head:
        buf("x", "[N, M]", {N, M}, f32);
        buf("logits", "[N, V]", {N, V}, f32);
        // cross-entropy: per-token loss, log-sum-exp and mask, targets
        buf("loss", "[N]", {N}, f64, K::ForwardOnly);
        buf("lse, mask", "2 x [N]", {2, N}, f32);
        buf("targets", "[N]", {N}, i32);
        break;
    }
  }
}

std::vector<ParamInfo> ShapeTable::params() const {
  std::vector<ParamInfo> out;
  Checked flat = 0;
  for (const LayerShapes& l : layers_)
    for (ParamInfo p : l.params) {
      p.flat_offset = size_t(flat.value());
      flat += Checked(p.size);
      out.push_back(std::move(p));
    }
  return out;
}

}  // namespace meshmoe
