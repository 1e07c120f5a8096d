// The shape table (docs/ARCHITECTURE.md "The shape table"): for a deck, a mesh and one rank's
// placement, the legend's letters with this rank's shares computed once, the divisibility rules
// that make those shares whole (checked once per start-up: CheckedShapes), and every parameter
// tensor of every layer of the rank's pipeline stage in ParamStore order. The model registers
// exactly these entries (Transformer checks it), the memory plan sums them (run/memory.cpp), and
// the deck checks the same rules (deck.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "deck/config.hpp"
#include "deck/shape_rules.hpp"
#include "mesh/mesh.hpp"
#include "model/layer_shapes.hpp"
#include "model/moe/moe_options.hpp"
#include "model/params.hpp"

namespace meshmoe {

struct Placement;  // model/placement.hpp

// Sizes that follow from the deck and the dataset.
// model.arch = "encdec": blocks [0, encoder_layers) are the encoder's, the rest (as many) the
// decoder's, which have a cross-attention (docs/ARCHITECTURE.md "Encoder-decoder").
struct ModelShape {
  int vocab = 0, seq_len = 0, d_model = 0, num_layers = 0, num_heads = 0, d_ff = 0;  // num_layers: all blocks
  int encoder_layers = 0;  // 0: decoder-only
  int kv_heads = 0;        // the self-attention's key/value heads (kv_heads_of: num_heads unless grouped)
  // Block i of a stack has an MoE feed-forward when moe_every > 0, (i + 1) % moe_every == 0 and
  // i >= moe_first_dense (moe.first_dense: DeepSeekMoE's leading dense layers).
  int moe_every = 0, moe_first_dense = 0;
  bool is_encoder_block(int i) const { return i < encoder_layers; }
  bool has_cross_attention(int i) const { return encoder_layers > 0 && i >= encoder_layers; }
  bool is_moe_block(int i) const {
    const int in_stack = i < encoder_layers ? i : i - encoder_layers;
    return moe_every > 0 && (in_stack + 1) % moe_every == 0 && in_stack >= moe_first_dense;
  }
  int num_moe_layers() const {
    int n = 0;
    for (int i = 0; i < num_layers; ++i) n += is_moe_block(i);
    return n;
  }
};
ModelShape model_shape(const Config& cfg, int vocab);

// Whether a run keeps bf16 copies (bf16 GEMMs on a GPU, tensor/blas.hpp bf16_operand_copies): the
// layers' copies of GEMM operands (buffers of the table) and the store's copy of the weights
// (ParamStore::weights16, 2 bytes a parameter in the memory plan's parameters).
bool plans_bf16_copies(const Config& cfg);

// One rank of the mesh: coordinates along pipe, data and tensor.
struct RankCoords {
  int pipe = 0, data = 0, tensor = 0;
};

// Stage: the Transformer's own buffers (the residual stream); Dispatcher: an MoE layer's token
// movement (moe/dispatcher.hpp and the all-to-all or index-select dispatcher).
// SharedExperts: an MoE layer's shared experts (moe.shared_experts), one feed-forward of width n H.
enum class LayerKind { Stage, Embedding, LayerNorm, Attention, CrossAttention, DenseFfn, Router, Dispatcher, Experts,
                       SharedExperts, Head };

// What a layer's buffer is for, which decides where the memory plan counts it:
//   Saved:       written by the forward, read by the backward (parked with the micro-batch when the
//                pipeline holds several: docs/ARCHITECTURE.md "Pipeline activations");
//   ForwardOnly: written by the forward, not read by the backward (never parked);
//   Scratch:     the backward's workspace (kept between steps, not parked).
enum class BufferKind { Saved, ForwardOnly, Scratch };

// One buffer a layer allocates for one micro-batch of this rank, on the host (fp32 activations).
struct BufferShape {
  const char* name = "";     // the layer's name for it
  const char* letters = "";  // its shape in the legend's letters, e.g. "[B, heads_l, T, T]"
  std::vector<int64_t> dims;
  size_t elem_bytes = 4;     // float 4, double 8, int 4, int64 8, uint8 1
  BufferKind kind = BufferKind::Saved;
  Checked bytes() const {
    Checked n = Checked(elem_bytes);
    for (const int64_t d : dims) n *= d;
    return n;
  }
};

// One layer of this rank's stage: its parameter entries (ParamStore::add, in order) and, in a table
// with a micro-batch, its buffers.
struct LayerShapes {
  std::string prefix;  // "stage", "embed", "blocks.3.ln1", "blocks.3.attn", "blocks.3.moe.router", ..., "head"
                       // (encdec: also "embed.encoder", "ln_enc", "blocks.5.ln_cross", "blocks.5.cross")
  LayerKind kind = LayerKind::Embedding;
  int block = -1;      // global block index, -1 outside the blocks
  std::vector<ParamInfo> params;
  std::vector<BufferShape> buffers;
};

// The letters of the legend for one rank (docs/ARCHITECTURE.md): global sizes, and this rank's
// share of the split ones inside the layer shapes (heads_l, H_l, E_l, ...).
struct ShapeLetters {
  int V = 0, T = 0, M = 0, H = 0;  // vocabulary, model.seq_len, width, dense hidden width
  int layers = 0, heads = 0;       // blocks (model.num_layers, twice that for encdec), model.num_heads
  int encoder_layers = 0;          // encdec: blocks [0, encoder_layers) are the encoder's
  int stage = 0, stages = 1;       // pipe coordinate and extent
  int first_block = 0, num_blocks = 0;  // this stage's blocks [first_block, first_block + num_blocks)
  bool first_stage = true, last_stage = true;
  AttentionShape attn;  // heads split over tensor (Megatron)
  FfnShape ffn;         // dense hidden units split over tensor (Megatron)
  bool moe = false;     // the model has MoE layers; then:
  MoeOptions moe_opt;   // the [moe] settings (moe_options(cfg, 0))
  bool experts_over_data = true;  // moe.expert_axis = data
  // Data ranks of an expert group (mesh.expert_parallel resolved, shape_rules.hpp): the all-to-all's
  // ranks; mesh.data / expert_parallel replicas of each expert. 1 with experts over tensor.
  int expert_parallel = 1;
  ExpertShape experts;  // this rank's experts and hidden units (Placement::expert_shape)
  FfnShape shared;      // with moe.shared_experts: their hidden units n H over tensor (Placement::shared_shape)
  int k = 0;            // experts per token
  // One micro-batch of this rank (tables with buffers only): B sequences of T tokens, N = B x T;
  // G = N / S routing groups of S tokens, capacity C per group and expert (training).
  int B = 0, N = 0, S = 0, G = 0, C = 0;
};

// A deck with its vocabulary on a mesh, checked once before any shape table of the mesh's ranks is
// built from it (docs/ARCHITECTURE.md "One run"): every dimension within the layers' 32-bit indices
// and every rule of shape_rules (the batch's too with with_batch). Throws InputError naming the
// deck keys. `cfg` must outlive it.
class CheckedShapes {
 public:
  CheckedShapes(const Config& cfg, int vocab, const MeshShape& mesh, bool with_batch);
  const Config& cfg() const { return *cfg_; }
  int vocab() const { return vocab_; }
  const MeshShape& mesh() const { return mesh_; }
  bool with_batch() const { return with_batch_; }

