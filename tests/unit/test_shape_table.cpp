// The shape table (src/model/shape_table.hpp) against the logical model: on every mesh of 8 ranks
// that the rules accept, the blocks the ranks hold of each parameter tile its logical shape, every
// block held by the same number of ranks, and a parameter whose blocks differ along an axis says so
// in sharded_over (the gradient sum over data and the tensor-identity assumption depend on it).
// Oracle: the logical shapes of a one-rank table and element counting, independent of the split.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "core/error.hpp"
#include "deck/shape_rules.hpp"
#include "model/shape_table.hpp"
#include "../test_util.hpp"
#include "../support/mesh_support.hpp"

using namespace meshmoe;

namespace {

Config moe_deck(const std::string& expert_axis, const std::string& activation) {
  Config c;
  c.model.seq_len = 8;
  c.model.d_model = 16;
  c.model.num_layers = 4;
  c.model.num_heads = 4;
  c.model.d_ff = 32;
  c.model.activation = test::option<Activation>(activation);
  c.model.tied_embeddings = true;
  c.moe.num_experts = 4;
  c.moe.every = 2;
  c.moe.expert_d_ff = 24;
  c.moe.shared_experts = 2;  // blocks.i.moe.shared: hidden units 2 x 24 over tensor on either expert axis
  c.moe.expert_axis = test::option<ExpertAxis>(expert_axis);
  c.moe.group_size = 8;
  c.optim.batch_size = 8;
  c.optim.micro_batches = 2;
  return c;
}

struct Holder {
  std::vector<int64_t> local, offset;
  std::array<int, 3> coords;
  uint8_t sharded_over;
};

// For one parameter: its distinct blocks are disjoint, lie inside the logical shape and fill it
// (their sizes sum to its size); every block is held equally often.
void check_tiling(const std::string& name, const std::vector<int64_t>& logical, const std::vector<Holder>& holders) {
  INFO(name);
  std::map<std::vector<int64_t>, std::pair<std::vector<int64_t>, int>> blocks;  // offset -> (local, holders)
  for (const Holder& h : holders) {
    REQUIRE(h.local.size() == logical.size());
    for (size_t d = 0; d < logical.size(); ++d) REQUIRE((h.offset[d] >= 0 && h.offset[d] + h.local[d] <= logical[d]));
    auto [it, fresh] = blocks.try_emplace(h.offset, h.local, 0);
    CHECK(it->second.first == h.local);  // one block per offset
    ++it->second.second;
  }
  int64_t covered = 0, logical_size = 1;
  for (int64_t d : logical) logical_size *= d;
  std::set<int> copies;
  for (const auto& [offset, b] : blocks) {
    int64_t n = 1;
    for (int64_t d : b.first) n *= d;
    covered += n;
    copies.insert(b.second);
  }
  // Equal, aligned blocks (every split is even) that do not overlap fill the shape exactly when
  // their sizes add up to it; the pairwise disjointness follows from distinct offsets of a grid.
  CHECK(covered == logical_size);
  CHECK(copies.size() == 1);
  // Blocks that differ along data or tensor carry that axis' bit; the same block on every rank of
  // an axis does not.
  for (int axis : {1, 2}) {
    bool differs = false;
    for (const Holder& a : holders)
      for (const Holder& b : holders) {
        const bool same_elsewhere = a.coords[0] == b.coords[0] && a.coords[3 - axis] == b.coords[3 - axis];
        differs |= same_elsewhere && a.coords[axis] != b.coords[axis] && a.offset != b.offset;
      }
    const uint8_t bit = axis == 1 ? kShardData : kShardTensor;
    for (const Holder& h : holders) CHECK(bool(h.sharded_over & bit) == differs);
  }
  // Expert replicas: blocks that differ along data and also repeat along it (the same block on two
  // data ranks of one pipe and tensor coordinate) carry kShardReplicas; no other block does.
  bool repeats_over_data = false;
  for (const Holder& a : holders)
    for (const Holder& b : holders)
      repeats_over_data |= a.coords[0] == b.coords[0] && a.coords[2] == b.coords[2] && a.coords[1] != b.coords[1] &&
                           a.offset == b.offset;
  for (const Holder& h : holders)
    CHECK(bool(h.sharded_over & kShardReplicas) == (repeats_over_data && bool(h.sharded_over & kShardData)));
}

}  // namespace

