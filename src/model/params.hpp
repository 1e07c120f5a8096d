// All parameters of a model in one flat allocation, gradients in a second one of the same layout
// (llm.c style): one call all-reduces every gradient, one call writes a checkpoint, and optimizer
// state is offset arithmetic. Each parameter keeps its logical (unsharded) shape and the block this
// rank holds, so that init, checkpoints and gradient sync can use logical indices.
//
// Use: layers call add(...) with the address of a ParamView member while the model is built, the
// model calls allocate() once, and every registered view is then pointed at its slice. Layers must
// not move in memory after add() (hold them in std::deque / std::unique_ptr, or reserve vectors).
#pragma once
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/hash.hpp"
#include "core/sizes.hpp"
#include "core/philox.hpp"
#include "mesh/comm.hpp"
#include "model/param_init_bodies.hpp"
#include "tensor/blas.hpp"
#include "tensor/device.hpp"
#include "tensor/elementwise.hpp"

namespace meshmoe {

template <typename T>
struct ParamView {
  T* w = nullptr;  // values
  T* g = nullptr;  // gradient (backward adds into it)
  size_t size = 0;
  // w rounded to bf16 (bf16_bits) where the store keeps the copy (ParamStore::weights16), which the
  // bf16 GEMMs read instead of rounding w; null otherwise.
  const uint16_t* w16 = nullptr;
};

enum class InitKind { TruncNormal, Zeros, Ones };

// The mesh axes a parameter's blocks are spread over, as a bit set. A gradient is summed over the
// data ranks unless the parameter is split over data (experts with moe.expert_axis = data); a
// parameter not split over tensor is computed identically on every tensor rank. kShardReplicas
// (with kShardData): split over the data ranks of an expert group and held alike by the data / P
// ranks of a replica group, over which the gradient is summed (docs/ARCHITECTURE.md "Expert
// replicas"). Set by the layers that hold a block; a single-rank model leaves kShardNone.
enum ShardAxes : uint8_t { kShardNone = 0, kShardData = 1, kShardTensor = 2, kShardReplicas = 4 };

struct ParamInfo {
  std::string name;                      // e.g. "blocks.3.attn.qkv.w"
  std::vector<int64_t> logical_shape;    // unsharded
  std::vector<int64_t> local_shape;      // this rank's block
  std::vector<int64_t> offset;           // block start in logical coordinates
  InitKind init = InitKind::TruncNormal;
  double fan_in = 1;                     // truncated normal std = sqrt(init_scale / fan_in)
  uint8_t sharded_over = kShardNone;     // ShardAxes bits
  size_t flat_offset = 0;                // start in the flat buffers
  size_t size = 0;                       // local element count
  bool no_weight_decay = false;          // biases, LayerNorm gains
};

// A parameter of which a rank holds block [offset, offset + local): its entry without a flat
// offset, the element count checked (a plan of a huge deck throws SizeOverflow).
inline ParamInfo param_entry(std::string name, std::vector<int64_t> logical, std::vector<int64_t> local,
                             std::vector<int64_t> offset, InitKind init, double fan_in, uint8_t sharded_over = kShardNone) {
  ParamInfo p;
  p.name = std::move(name);
  p.logical_shape = std::move(logical);
  p.local_shape = std::move(local);
  p.offset = std::move(offset);
  p.init = init;
  p.fan_in = fan_in;
  p.sharded_over = sharded_over;
  Checked n = 1;
  for (const int64_t d : p.local_shape) n *= d;
  p.size = size_t(n.value());
  return p;
}

template <typename T>
class ParamStore {
 public:
  ParamStore() = default;
  ~ParamStore() {
    if (!share_) return;
    share_->node_shared_free(w_);                     // the weights' window (and the gradients' unless one copy)
    if (one_weight_copy_) share_->node_shared_free(g_);  // the gradients' own window
  }
  // A copy (tests: a fresh start to compare against) holds its values in private memory.
  ParamStore(const ParamStore& o)
      : infos_(o.infos_), views_(o.views_), total_(o.total_), allocated_(o.allocated_) {
    weights16_ = o.weights16_;
    if (!o.node_shared()) {
      weights_ = o.weights_, grads_ = o.grads_;
    } else {  // on the host
      weights_.assign(o.w_, o.w_ + total_);
      grads_.assign(o.g_, o.g_ + total_);
    }
    w_ = weights_.data(), g_ = grads_.data();
  }
  ParamStore& operator=(const ParamStore&) = delete;
  // Registers a parameter whose local block equals its logical shape.
  ParamInfo& add(std::string name, std::vector<int64_t> shape, InitKind init, double fan_in, ParamView<T>* view) {
    return add_block(std::move(name), shape, shape, std::vector<int64_t>(shape.size(), 0), init, fan_in, view);
  }
  // Registers a parameter of which this rank holds block [offset, offset+local_shape).
  ParamInfo& add_block(std::string name, std::vector<int64_t> logical_shape, std::vector<int64_t> local_shape,
                       std::vector<int64_t> offset, InitKind init, double fan_in, ParamView<T>* view) {
    return add(param_entry(std::move(name), std::move(logical_shape), std::move(local_shape), std::move(offset), init,
                           fan_in),
               view);
  }
  // Registers an entry (of the shape table, model/layer_shapes.hpp, or param_entry) as it is; its
  // flat offset is the store's.
  ParamInfo& add(ParamInfo entry, ParamView<T>* view) {
    if (allocated()) throw std::logic_error("ParamStore::add after allocate: " + entry.name);
    entry.flat_offset = total_;
    total_ += entry.size;
    infos_.push_back(std::move(entry));
    views_.push_back(view);
    return infos_.back();
  }

