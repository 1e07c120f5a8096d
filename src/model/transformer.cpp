#include "model/transformer.hpp"

#include <type_traits>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "model/activation.hpp"
#include "model/moe/moe_options.hpp"
#include "model/shape_table.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/step_scalars.hpp"

namespace meshmoe {

double train_flops_per_token(const Config& cfg, const ModelShape& s) {
  const double M = s.d_model, T = s.seq_len, V = s.vocab;
  const Activation act = cfg.model.activation;
  auto ffn = [&](double H) { return 2.0 * M * activation_in_width(act, int(H)) + 2.0 * H * M; };
  double fwd = 2.0 * M * V;  // output projection
  for (int i = 0; i < s.num_layers; ++i) {
    const double KV = M / s.num_heads * s.kv_heads;  // grouped-query attention's k and v width
    fwd += 4.0 * M * M + 4.0 * M * KV + 4.0 * T * M;  // q, o and k, v projections; scores and weighted sum
    if (s.has_cross_attention(i)) fwd += 8.0 * M * M + 4.0 * T * M;  // the same for the cross-attention
    if (s.is_moe_block(i)) {
      const MoeOptions o = moe_options(cfg, 0);
      // expert choice: E C slots per group of S tokens, E C / S experts per token on average
      const double visits = o.expert_choice() ? double(o.num_experts) * o.capacity(true) / o.group_size : o.k();
      fwd += 2.0 * M * o.num_experts + visits * ffn(o.d_ff) + o.shared_experts * ffn(o.d_ff);  // router, routed, shared
    } else {
      fwd += ffn(s.d_ff);
    }
  }
  return 3.0 * fwd;
}

// The heads and hidden units of this tensor rank come from the shape table (shape_table.hpp).
template <typename T>
Transformer<T>::Block::Block(const Config& cfg, const ShapeTable& table, int i, const Placement& place)
    : ln1(table.letters().M, cfg.model.layernorm_eps, cfg.model.norm),
      ln2(table.letters().M, cfg.model.layernorm_eps, cfg.model.norm),
      attn(table.letters().attn, cfg.model.dropout, uint32_t(16 * i + 1), !table.model().is_encoder_block(i),
           cfg.model.position == PositionKind::Rope ? cfg.model.rope_base : 0.0) {
  attn.set_kernel(cfg.model.attention_kernel);
  // The norms whose outputs GEMMs read keep bf16 copies of them where the layers keep copies
  // (LayerNorm::set_feeds_gemms): ln1 and ln_cross for the attentions' projections, ln2 for a dense
  // feed-forward's w_in (an MoE layer's router reads fp32, its experts the dispatched rows).
  ln1.set_feeds_gemms(true);
  ln2.set_feeds_gemms(!table.is_moe_block(i));
  if (table.model().has_cross_attention(i)) {
    ln_cross = std::make_unique<LayerNorm<T>>(table.letters().M, cfg.model.layernorm_eps, cfg.model.norm);
    ln_cross->set_feeds_gemms(true);
    cross = std::make_unique<CrossAttention<T>>(table.letters().attn, cfg.model.dropout, uint32_t(16 * i + 4));
  }
  if (table.is_moe_block(i)) {
    // Expert placement (model/placement.hpp): experts over data (all-to-all in the expert group,
    // Switch 5.5 hidden split over tensor) or over tensor (Pipeline-MoE index-select + all-reduce).
    moe = std::make_unique<MoeLayer<T>>(moe_options(cfg, uint32_t(16 * i + 3)), place);
  } else
    mlp = std::make_unique<MLP<T>>(table.letters().ffn, cfg.model.dropout, uint32_t(16 * i + 2));
}

template <typename T>
Transformer<T>::Transformer(const Config& cfg, int vocab) : Transformer(cfg, vocab, placement_at(cfg, MeshShape{}, {})) {}

template <typename T>
Transformer<T>::Transformer(const Config& cfg, int vocab, const Placement& placement)
    : Transformer(cfg,
                  ShapeTable(cfg, vocab, MeshShape{placement.pipe_size, placement.data_size, placement.tensor_size},
                             RankCoords{placement.pipe_rank, placement.data_rank, placement.tensor_rank}),
                  placement) {}

template <typename T>
Transformer<T>::Transformer(const Config& cfg, const ShapeTable& table, const Placement& placement)
    : cfg_(cfg),
      shape_(table.model()),
      emb_(table.letters().V, int(cfg.model.seq_len), int(cfg.model.d_model),
           cfg.model.position == PositionKind::Learned),
      emb_enc_(table.letters().V, int(cfg.model.seq_len), int(cfg.model.d_model),
               cfg.model.position == PositionKind::Learned),
      lne_(int(cfg.model.d_model), cfg.model.layernorm_eps, cfg.model.norm),
      lnf_(int(cfg.model.d_model), cfg.model.layernorm_eps, cfg.model.norm),
      head_(table.letters().V, int(cfg.model.d_model)),
      placement_(placement) {
  if (placement_.tensor_size > 1 && !placement_.tensor) throw std::logic_error("Transformer: tensor_size > 1 without a Comm");
  lnf_.set_feeds_gemms(true);  // the head's
  lne_.set_feeds_gemms(true);  // the cross-attentions' key and value projections
  auto tensor_allreduce = [this](T* buf, size_t n) {
    ScopedPhase t(timers_, "tensor_allreduce");
    placement_.tensor->all_reduce(buf, n, Op::Sum);
  };
  const RankCoords& at = table.coords();
  if (table.mesh() != MeshShape{placement_.pipe_size, placement_.data_size, placement_.tensor_size} ||
      at.pipe != placement_.pipe_rank || at.data != placement_.data_rank || at.tensor != placement_.tensor_rank)
    throw std::logic_error("Transformer: the shape table is not the placement's rank's");
  first_block_ = table.letters().first_block;
  if (first_stage()) emb_.declare(params_, "embed");
  std::vector<BlockGrads> block_first_param;  // indices into the parameter table
  size_t ln_enc_first_param = 0;
  for (int i = first_block_; i < first_block_ + table.letters().num_blocks; ++i) {
    if (encdec() && i == shape_.encoder_layers) {
      ln_enc_first_param = params_.infos().size();
      lne_.declare(params_, "ln_enc");
    }
    Block& b = blocks_.emplace_back(cfg, table, i, placement_);
    b.attn.tensor_allreduce = tensor_allreduce;
    if (b.mlp) b.mlp->tensor_allreduce = tensor_allreduce;
    if (b.cross) b.cross->tensor_allreduce = tensor_allreduce;
    const std::string p = "blocks." + std::to_string(i);
    BlockGrads& first = block_first_param.emplace_back();
    first.block = params_.infos().size();
    b.ln1.declare(params_, p + ".ln1");
    first.attn = params_.infos().size();
    b.attn.declare(params_, p + ".attn");
    first.cross = params_.infos().size();
    if (b.cross) {
      b.ln_cross->declare(params_, p + ".ln_cross");
      first.cross = params_.infos().size();
      b.cross->declare(params_, p + ".cross");
    }
    b.ln2.declare(params_, p + ".ln2");
    first.ffn = params_.infos().size();
    if (b.moe)
      b.moe->declare(params_, p + ".moe");
    else
      b.mlp->declare(params_, p + ".mlp");
  }
  const size_t tail_first_param = params_.infos().size();
  if (last_stage()) {
    lnf_.declare(params_, "ln_f");
    ParamView<T>* tied = nullptr;
    if (cfg.model.tied_embeddings && first_stage()) tied = &emb_.wte;
    if (cfg.model.tied_embeddings && !first_stage()) {
      // The same logical parameter (and so the same initial values) as the first stage's.
      params_.add(embedding_params("embed", shape_.vocab, shape_.seq_len, shape_.d_model,
                                   cfg.model.position == PositionKind::Learned)[0],
                  &wte_copy_);
      tied = &wte_copy_;
    }
    head_.declare(params_, "head", tied);
  }
  check_registered(table);
  params_.allocate(placement.data, placement.one_weight_copy);
  auto flat_begin = [&](size_t param) {
    return param < params_.infos().size() ? params_.infos()[param].flat_offset : params_.size();
  };
  for (const BlockGrads& p : block_first_param)
    block_grads_.push_back({flat_begin(p.block), flat_begin(p.attn), flat_begin(p.cross), flat_begin(p.ffn)});
  tail_grads_begin_ = flat_begin(tail_first_param);
  if (encdec()) {
    ln_enc_grads_begin_ = flat_begin(ln_enc_first_param);
    emb_enc_.wte = emb_.wte;  // the same weights and gradients: one embedding, two passes
    emb_enc_.wpe = emb_.wpe;
  }
}

// The layers registered what the shape table lists (the memory plan and the GPU arena read it).
template <typename T>
void Transformer<T>::check_registered(const ShapeTable& table) const {
  const std::vector<ParamInfo> want = table.params();
  const std::vector<ParamInfo>& got = params_.infos();
  bool same = want.size() == got.size();
  for (size_t i = 0; same && i < got.size(); ++i) {
    const ParamInfo &a = got[i], &b = want[i];
    same = a.name == b.name && a.logical_shape == b.logical_shape && a.local_shape == b.local_shape &&
           a.offset == b.offset && a.init == b.init && a.fan_in == b.fan_in && a.sharded_over == b.sharded_over &&
           a.flat_offset == b.flat_offset && a.size == b.size && a.no_weight_decay == b.no_weight_decay;
    if (!same) throw std::logic_error("Transformer: parameter " + a.name + " differs from the shape table's " + b.name);
  }
  if (!same) throw std::logic_error("Transformer: the layers registered another number of parameters than the shape table lists");
}

template <typename T>
void Transformer<T>::init(uint64_t seed, double init_scale) {
  params_.init(seed, init_scale);
}

template <typename T>
std::vector<const MoeLayer<T>*> Transformer<T>::moe_layers() const {
  std::vector<const MoeLayer<T>*> out;
  for (const Block& b : blocks_)
    if (b.moe) out.push_back(b.moe.get());
  return out;
}

template <typename T>
void Transformer<T>::forward_blocks(const StepContext& ctx, size_t begin, size_t end, ForwardStats& st,
                                    const CheckFinite& check_finite) {
  const size_t NM = size_t(N_) * shape_.d_model;
  for (size_t k = begin; k < end; ++k) {
    Block& b = blocks_[k];
    b.ln1.forward(ctx, x_.data(), h_.data(), N_);
    {
      ScopedPhase t(ctx.timers, "attention");
      b.attn.forward(ctx, h_.data(), f_.data(), N_, seq_len_, b.ln1.output16());
    }
    add_into(x_.data(), f_.data(), NM);
    if (b.cross) {
      b.ln_cross->forward(ctx, x_.data(), h_.data(), N_);
      ScopedPhase t(ctx.timers, "attention");
      b.cross->forward(ctx, h_.data(), seq_len_, enc_out_.data(), seq_len_, enc_segment_.data(), f_.data(), N_,
                       b.ln_cross->output16(), encoder_output16());
      add_into(x_.data(), f_.data(), NM);
    }
    b.ln2.forward(ctx, x_.data(), h_.data(), N_);
    if (b.moe) {
      b.moe->forward(ctx, h_.data(), f_.data(), N_);
      // The layer's loss terms are its router's totals, on the host from the read of the step's
      // scalars on (tensor/step_scalars.hpp): added there, in order.
      step_scalars().then([&st, moe = b.moe.get()] {
        st.aux_sum += moe->stats().aux_sum;
        st.z_sum += moe->stats().z_sum;
      });
    } else {
      ScopedPhase t(ctx.timers, "dense_ffn");
      b.mlp->forward(ctx, h_.data(), f_.data(), N_, b.ln2.output16());
    }
    add_into(x_.data(), f_.data(), NM);
    check_finite(x_, NM, "blocks." + std::to_string(first_block_ + int(k)));
  }
}

template <typename T>
void Transformer<T>::run_forward(const StepContext& step_ctx, const MicroBatch& mb, const LossWeights& w,
                                     const T* x_in) {
  seq_len_ = mb.seq_len;
  N_ = mb.rows * mb.seq_len;
  timers_ = step_ctx.timers;
  const int M = shape_.d_model, V = shape_.vocab;
  if (seq_len_ > shape_.seq_len) throw Error("micro-batch sequence length exceeds model.seq_len");
  // The layers see the packed examples through the context (docs/ARCHITECTURE.md "Packed sequences").
  StepContext ctx = step_ctx;
  if (mb.segment && mb.position) {
    upload(segment_, mb.segment, size_t(N_));  // transfer points: the micro-batch's packing
    upload(position_, mb.position, size_t(N_));
    ctx.segment = segment_.data();
    ctx.position = position_.data();
  }
  const size_t NM = size_t(N_) * M;
  x_.resize(NM);
  h_.resize(NM);
  f_.resize(NM);
  first_nonfinite_.clear();
  finite_resolved_ = false;
  finite_scans_used_ = 0;
  CheckFinite check_finite = [&](const Buffer<T>& v, size_t n, const std::string& where) {
    if (finite_scans_used_ == finite_scans_.size()) finite_scans_.emplace_back();
    FiniteScan& scan = finite_scans_[finite_scans_used_++];
    scan.where = where;
    flag_nonfinite(v.data(), n, scan.flags);
  };
  ForwardStats& st = stats_;  // filled at the read of the step's scalars (forward)
  size_t decoder_begin = 0;  // the first decoder block in blocks_
  if (encdec()) {
    if (mb.enc_len != seq_len_ || !mb.enc_inputs || !mb.enc_segment || !mb.enc_position || !mb.segment)
      throw Error("Transformer: model.arch = encdec needs the encoder's tokens, segment ids and positions (enc_len = seq_len)");
    upload(enc_segment_, mb.enc_segment, size_t(N_));  // transfer points: the encoder's packing
    upload(enc_position_, mb.enc_position, size_t(N_));
    encoder_stage(ctx, x_in, mb.enc_inputs, mb.enc_position, st, check_finite);
    decoder_begin = decoder_begin_local();
    if (!last_stage()) message_.resize(2 * NM);
    if (!last_stage() && !encoder_output_here()) copy_from(message_.data(), x_.data(), NM);  // still a residual
  }

  if (first_stage()) {
    StepContext emb_ctx = ctx;  // the embedding reads the micro-batch's tokens and positions on the host
    emb_ctx.position = mb.segment && mb.position ? mb.position : nullptr;
    emb_.forward(emb_ctx, mb.inputs, x_.data(), N_, seq_len_);
  } else {
    copy_from(x_.data(), x_in + (encdec() ? NM : 0), NM);
  }
  poison_if_asked();
  check_finite(x_, NM, first_stage() ? "embed" : "stage input");
  forward_blocks(ctx, decoder_begin, blocks_.size(), st, check_finite);
  if (!last_stage()) {
    if (encdec()) {  // the message to the next stage: [encoder stream, decoder stream]
      if (encoder_output_here()) copy_from(message_.data(), enc_out_.data(), NM);
      copy_from(message_.data() + NM, x_.data(), NM);
    }
    return;
  }
  lnf_.forward(ctx, x_.data(), h_.data(), N_);
  ScopedPhase t(ctx.timers, "head_loss");
  logits_.resize(size_t(N_) * V);
  head_.forward(ctx, h_.data(), logits_.data(), N_, lnf_.output16());
  check_finite(logits_, logits_.size(), "head");
  // The targets, the mask and the soft targets are host memory: CrossEntropy uploads them.
  const T *mask = nullptr, *soft = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    mask = mb.mask;
    soft = mb.soft_targets;
  } else {
    if (mb.mask) {
      mask_.assign(mb.mask, mb.mask + N_);
      mask = mask_.data();
    }
    if (mb.soft_targets) {
      soft_.assign(mb.soft_targets, mb.soft_targets + logits_.size());
      soft = soft_.data();
    }
  }
  // In training on the CPU, backward's dlogits are written over the logits in the loss's pass
  // over each row (CrossEntropy::forward_with_gradient); on the GPU a row is one thread, and the
  // element-wise backward suits it better.
  if (loss_gradient_in_forward_ && ctx.training && current_device() == Device::Cpu)
    ce_.forward_with_gradient(ctx, logits_.data(), mb.targets, mask, N_, V, w.ce, soft, w.distill_alpha);
  else
    ce_.forward(ctx, logits_.data(), mb.targets, mask, N_, V, w.ce, soft, w.distill_alpha);
  step_scalars().then([this] {
    for (double l : ce_.per_token_loss()) stats_.ce_sum += l;
    for (double l : ce_.per_token_soft_loss()) stats_.soft_sum += l;
    stats_.mask_sum = ce_.count();
  });
}