TEST_CASE("shape table: the ranks' blocks tile every parameter on every mesh", "[shapes]") {
  // expert_parallel: 0 picks gcd(E, data), 2 makes expert groups of 2 data ranks (replicas on data 4, 8)
  for (const auto& [axis, expert_parallel] : std::vector<std::pair<std::string, int>>{{"data", 0}, {"data", 2}, {"tensor", 0}})
    for (const std::string act : {"relu", "geglu"})
    for (const int kv_heads : {0, 2, 1}) {  // grouped-query attention: kv heads split or replicated over tensor
      if (kv_heads > 0 && (act != "relu" || axis != "data" || expert_parallel != 0)) continue;
      Config cfg = moe_deck(axis, act);
      cfg.model.kv_heads = kv_heads;
      cfg.mesh.expert_parallel = expert_parallel;
      const int V = 40;
      std::map<std::string, std::vector<int64_t>> logical;
      Config one_rank = cfg;
      one_rank.mesh.expert_parallel = 0;  // no expert groups on one rank
      for (const ParamInfo& p : ShapeTable(one_rank, V, MeshShape{1, 1, 1}, {}).params()) logical[p.name] = p.logical_shape;
      int meshes = 0;
      for (const MeshShape& mesh : test::all_mesh_shapes(8)) {
        bool ok = true;
        for (const ShapeRule& r : shape_rules(cfg, mesh.pipe, mesh.data, mesh.tensor)) ok &= r.ok;
        if (!ok) {
          CHECK_THROWS_AS(ShapeTable(cfg, V, mesh, {}, true), InputError);
          continue;
        }
        ++meshes;
        INFO("expert_axis " << axis << ", mesh.expert_parallel " << expert_parallel << ", " << act << ", kv_heads "
                                << kv_heads << ", mesh " << mesh.str());
        std::map<std::string, std::vector<Holder>> holders;
        for (int r = 0; r < mesh.size(); ++r) {
          const std::array<int, 3> c = mesh.coords(r);
          const RankCoords at{c[int(Axis::Pipe)], c[int(Axis::Data)], c[int(Axis::Tensor)]};
          const ShapeTable table(cfg, V, mesh, at, true);
          size_t flat = 0;
          for (const ParamInfo& p : table.params()) {
            CHECK(p.flat_offset == flat);  // the store's layout: contiguous in table order
            flat += p.size;
            if (p.name == "embed.wte" && !table.letters().first_stage) continue;  // the tied copy
            holders[p.name].push_back({p.local_shape, p.offset, {at.pipe, at.data, at.tensor}, p.sharded_over});
          }
          CHECK(table.letters().N == table.letters().B * cfg.model.seq_len);
          CHECK(table.letters().G * table.letters().S == table.letters().N);
        }
        CHECK(holders.size() == logical.size());  // every parameter on some stage
        for (const auto& [name, hs] : holders) {
          REQUIRE(logical.count(name));
          check_tiling(name, logical[name], hs);
        }
      }
      CHECK(meshes >= 4);
    }
}

