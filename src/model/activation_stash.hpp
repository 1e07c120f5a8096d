// Several micro-batches' saved activations for one stage (docs/ARCHITECTURE.md "Pipeline
// activations"). A layer keeps one micro-batch's saved state in its members; its
// `saved_state(f)` calls f on every member its backward reads (saved inputs, probabilities,
// routing plans, dropout masks, sizes, ...), nested layers through their own saved_state. An
// ActivationStash holds one micro-batch's copies of exactly those members: swap_with() exchanges
// them with the layer's, member by member (std::swap of vectors and scalars: O(1), no copies).
// After forward(A), swap_with (A parked), forward(B), swap_with of A's stash, the layers hold A's
// state again and backward(A) is what it would have been right after forward(A).
#pragma once
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

namespace meshmoe {

class ActivationStash {
 public:
  // Exchanges every member `layer.saved_state(f)` lists with this stash's copy. The first call
  // creates the copies (empty vectors, zero scalars); later calls must list the same types in the
  // same order.
  template <class Layer>
  void swap_with(Layer& layer) {
    size_t i = 0;
    layer.saved_state([&](auto& member) { swap_one(i++, member); });
    if (i != slots_.size()) throw std::logic_error("ActivationStash: the layer listed fewer members than before");
  }

 private:
  struct Slot {
    virtual ~Slot() = default;
  };
  template <class U>
  struct SlotOf final : Slot {
    U value{};
  };

  template <class U>
  void swap_one(size_t i, U& member) {
    if (i == slots_.size()) slots_.push_back(std::make_unique<SlotOf<U>>());
    auto* s = dynamic_cast<SlotOf<U>*>(slots_[i].get());
    if (!s) throw std::logic_error("ActivationStash: the layer listed another member type than before");
    using std::swap;
    swap(member, s->value);
  }

  std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace meshmoe