template <typename T>
void Transformer<T>::forward(const StepContext& ctx, const MicroBatch& mb, const LossWeights& w, const T* x_in,
                             std::function<void(const ForwardStats&)> done) {
  step_scalars().then([this] { stats_ = {}; });
  run_forward(ctx, mb, w, x_in);
  if (step_scalars().collecting()) resolve_finite_at_read();
  if (done) step_scalars().then([this, done = std::move(done)] { done(stats_); });
}

template <typename T>
ForwardStats Transformer<T>::forward(const StepContext& ctx, const MicroBatch& mb, const LossWeights& w, const T* x_in) {
  ForwardStats out;
  std::function<void(const ForwardStats&)> keep;
  if (!step_scalars().collecting()) keep = [&out](const ForwardStats& f) { out = f; };
  forward(ctx, mb, w, x_in, std::move(keep));
  return out;
}

// While the step's scalars are collected: every scan's flags into their read, where the first
// non-finite scan is found as first_nonfinite() finds it.
template <typename T>
void Transformer<T>::resolve_finite_at_read() {
  step_scalars().then([this] { first_nonfinite_.clear(); });
  for (size_t i = 0; i < finite_scans_used_; ++i) {
    const FiniteScan& scan = finite_scans_[i];
    step_scalars().defer(scan.flags.data(), scan.flags.size() * sizeof(int32_t),
                         [this, where = scan.where, n = scan.flags.size()](const void* host) {
                           const int32_t* flags = static_cast<const int32_t*>(host);
                           if (first_nonfinite_.empty() && std::find(flags, flags + n, 1) != flags + n)
                             first_nonfinite_ = where;
                         });
  }
  step_scalars().then([this] { finite_resolved_ = true; });
}