TEST_CASE("shape table: the fused attention keeps no [B, heads_l, T, T] buffer", "[shapes][fused]") {
  for (const bool bf16_gpu : {false, true}) {
    INFO((bf16_gpu ? "bf16 on a GPU" : "fp32 on the host"));
    Config c = moe_deck("data", "gelu");
    if (bf16_gpu) c.model.precision = Precision::Bf16, c.run.device = Device::Cuda;
    const MeshShape mesh{1, 1, 2};  // tensor = 2: heads_l = 2 of 4
    auto attention_buffers = [&](AttentionKernel k) {
      c.model.attention_kernel = k;
      const ShapeTable table(c, 50, mesh, {}, true);
      std::vector<BufferShape> out;
      for (const LayerShapes& l : table.layers())
        if (l.kind == LayerKind::Attention && l.block == 0) out = l.buffers;
      return out;
    };
    const int64_t B = 4, heads_l = 2, T = 8;  // as the case above
    Checked plain_bytes = 0, fused_bytes = 0;
    for (const BufferShape& b : attention_buffers(AttentionKernel::Plain)) plain_bytes += b.bytes();
    int per_row = 0;
    for (const BufferShape& b : attention_buffers(AttentionKernel::Fused)) {
      INFO(b.name);
      fused_bytes += b.bytes();
      CHECK(b.dims != std::vector<int64_t>{B, heads_l, T, T});
      if (b.dims == std::vector<int64_t>{B, heads_l, T}) {
        ++per_row;
        CHECK(b.kind == (std::string(b.name) == "row log-sum-exp" ? BufferKind::Saved : BufferKind::Scratch));
      }
    }
    CHECK(per_row == 2);  // the log-sum-exp (saved) and the rows' dO . O (scratch)
    // P and dP (4 bytes each), and their bf16 copies on a GPU (2 bytes each), become two [B, heads_l, T]
    // rows and the segment ids [N].
    const int64_t pairs = B * heads_l * T * T, rows = B * heads_l * T, N = B * T;
    CHECK(plain_bytes.value() - fused_bytes.value() == 2 * pairs * (bf16_gpu ? 6 : 4) - 2 * rows * 4 - N * 4);
  }
}

