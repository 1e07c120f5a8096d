// The decoder-only MoE Transformer: token + position embedding, pre-LayerNorm blocks of causal
// self-attention and a feed-forward that is dense or MoE (every moe.every-th block, as GShard and
// Switch, after the first moe.first_dense blocks), final LayerNorm, output projection (tied or
// untied) and the masked cross-entropy. model.norm = rmsnorm makes every norm an RMSNorm;
// model.position = rope drops the position table and rotates the self-attentions' queries and keys
// (docs/ARCHITECTURE.md "Blocks").
//   block:  x += attn(ln1(x));  x += ffn(ln2(x))
// model.arch = "encdec" (docs/ARCHITECTURE.md "Encoder-decoder"): blocks [0, L) are the encoder's
// (bidirectional self-attention), then ln_enc gives the encoder output; blocks [L, 2L) are the
// decoder's, each with a cross-attention to that output between its self-attention and its
// feed-forward; one token and position embedding serves both stacks and (tied) the head.
//   decoder block:  x += attn(ln1(x));  x += cross(ln_cross(x), enc);  x += ffn(ln2(x))
// The model is defined without the mesh (docs/ARCHITECTURE.md "Principles" 1): it sees only this rank's tokens
// and the weights that make the losses of the whole step exact ("sum then scale").
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deck/config.hpp"
#include "mesh/comm.hpp"
#include "model/attention.hpp"
#include "model/context.hpp"
#include "model/cross_attention.hpp"
#include "model/cross_entropy.hpp"
#include "model/embedding.hpp"
#include "model/layernorm.hpp"
#include "model/mlp.hpp"
#include "model/moe/moe_layer.hpp"
#include "model/params.hpp"
#include "model/placement.hpp"
#include "model/shape_table.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

// Model FLOPs per token of one training step (forward + backward = 3 x forward matmul FLOPs;
// attention counted over the full context, MoE experts at k choices per token plus the shared
// experts, the router included).
double train_flops_per_token(const Config& cfg, const ModelShape& s);

// One micro-batch of this rank: B sequences of T tokens.
struct MicroBatch {
  int rows = 0, seq_len = 0;
  const int32_t* inputs = nullptr;   // [B, T]
  const int32_t* targets = nullptr;  // [B, T]
  const float* mask = nullptr;       // [B, T]
  // Packed examples (Batch::segment, Batch::position) [B, T]; null: one example per sequence.
  const int32_t* segment = nullptr;
  const int32_t* position = nullptr;
  // encdec (Batch::enc_*; the fields above are then the decoder's): the encoder sequences of
  // enc_len (= seq_len) tokens [B, enc_len], their segment ids (the decoder's example ids) and positions.
  int enc_len = 0;
  const int32_t* enc_inputs = nullptr;
  const int32_t* enc_segment = nullptr;
  const int32_t* enc_position = nullptr;
  // Distillation (src/train/distill.hpp): the teacher's probabilities of every token [B, T, V]
  // (device-readable); null: the ground truth alone.
  const float* soft_targets = nullptr;
};

// Weights that turn this rank's sums into the step's means (sum then scale), the same on every rank.
struct LossWeights {
  double ce = 0;   // 1 / masked target tokens of the step (all ranks, all micro-batches)
  double aux = 0;  // moe.aux_loss_coef / routing groups of the step (per MoE layer)
  double z = 0;    // moe.z_loss_coef / tokens of the step (per MoE layer)
  double distill_alpha = 0;  // with MicroBatch::soft_targets: the teacher's share of each token's loss
};

// What one forward produced (sums over this rank's tokens, before the weights).
struct ForwardStats {
  double ce_sum = 0;      // sum of masked per-token cross-entropy
  double mask_sum = 0;    // masked target tokens
  double aux_sum = 0;     // sum over MoE layers and local groups of the load-balancing loss
  double z_sum = 0;       // sum over MoE layers and local tokens of the z-loss
  double soft_sum = 0;    // with soft targets: sum of masked per-token cross-entropy against them
};