template <typename T>
const std::string& Transformer<T>::first_nonfinite() const {
  if (!finite_resolved_) {
    // A transfer point: the host reads the scans' flags, gathered first into one Buffer (on a
    // device by queued copies), so that the host waits once a forward, not once a scan.
    std::vector<ptrdiff_t> first(finite_scans_used_ + 1, 0);
    for (size_t i = 0; i < finite_scans_used_; ++i) first[i + 1] = first[i] + ptrdiff_t(finite_scans_[i].flags.size());
    Buffer<int32_t> all;
    all.resize_to_overwrite(size_t(first.back()));
    for (size_t i = 0; i < finite_scans_used_; ++i)
      copy_buffer_bytes(all.data() + first[i], finite_scans_[i].flags.data(), finite_scans_[i].flags.size() * sizeof(int32_t));
    std::vector<int32_t> host;
    const std::span<const int32_t> flags = host_view(all, host);
    for (size_t i = 0; i < finite_scans_used_ && first_nonfinite_.empty(); ++i)
      if (std::find(flags.begin() + first[i], flags.begin() + first[i + 1], 1) != flags.begin() + first[i + 1])
        first_nonfinite_ = finite_scans_[i].where;
    finite_resolved_ = true;
  }
  return first_nonfinite_;
}

template <typename T>
void Transformer<T>::poison_if_asked() {  // debug.nan_step: the first activation
  if (!inject_nan_) return;
  fill_with(x_.data(), 1, std::numeric_limits<T>::quiet_NaN());  // on the device: no host access to x_
  inject_nan_ = false;
}