// The layers' bf16 copies of GEMM operands (tensor/blas.hpp bf16_operand_copies) are planned exactly
// where the layers keep them: bf16 GEMMs on a GPU. Every self-attention keeps dy, then dq, dk, dv
// (scratch, [N, max(M, 3 A_l)]: its x's copy is ln1's), every cross-attention alike where ln_enc is
// on its stage (its output copy is the encoder output's), else also the encoder output's copy (forward
// only, [N, M]) that the scratch then follows (dq, dk, dv: [N, 3 A_l]); the causal
// self-attentions (decoder-only blocks and the decoder of encdec, not the encoder's bidirectional
// one) also P (saved for the backward) and dS (scratch), 2 bytes x [B, heads_l, T, T]; every
// feed-forward, dense or shared expert, its activation's output h (saved, [N, H_l]) and dy then
// dpre (scratch, [N, max(M, W_l)]); every norm whose output GEMMs read (ln1, ln_cross, the ln2
// before a dense feed-forward, ln_f, ln_enc; not the ln2 before an MoE layer) that output (saved,
// [N, M]); every MoE layer's dispatcher the gather's copy of the experts'
// input (forward only: [E', G, C, M] on one expert rank, the expert side's [R, M] behind an
// all-to-all), and its experts x and h (saved, [R, M + H_l]) and dy then dpre (scratch, [R, max(M,
// W_l)]). Oracle: the letters of the deck, counted by hand.
TEST_CASE("shape table: the bf16 copies of GEMM operands on a GPU", "[shapes]") {
  for (const bool encdec : {false, true}) {
    INFO("encdec " << encdec);
    Config c = moe_deck("data", "gelu");
    if (encdec) c.model.arch = ModelArch::EncDec;
    const MeshShape mesh{1, 1, 2};  // tensor = 2: heads_l = 2 of 4; the experts' hidden units 24 / 2
    std::set<std::string> layers;
    auto copies = [&](Precision p, Device d) {
      c.model.precision = p, c.run.device = d;
      std::map<std::string, std::vector<BufferShape>> found;  // layer -> its bf16 buffers
      const ShapeTable table(c, 50, mesh, {}, true);
      for (const LayerShapes& l : table.layers()) {
        layers.insert(l.prefix);
        for (const BufferShape& b : l.buffers)
          if (b.elem_bytes == 2) found[l.prefix].push_back(b);
      }
      return std::pair{found, table.letters().encoder_layers};
    };
    CHECK(copies(Precision::Fp32, Device::Cuda).first.empty());
    CHECK(copies(Precision::Bf16, Device::Cpu).first.empty());
    const auto [found, encoder_layers] = copies(Precision::Bf16, Device::Cuda);
    const int blocks = c.model.num_layers * (encdec ? 2 : 1);
    CHECK(encoder_layers == (encdec ? c.model.num_layers : 0));
    // B = 8 / 2 micro-batches, T = 8: N = 32 tokens; M = 16, A_l = 2 heads x 4 = 8; the dense
    // feed-forward's W_l = 32 / 2 = 16, the shared experts' 2 x 24 / 2 = 24.
    const int64_t B = 4, T = 8, N = 32;
    size_t with_copies = 0;
    for (int i = 0; i < blocks; ++i) {
      const std::string b = "blocks." + std::to_string(i);
      INFO(b);
      REQUIRE(found.count(b + ".attn") == 1);
      const auto& attn = found.at(b + ".attn");
      REQUIRE(attn.size() == (i < encoder_layers ? 1 : 3));
      CHECK(attn[0].dims == std::vector<int64_t>{N, 3 * 8});
      CHECK(attn[0].kind == BufferKind::Scratch);
      if (i >= encoder_layers) {
        for (size_t j : {1, 2}) CHECK(attn[j].dims == std::vector<int64_t>{B, 2, T, T});
        CHECK(attn[1].kind == BufferKind::Saved);
        CHECK(attn[2].kind == BufferKind::Scratch);
      }
      if (encdec && i >= encoder_layers) {
        REQUIRE(found.count(b + ".cross") == 1);
        REQUIRE(found.at(b + ".cross").size() == 1);
        CHECK(found.at(b + ".cross")[0].dims == std::vector<int64_t>{N, 3 * 8});
        CHECK(found.at(b + ".cross")[0].kind == BufferKind::Scratch);
        ++with_copies;
      }
      const bool dense = layers.count(b + ".mlp") == 1;
      const std::string ffn = b + (dense ? ".mlp" : ".moe.shared");
      REQUIRE(layers.count(ffn) == 1);
      REQUIRE(found.count(ffn) == 1);
      REQUIRE(found.at(ffn).size() == 2);
      CHECK(found.at(ffn)[0].dims == std::vector<int64_t>{N, dense ? 16 : 24});  // h [N, H_l]
      CHECK(found.at(ffn)[0].kind == BufferKind::Saved);
      CHECK(found.at(ffn)[1].dims == std::vector<int64_t>{N, dense ? 16 : 24});
      CHECK(found.at(ffn)[1].kind == BufferKind::Scratch);
      with_copies += 2;
      // the norms' output copies
      auto norm_copy = [&](const std::string& norm) {
        INFO(norm);
        REQUIRE(found.count(norm) == 1);
        REQUIRE(found.at(norm).size() == 1);
        CHECK(found.at(norm)[0].dims == std::vector<int64_t>{N, 16});
        CHECK(found.at(norm)[0].kind == BufferKind::Saved);
        ++with_copies;
      };
      norm_copy(b + ".ln1");
      if (encdec && i >= encoder_layers) norm_copy(b + ".ln_cross");
      if (dense) norm_copy(b + ".ln2");
      else CHECK(found.count(b + ".ln2") == 0);
      if (dense) continue;
      // top-2 (the default), 4 experts, groups of S = 8 at capacity factor 1.25: C = ceil(2 x 8 x
      // 1.25 / 4) = 5, G = 32 / 8 = 4; every expert here (data = 1): R = 4 x 4 x 5 rows; H_l = W_l = 12.
      const int64_t G = 4, C = 5, R = 4 * G * C;
      REQUIRE(found.count(b + ".moe.dispatch") == 1);
      REQUIRE(found.at(b + ".moe.dispatch").size() == 1);
      CHECK(found.at(b + ".moe.dispatch")[0].dims == std::vector<int64_t>{4, G, C, 16});
      CHECK(found.at(b + ".moe.dispatch")[0].kind == BufferKind::ForwardOnly);
      REQUIRE(found.count(b + ".moe.experts") == 1);
      const auto& experts = found.at(b + ".moe.experts");
      REQUIRE(experts.size() == 2);
      CHECK(experts[0].dims == std::vector<int64_t>{R, 16 + 12});
      CHECK(experts[0].kind == BufferKind::Saved);
      CHECK(experts[1].dims == std::vector<int64_t>{R, 16});
      CHECK(experts[1].kind == BufferKind::Scratch);
      with_copies += 2;
    }
    for (const std::string norm : {"ln_f", "ln_enc"}) {
      INFO(norm);
      if (norm == "ln_enc" && !encdec) continue;
      REQUIRE(found.count(norm) == 1);
      CHECK(found.at(norm)[0].dims == std::vector<int64_t>{N, 16});
      ++with_copies;
    }
    CHECK(found.size() == with_copies);  // no other layer keeps copies
  }
  // Behind the all-to-all (data = 2, an expert group of 2): the dispatcher's copy is the expert
  // side's, [R, M] with R = E_l x 2 sources x G x C = 2 x 2 x 2 x 5 (B = 8 / (2 x 2), N = 16, G = 2).
  Config c = moe_deck("data", "gelu");
  c.model.precision = Precision::Bf16, c.run.device = Device::Cuda;
  const ShapeTable table(c, 50, MeshShape{1, 2, 1}, {}, true);
  size_t dispatchers = 0;
  for (const LayerShapes& l : table.layers())
    for (const BufferShape& b : l.buffers)
      if (l.kind == LayerKind::Dispatcher && b.elem_bytes == 2) {
        CHECK(b.dims == std::vector<int64_t>{2 * 2 * 2 * 5, 16});
        ++dispatchers;
      }
  CHECK(dispatchers == 2);  // blocks 1 and 3

  // tensor = 4: A_l = 4, and the attentions' scratch holds dy [N, M] first, the wider (N = 32).
  c.model.arch = ModelArch::EncDec;
  int scratches = 0;
  const ShapeTable quarter(c, 50, MeshShape{1, 1, 4}, {}, true);
  for (const LayerShapes& l : quarter.layers())
    for (const BufferShape& b : l.buffers)
      if ((l.kind == LayerKind::Attention || l.kind == LayerKind::CrossAttention) && b.elem_bytes == 2 &&
          std::string(b.name) == "dy | dq, dk, dv, bf16") {
        CHECK(b.dims == std::vector<int64_t>{32, 16});
        ++scratches;
      }
  CHECK(scratches == 8 + 4);  // every block's self-attention, the decoder's cross-attentions
  // pipe = 4 (2 of the 8 blocks a stage, A_l = 16): ln_enc is stage 2's, whose cross-attentions read
  // its copy; stage 3's round the encoder output themselves in the forward.
  for (const int stage : {2, 3}) {
    INFO("stage " << stage);
    const ShapeTable staged(c, 50, MeshShape{4, 1, 1}, {stage, 0, 0}, true);
    const int64_t N = staged.letters().N;
    int crosses = 0;
    for (const LayerShapes& l : staged.layers()) {
      if (l.kind != LayerKind::CrossAttention) continue;
      std::vector<BufferShape> copies;
      for (const BufferShape& b : l.buffers)
        if (b.elem_bytes == 2) copies.push_back(b);
      ++crosses;
      if (stage == 2) {
        REQUIRE(copies.size() == 1);
        CHECK(copies[0].dims == std::vector<int64_t>{N, 3 * 16});
        CHECK(copies[0].kind == BufferKind::Scratch);
      } else {
        REQUIRE(copies.size() == 2);
        CHECK(copies[0].dims == std::vector<int64_t>{N, 16});
        CHECK(copies[0].kind == BufferKind::ForwardOnly);
        CHECK(copies[1].dims == std::vector<int64_t>{N, 3 * 16});
        CHECK(copies[1].kind == BufferKind::Scratch);
      }
    }
    CHECK(crosses == 2);
  }
}
