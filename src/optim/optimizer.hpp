// The optimizer interface: an optimizer updates the parameters a rank owns, in place, in the flat
// ParamStore (src/model/params.hpp), from the gradients in the same store.
//
// Contract shared by AdamW and Adafactor:
// - "Owned entries" are indices into store.infos(). A rank updates only those; the trainer decides
//   ownership (all entries on a single rank; later a subset per rank). State is allocated for the
//   owned entries at construction and the store's layout must not change afterwards.
// - step(store, lr, t, grad_scale): t is the 1-based number of this update (the first update is
//   t = 1); lr is the learning rate of this update, from the Schedule (schedule.hpp); grad_scale is
//   global-norm clipping's factor (grad_clip.hpp, 1 = none): the update sees g * float(grad_scale),
//   the same product scale_grads would store. AdamW forms it as it reads g (one pass less over the
//   gradients, docs/ARCHITECTURE.md "One training step") and leaves the gradients unchanged;
//   Adafactor, which reads them several times, scales them in place first.
//   Neither optimizer keeps a step counter: a resumed run passes the checkpointed t.
//   Where the store keeps a bf16 copy of the weights (ParamStore::weights16), the update writes
//   each owned element's copy in the same pass as its new value.
// - state(): every piece of optimizer state as a named tensor (for checkpoints), in owned-entry
//   order. Names are "<param name>/<slot>"; slots: AdamW "exp_avg", "exp_avg_sq" (param's shape);
//   Adafactor "v" (unfactored, param's shape), or "v_row" (shape without the last dim) and
//   "v_col" (shape without the second-to-last dim) for factored params. Shapes and offsets are in
//   logical (unsharded) coordinates like ParamInfo, so a checkpoint writes them as hyperslabs;
//   a factored accumulator of a param split along the reduced dim is replicated over the ranks
//   holding that param's blocks (identical values on each).
// - A parameter whose block is split along a dimension that Adafactor reduces over (row/column
//   means, RMS of the update) needs sums over the ranks holding the other blocks: the optimizer calls
//   the DimReduce given at construction. AdamW is element-wise and needs none.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deck/config.hpp"
#include "model/params.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

struct StateTensor {
  std::string name;                    // "<param name>/<slot>", e.g. "blocks.0.mlp.w1/exp_avg"
  std::vector<int64_t> logical_shape;  // unsharded
  std::vector<int64_t> local_shape;    // the block this rank holds
  std::vector<int64_t> offset;         // block start in logical coordinates
  Buffer<float>* data = nullptr;  // local values, row-major in local_shape; owned by the optimizer
};

// Sums buf[0..n) element-wise, in place, over the ranks that hold the other blocks of parameter p
// along dimension `dim` (ranks whose blocks differ from this one only in that dimension). Called
// only for dims with local_shape[dim] < logical_shape[dim], by every rank of that group in the same
// order (owned-entry order), so it may be a collective. Empty = every owned param is whole.
using DimReduce = std::function<void(const ParamInfo& p, int dim, double* buf, size_t n)>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step(ParamStore<float>& store, double lr, int64_t t, double grad_scale = 1.0) = 0;
  virtual std::vector<StateTensor> state() = 0;
  // run.cuda_graphs (tensor/device_graph.hpp): step() captures its update at the first step and
  // launches it as a device graph from then on, the step's values read from a device Buffer. False
  // (and nothing changes) where the update is not one static piece of device work (Adafactor: a
  // parameter split over ranks sums over them, DimReduce's collectives, between its launches).
  virtual bool set_update_graph(bool on) { return !on; }

 protected:
  Optimizer(const ParamStore<float>& store, std::vector<size_t> owned);
  // Throws std::logic_error when the store no longer matches the layout seen at construction.
  void check_layout(const ParamStore<float>& store, int64_t t) const;
  std::vector<size_t> owned_;
  size_t store_size_ = 0;
};

// Sum of v[i]^2 over [0, n), in double: partial sums per chunk in a body (into `partials`, grown
// as needed, so callers can keep it between calls), their sum in chunk order here.
template <typename T>
double sum_squares(const T* v, size_t n, Buffer<double>& partials);
// Its parts: the number of chunk sums of n elements, and those sums queued on the device into
// partials[0, chunks) (a transfer point must come before the host reads them).
template <typename T>
int64_t sum_squares_chunks(size_t n);
template <typename T>
void queue_sum_squares(const T* v, size_t n, double* partials);

// Every entry of the store (what a single rank owns).
std::vector<size_t> all_entries(const ParamStore<float>& store);

// The optimizer named by cfg.optim.name (AdamW or Adafactor), with its cfg.optim settings.
// Throws InputError for an unknown name.
std::unique_ptr<Optimizer> make_optimizer(const Config& cfg, const ParamStore<float>& store,
                                          std::vector<size_t> owned, DimReduce reduce = {});
inline std::unique_ptr<Optimizer> make_optimizer(const Config& cfg, const ParamStore<float>& store) {
  return make_optimizer(cfg, store, all_entries(store));
}

}  // namespace meshmoe