// The encoder's part of this stage (docs/ARCHITECTURE.md "Encoder-decoder"): its tokens embedded
// (first stage) or the encoder stream received (x_in's first half), its blocks here, ln_enc (the
// stage of the first decoder block). After it, x_ holds the encoder residual (a stage that ends
// inside the encoder) and enc_out_ the encoder output (a stage with decoder blocks).
template <typename T>
void Transformer<T>::encoder_stage(const StepContext& ctx, const T* x_in, const int32_t* host_tokens,
                                   const int32_t* host_position, ForwardStats& st, const CheckFinite& check_finite) {
  const size_t NM = size_t(N_) * shape_.d_model;
  enc_out_.resize(NM);
  if (!first_stage() && !encoder_residual_in()) {  // the encoder output, as a later stage received it
    copy_from(enc_out_.data(), x_in, NM);
    return;
  }
  StepContext enc_ctx = ctx;
  enc_ctx.segment = enc_segment_.data();
  enc_ctx.position = enc_position_.data();
  if (first_stage()) {
    StepContext emb_ctx = enc_ctx;  // the host's tokens and positions (Embedding::forward)
    emb_ctx.position = host_position;
    emb_enc_.forward(emb_ctx, host_tokens, x_.data(), N_, seq_len_);
    poison_if_asked();
    check_finite(x_, NM, "embed.encoder");
  } else {
    copy_from(x_.data(), x_in, NM);
  }
  forward_blocks(enc_ctx, 0, decoder_begin_local(), st, check_finite);
  if (has_ln_enc()) lne_.forward(enc_ctx, x_.data(), enc_out_.data(), N_);
}