  // Zero weights and gradients. With `share` (the data axis, on the host) they live in memory its
  // collectives read directly (Comm::node_shared_alloc): the gradient sum over data and the
  // all-gather of sharded updates then move no bytes through a staging window. With
  // `one_weight_copy` too (optim.shard_state: each data rank updates only the parameters it owns)
  // and no parameter split over data, the group's ranks on a node hold one copy of the weights
  // between them (Comm::node_shared_alloc_one; docs/ARCHITECTURE.md "Sharded optimizer state"):
  // the owners' updates need no all-gather on one node, only publish_weights(), and across nodes
  // one between the nodes' copies (Comm::node_copy_all_gather). Collective over `share`, and so is the
  // store's destruction then; `share` must outlive the store. Private Buffers when it gives none.
  void allocate(Comm* share = nullptr, bool one_weight_copy = false) {
    allocated_ = true;
    weights_.clear();  // zero, on the device where the Buffers live
    grads_.clear();
    const size_t stride = (total_ + 15) / 16 * 16;  // the gradients 64-byte aligned after the weights
    const bool node = share && share->size() > 1 && !buffers_on_device();
    bool split_over_data = false;
    for (const ParamInfo& p : infos_) split_over_data |= (p.sharded_over & kShardData) != 0;
    if (node && one_weight_copy && !split_over_data) {
      // Both or neither: each call gives nullptr on every rank alike.
      T* w = static_cast<T*>(share->node_shared_alloc_one(total_ * sizeof(T)));
      T* g = w ? static_cast<T*>(share->node_shared_alloc(total_ * sizeof(T))) : nullptr;
      if (w && !g) share->node_shared_free(w);
      if (w && g) share_ = share, one_weight_copy_ = true, w_ = w, g_ = g;
    }
    if (node && !share_)
      if (void* shared = share->node_shared_alloc(2 * stride * sizeof(T))) {
        share_ = share;
        w_ = static_cast<T*>(shared);
        g_ = w_ + stride;
      }
    if (!share_) {
      weights_.resize(total_);
      grads_.resize(total_);
      w_ = weights_.data(), g_ = grads_.data();
    }
    weights16_.clear();
    if (bf16_operand_copies<T>()) weights16_.resize(total_);  // zero, as the weights, until written
    for (size_t i = 0; i < infos_.size(); ++i) {
      if (!views_[i]) continue;
      views_[i]->w = w_ + infos_[i].flat_offset;
      views_[i]->g = g_ + infos_[i].flat_offset;
      views_[i]->size = infos_[i].size;
      views_[i]->w16 = weights16_.empty() ? nullptr : weights16_.data() + infos_[i].flat_offset;
    }
  }
  // Whether allocate() placed the weights and gradients in node-shared memory.
  bool node_shared() const { return share_ != nullptr; }
  // Whether the data ranks of the node hold one copy of the weights between them (allocate): a
  // rank writes only the parameters it owns (or all ranks the same values), then publish_weights().
  bool one_weight_copy() const { return one_weight_copy_; }
  // Whether this rank writes every weight when they are all set at once (an initialisation, a
  // checkpoint's read): not with one_weight_copy() but on the first rank of each node, which writes
  // the one copy for the node (the others wait at publish_weights()).
  bool writes_all_weights() const { return !one_weight_copy_ || share_->node_rank() == 0; }
  // After the weights were all set at once (init, a checkpoint's read, the gathered updates of
  // optim.shard_state): the bf16 copy rounded from them (weights16), and, collective over the share,
  // every rank's writes to the weights visible to every rank (a no-op unless one_weight_copy()).
  void publish_weights() {
    if (one_weight_copy_) share_->node_shared_fence();
    round_weights16(0, total_);  // after the fence: it reads what the node's other ranks wrote
  }
  // The bf16 copy of the weights (docs/ARCHITECTURE.md "Precision"): weights16()[i] =
  // bf16_bits(weights()[i]), kept where bf16 GEMMs read copies (tensor/blas.hpp
  // bf16_operand_copies: bf16 GEMMs with the Buffers on a device), null otherwise. Whoever writes
  // weights writes it too: the optimizers' updates element by element, publish_weights() after an
  // init or a checkpoint's read, round_weights16 after gathered updates (optim.shard_state).
  uint16_t* weights16() { return weights16_.empty() ? nullptr : weights16_.data(); }
  size_t weights16_bytes() const { return weights16_.size() * sizeof(uint16_t); }
  // weights16 [begin, begin + n) rounded from the weights (one launch); nothing without the copy.
  void round_weights16(size_t begin, size_t n) {
    if (!weights16_.empty()) rounded_once(w_ + begin, n, weights16_.data() + begin);
  }
  bool allocated() const { return allocated_; }