template <typename T>
class Transformer {
 public:
  struct Block {
    Block(const Config& cfg, const ShapeTable& table, int index, const Placement& place);
    LayerNorm<T> ln1, ln2;
    CausalSelfAttention<T> attn;                 // bidirectional in an encoder block
    std::unique_ptr<LayerNorm<T>> ln_cross;      // decoder blocks of encdec: the cross-attention
    std::unique_ptr<CrossAttention<T>> cross;    // and its LayerNorm
    std::unique_ptr<MLP<T>> mlp;       // dense feed-forward, or
    std::unique_ptr<MoeLayer<T>> moe;  // MoE feed-forward
  };

  // This rank's stage and shards (model_sharding, placement_at); without one, the whole model.
  Transformer(const Config& cfg, int vocab, const Placement& placement);
  // The same from the shape table of the placement's rank, made once by the start-up
  // (docs/ARCHITECTURE.md "One run").
  Transformer(const Config& cfg, const ShapeTable& table, const Placement& placement);
  Transformer(const Config& cfg, int vocab);
  // Allocates and initialises the parameters from run.seed and model.init_scale.
  void init(uint64_t seed, double init_scale);

  // Runs one micro-batch forward through this stage. The first stage embeds mb.inputs; a later
  // stage starts from x_in [N, M] (the previous stage's output; encdec: [2, N, M], the encoder's
  // and the decoder's streams, see stage_streams()). The last stage computes the loss; an earlier
  // one leaves its output in stage_output(). Keeps what backward needs.
  // done(the forward's ForwardStats) when they are known: at once, or, while a training step
  // collects its scalars (tensor/step_scalars.hpp), at their read, in the forwards' order.
  void forward(const StepContext& ctx, const MicroBatch& mb, const LossWeights& w, const T* x_in,
               std::function<void(const ForwardStats&)> done);
  // The same with the stats returned: outside a step's collection (evaluation, decoding, tests);
  // within one (the pipeline's recomputed forward) they are not known yet and zeros are returned.
  ForwardStats forward(const StepContext& ctx, const MicroBatch& mb, const LossWeights& w, const T* x_in = nullptr);
  // Backward of the last forward: adds every parameter gradient. The last stage starts from the
  // loss; an earlier one from d_out [stage_streams(), N, M] (the next stage's input gradient). A
  // later stage leaves the gradient of its input in input_grad().
  void backward(const StepContext& ctx, const LossWeights& w, const T* d_out = nullptr);
  // What backward reads of the last forward, every layer's included (activation_stash.hpp): the
  // pipeline parks an in-flight micro-batch's state with it instead of recomputing the forward.
  template <class F>
  void saved_state(F&& f) {
    f(N_);
    f(seq_len_);
    if (first_stage()) emb_.saved_state(f);
    if (encdec()) {
      emb_enc_.saved_state(f);
      lne_.saved_state(f);
      f(enc_segment_);
      f(enc_position_);
    }
    for (Block& b : blocks_) {
      b.ln1.saved_state(f);
      b.attn.saved_state(f);
      if (b.cross) {
        b.ln_cross->saved_state(f);
        b.cross->saved_state(f);
      }
      b.ln2.saved_state(f);
      if (b.moe)
        b.moe->saved_state(f);
      else
        b.mlp->saved_state(f);
    }
    if (!last_stage()) return;
    lnf_.saved_state(f);
    head_.saved_state(f);
    ce_.saved_state(f);
    f(logits_);
  }
  // Called during backward with a flat offset into the gradient buffer: from there to its end, this
  // backward will not change a gradient again (the head first, then the blocks last first, each
  // feed-forward before its attention, the embedding last: docs/ARCHITECTURE.md "One training
  // step"). The offsets never increase, and the backward ends with 0, once. Lets the data-parallel
  // gradient all-reduce start while the backward goes on, as the tensor all-reduce hook lets the
  // tensor axis talk, without the model knowing the mesh.
  std::function<void(size_t)> grads_final_from;
  // encdec, decoding's encoder pass (src/decode/cached_model.hpp): `rows` sequences of `len` tokens
  // (segment ids and positions as MicroBatch::enc_*) through the embedding, the encoder blocks and
  // ln_enc, as forward runs them -> encoder_output() [rows * len, M]. No backward may follow it.
  // On a pipeline, this stage's part: a later stage starts from x_in [rows * len, M], the previous
  // stage's encoder_stream(); encoder_output() is there on the stages with decoder blocks.
  void encode(const StepContext& ctx, int rows, int len, const int32_t* tokens, const int32_t* segment,
              const int32_t* position, const T* x_in = nullptr);
  const Buffer<T>& encoder_output() const { return enc_out_; }
  // encdec: what the last encode() or forward() hands the next stage of the encoder's stream: the
  // encoder residual from a stage that ends inside the encoder, else the encoder output.
  const Buffer<T>& encoder_stream() const { return encoder_residual_out() ? x_ : enc_out_; }
  // What goes between pipeline stages per micro-batch: stage_streams() x [N, M]. Decoder-only: the
  // residual stream. encdec: [encoder stream, decoder stream]; the encoder stream is the encoder's
  // residual up to its last block and the encoder output (after ln_enc) from the stage of the first
  // decoder block on; the decoder stream is its embedded input up to that stage, then its residual
  // (docs/ARCHITECTURE.md "Encoder-decoder").
  int stage_streams() const { return encdec() ? 2 : 1; }
  const Buffer<T>& stage_output() const { return encdec() ? message_ : x_; }
  // The first part of this stage whose output held a NaN or Inf in the last forward ("embed",
  // "blocks.<i>", "head"), or "" when all were finite. The forward only queues the scans; the first
  // call after it waits for the device (one wait a forward, not one a layer).
  const std::string& first_nonfinite() const;
  // Testing aid (deck key debug.nan_step): the next forward poisons its first activation with NaN.
  void inject_nan_next_forward() { inject_nan_ = true; }
  const Buffer<T>& input_grad() const { return encdec() ? dmessage_ : d_; }
  const Placement& placement() const { return placement_; }
  bool first_stage() const { return placement_.first_stage(); }
  bool last_stage() const { return placement_.last_stage(); }
  int first_block() const { return first_block_; }  // global index of blocks()[0]
  // The token embedding, on the first stage; with tied embeddings on several stages, its copy on
  // the last stage (the head's weight) is `tied_copy()`: the two gradients must be summed.
  ParamView<T>* tied_embedding() { return first_stage() ? &emb_.wte : nullptr; }
  ParamView<T>* tied_copy() { return (!first_stage() && last_stage() && cfg_.model.tied_embeddings) ? &wte_copy_ : nullptr; }