template <typename T>
void Transformer<T>::encode(const StepContext& ctx, int rows, int len, const int32_t* tokens, const int32_t* segment,
                            const int32_t* position, const T* x_in) {
  if (!encdec()) throw std::logic_error("Transformer::encode: the model has no encoder");
  if (!first_stage() && !x_in) throw std::logic_error("Transformer::encode: a later stage needs the previous stage's stream");
  seq_len_ = len;
  N_ = rows * len;
  timers_ = ctx.timers;
  const size_t NM = size_t(N_) * shape_.d_model;
  x_.resize(NM);
  h_.resize(NM);
  f_.resize(NM);
  upload(enc_segment_, segment, size_t(N_));  // transfer points: the encoder's packing
  upload(enc_position_, position, size_t(N_));
  encoder_stage(ctx, x_in, tokens, position, stats_, [](const Buffer<T>&, size_t, const std::string&) {});
}

template <typename T>
void Transformer<T>::backward(const StepContext& ctx, const LossWeights& w, const T* d_out) {
  const size_t NM = size_t(N_) * shape_.d_model;
  timers_ = ctx.timers;
  dh_.resize(NM);
  d_.resize(NM);
  fill_with(dh_.data(), NM, T(0));
  if (last_stage()) {
    fill_with(d_.data(), NM, T(0));
    {
      ScopedPhase t(ctx.timers, "head_loss");
      ce_.backward(ctx, logits_.data(), logits_.data(), N_);  // logits_ now holds dlogits
      head_.backward(ctx, logits_.data(), dh_.data(), N_, lnf_.output16());
    }
    lnf_.backward(ctx, dh_.data(), d_.data(), N_);
  } else {
    copy_from(d_.data(), d_out + (encdec() ? NM : 0), NM);
  }
  if (grads_final_from && tail_grads_begin_ > 0) grads_final_from(tail_grads_begin_);
  if (!encdec()) {
    backward_blocks(ctx, w, 0, blocks_.size());
    if (first_stage()) emb_.backward(ctx, d_.data(), N_);
  } else {
    // The decoder also leaves the gradient of the encoder output (denc_: the later stages' part
    // arrives in d_out's first half), which then runs back through ln_enc and the encoder; embed's
    // gradients get both passes. The message to the previous stage: [d encoder stream, d decoder stream].
    const size_t decoder_begin = decoder_begin_local();
    denc_.resize(NM);
    if (last_stage() || encoder_residual_out())
      fill_with(denc_.data(), NM, T(0));
    else
      copy_from(denc_.data(), d_out, NM);
    backward_blocks(ctx, w, decoder_begin, blocks_.size());
    if (first_stage()) emb_.backward(ctx, d_.data(), N_);
    if (!first_stage()) {
      dmessage_.resize(2 * NM);
      copy_from(dmessage_.data() + NM, d_.data(), NM);
    }
    if (!first_stage() && !encoder_residual_in()) {  // no encoder part here: pass d(encoder output) on
      copy_from(dmessage_.data(), denc_.data(), NM);
    } else {
      StepContext enc_ctx = ctx;
      enc_ctx.segment = enc_segment_.data();
      enc_ctx.position = enc_position_.data();
      if (has_ln_enc()) {
        fill_with(d_.data(), NM, T(0));
        lne_.backward(enc_ctx, denc_.data(), d_.data(), N_);
        if (grads_final_from) grads_final_from(ln_enc_grads_begin_);
      } else {
        copy_from(d_.data(), d_out, NM);  // d encoder residual from the next stage
      }
      backward_blocks(enc_ctx, w, 0, decoder_begin);
      if (first_stage())
        emb_enc_.backward(enc_ctx, d_.data(), N_);
      else
        copy_from(dmessage_.data(), d_.data(), NM);
    }
  }
  if (grads_final_from) grads_final_from(0);
}