 private:
  const Config* cfg_;
  int vocab_;
  MeshShape mesh_;
  bool with_batch_;
};

class ShapeTable {
 public:
  // The model of the rank `place` (its sizes: placement_at's, no Comms needed) of a checked deck's
  // mesh; when the batch's rules were checked, also one training micro-batch's buffers
  // (optim.batch_size / (optim.micro_batches x mesh.data) sequences).
  ShapeTable(const CheckedShapes& checked, const Placement& place);
  // Both steps in one: CheckedShapes(cfg, vocab, mesh, with_buffers), then the rank at `at`
  // (placement_at). Throws InputError as CheckedShapes does.
  ShapeTable(const Config& cfg, int vocab, const MeshShape& mesh, RankCoords at, bool with_buffers = false);

  const MeshShape& mesh() const { return mesh_; }
  const RankCoords& coords() const { return at_; }
  const ShapeLetters& letters() const { return letters_; }
  const std::vector<LayerShapes>& layers() const { return layers_; }
  // Every parameter entry of the stage in ParamStore order, with its flat offset.
  std::vector<ParamInfo> params() const;
  bool is_moe_block(int i) const { return model_.is_moe_block(i); }
  const ModelShape& model() const { return model_; }

 private:
  void add_buffers(const Config& cfg, const MeshShape& mesh);
  MeshShape mesh_;
  RankCoords at_;
  ShapeLetters letters_;
  ModelShape model_;
  std::vector<LayerShapes> layers_;
};

}  // namespace meshmoe