  const ModelShape& shape() const { return shape_; }
  bool encdec() const { return shape_.encoder_layers > 0; }
  ParamStore<T>& params() { return params_; }
  const ParamStore<T>& params() const { return params_; }
  std::deque<Block>& blocks() { return blocks_; }
  // The layers around the blocks, for incremental decoding (src/decode/cached_model.hpp).
  Embedding<T>& embedding() { return emb_; }
  LayerNorm<T>& final_norm() { return lnf_; }
  const LayerNorm<T>& encoder_norm() const { return lne_; }  // encdec: ln_enc (tests: its output copy)
  OutputHead<T>& output_head() { return head_; }
  const CrossEntropy<T>& loss() const { return ce_; }
  // Logits [N, V] of the last forward; backward overwrites them with dlogits (or, with
  // set_loss_gradient_in_forward, a training forward on the host does).
  const Buffer<T>& logits() const { return logits_; }
  // The trainer's choice: a training forward also computes the loss's dlogits (the same bits as
  // backward would), in the pass that reads each row of logits for the loss.
  void set_loss_gradient_in_forward(bool on) { loss_gradient_in_forward_ = on; }
  // MoE layers in block order (for their statistics).
  std::vector<const MoeLayer<T>*> moe_layers() const;

 private:
  Config cfg_;
  ModelShape shape_;
  ParamStore<T> params_;
  Embedding<T> emb_;          // first stage only
  Embedding<T> emb_enc_;      // encdec: the encoder's pass through emb_'s weights
  LayerNorm<T> lne_;          // encdec: ln_enc, the encoder's final LayerNorm
  ParamView<T> wte_copy_;     // last stage with tied embeddings and pipe > 1: "embed.wte" again
  std::deque<Block> blocks_;  // deque: layers must not move after declare()
  int first_block_ = 0;
  void check_registered(const ShapeTable& table) const;
  struct BlockGrads {
    size_t block, attn, cross, ffn;  // flat offsets of the block's, its attention's, cross-attention's, FFN's parameters
  };
  size_t ln_enc_grads_begin_ = 0;        // encdec: flat offset of ln_enc
  // Notes the first part whose output is not finite: (values, count, part name).
  using CheckFinite = std::function<void(const Buffer<T>&, size_t, const std::string&)>;
  // Forward of blocks_[begin, end) on x_ (ctx: their tokens' segments); stats and finiteness as forward.
  void run_forward(const StepContext& ctx, const MicroBatch& mb, const LossWeights& w, const T* x_in);
  void resolve_finite_at_read();  // the scans' flags into the step's read (StepScalars)
  ForwardStats stats_;            // the forward's, as the host learns them
  void forward_blocks(const StepContext& ctx, size_t begin, size_t end, ForwardStats& st,
                      const CheckFinite& check_finite);
  // encdec: the N_ tokens host_tokens (seq_len_ a sequence, enc_segment_, enc_position_) through this
  // stage's part of the encoder (transformer.cpp).
  void encoder_stage(const StepContext& ctx, const T* x_in, const int32_t* host_tokens, const int32_t* host_position,
                     ForwardStats& st, const CheckFinite& check_finite);
  // encdec on a pipeline: this stage holds blocks [b0, b1) of the 2L, the encoder's are [0, L), and
  // ln_enc sits with block L.
  int blocks_end() const { return first_block_ + int(blocks_.size()); }
  bool encoder_residual_in() const { return first_block_ <= shape_.encoder_layers; }  // (or embedded here)
  bool encoder_residual_out() const { return blocks_end() <= shape_.encoder_layers; }
  bool has_ln_enc() const { return encoder_residual_in() && !encoder_residual_out(); }
  bool encoder_output_here() const { return !encoder_residual_out(); }
  // The encoder output's bf16 copy, where ln_enc wrote it here (LayerNorm::output16); else null.
  const uint16_t* encoder_output16() const { return has_ln_enc() ? lne_.output16() : nullptr; }
  size_t decoder_begin_local() const {
    return size_t(std::clamp(shape_.encoder_layers - first_block_, 0, int(blocks_.size())));
  }
  void poison_if_asked();  // debug.nan_step: NaN into the first activation, once
  // Backward of blocks_[begin, end), last first, on d_ (grads_final_from as backward).
  void backward_blocks(const StepContext& ctx, const LossWeights& w, size_t begin, size_t end);
  std::vector<BlockGrads> block_grads_;  // for grads_final_from
  size_t tail_grads_begin_ = 0;          // flat offset of ln_f (last stage), else the buffer's end
  LayerNorm<T> lnf_;
  OutputHead<T> head_;
  CrossEntropy<T> ce_;
  bool loss_gradient_in_forward_ = false;
  Placement placement_;
  PhaseTimers* timers_ = nullptr;  // of the pass in progress (the tensor all-reduce hook times itself)
  struct FiniteScan {
    std::string where;       // the part scanned
    Buffer<int32_t> flags;   // flag_nonfinite's, per chunk
  };
  std::vector<FiniteScan> finite_scans_;  // the last forward's, in order: the first finite_scans_used_
  size_t finite_scans_used_ = 0;
  mutable std::string first_nonfinite_;   // resolved from the scans by first_nonfinite()
  mutable bool finite_resolved_ = true;
  bool inject_nan_ = false;
  int N_ = 0, seq_len_ = 0;
  Buffer<T> x_, h_, f_, logits_, d_, dh_;
  Buffer<int32_t> segment_, position_;                       // device copies of the micro-batch's packing
  Buffer<T> enc_out_, denc_;                                 // encdec: encoder output [N, M], its gradient
  Buffer<T> message_, dmessage_;                             // encdec: stage_output(), input_grad() [2, N, M]
  Buffer<int32_t> enc_segment_, enc_position_;              // encdec: the encoder's packing
  std::vector<T> mask_, soft_;  // the host's MicroBatch::mask, soft_targets as T (T = double: the tests' models)
};

}  // namespace meshmoe