  // Initialises every parameter from (seed, parameter name, logical element index), so a sharded
  // model (any block of any parameter, on any pipeline stage) gets exactly the unsharded values.
  // With one_weight_copy() each node's first rank writes them and the others wait (collective).
  void init(uint64_t seed, double init_scale) {
    if (!writes_all_weights()) return publish_weights();
    init_values(seed, init_scale);
    publish_weights();
  }

  void zero_grad() { fill_with(g_, total_, T(0)); }  // on the current device

  T* weights() { return w_; }
  T* grads() { return g_; }
  const T* weights() const { return w_; }
  const T* grads() const { return g_; }
  size_t size() const { return total_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  std::vector<ParamInfo>& infos() { return infos_; }

 private:
  void init_values(uint64_t seed, double init_scale) {
    for (size_t i = 0; i < infos_.size(); ++i) {
      const ParamInfo& p = infos_[i];
      T* w = w_ + p.flat_offset;
      if (p.init == InitKind::Zeros || p.init == InitKind::Ones) {
        fill_with(w, p.size, p.init == InitKind::Ones ? T(1) : T(0));
        continue;
      }
      const int dims = int(p.local_shape.size());
      if (dims > TruncatedNormalInit<T>::kMaxDims || p.logical_shape.size() != p.local_shape.size() ||
          p.offset.size() != p.local_shape.size())
        throw std::logic_error("ParamStore::init: " + p.name + ": more than 4 dimensions, or shapes of unequal rank");
      TruncatedNormalInit<T> body{.w = w,
                                  .rng = Rng{seed ^ fnv1a64(p.name), 0, 0, RngPurpose::Init},
                                  .std = std::sqrt(init_scale / p.fan_in),
                                  .dims = dims,
                                  .local_shape = {},
                                  .offset = {},
                                  .logical_shape = {}};
      for (int d = 0; d < dims; ++d) {
        body.local_shape[d] = p.local_shape[size_t(d)];
        body.offset[d] = p.offset[size_t(d)];
        body.logical_shape[d] = p.logical_shape[size_t(d)];
      }
      for_each_index(int64_t(p.size), body, 64);
    }
  }

  std::vector<ParamInfo> infos_;
  std::vector<ParamView<T>*> views_;
  Buffer<T> weights_, grads_;  // unless node-shared
  Buffer<uint16_t> weights16_;  // weights16(), or empty
  T* w_ = nullptr;
  T* g_ = nullptr;
  Comm* share_ = nullptr;  // node-shared: the Comm whose memory w_ and g_ are
  bool one_weight_copy_ = false;  // w_ and g_ in windows of their own, w_ the node's one copy
  size_t total_ = 0;
  bool allocated_ = false;
};

}  // namespace meshmoe