template <typename T>
void Transformer<T>::backward_blocks(const StepContext& ctx, const LossWeights& w, size_t begin, size_t end) {
  const size_t NM = size_t(N_) * shape_.d_model;
  auto final_from = [&](size_t offset) {
    if (grads_final_from && offset > 0) grads_final_from(offset);  // 0 once, at the end of backward
  };
  for (size_t block = end; block-- > begin;) {
    Block& b = blocks_[block];
    fill_with(dh_.data(), NM, T(0));
    if (b.moe) {
      b.moe->backward(ctx, d_.data(), dh_.data(), N_, w.aux, w.z);
    } else {
      ScopedPhase t(ctx.timers, "dense_ffn");
      b.mlp->backward(ctx, d_.data(), dh_.data(), N_, b.ln2.output16());
    }
    final_from(block_grads_[block].ffn);
    b.ln2.backward(ctx, dh_.data(), d_.data(), N_);  // d_ = residual grad + ln2 path
    if (b.cross) {
      fill_with(dh_.data(), NM, T(0));
      {
        ScopedPhase t(ctx.timers, "attention");
        b.cross->backward(ctx, d_.data(), dh_.data(), denc_.data(), N_, b.ln_cross->output16(), encoder_output16());
      }
      final_from(block_grads_[block].cross);
      b.ln_cross->backward(ctx, dh_.data(), d_.data(), N_);
    }
    fill_with(dh_.data(), NM, T(0));
    {
      ScopedPhase t(ctx.timers, "attention");
      b.attn.backward(ctx, d_.data(), dh_.data(), N_, b.ln1.output16());
    }
    final_from(block_grads_[block].attn);
    b.ln1.backward(ctx, dh_.data(), d_.data(), N_);
    final_from(block_grads_[block].block);
  }
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace meshmoe
