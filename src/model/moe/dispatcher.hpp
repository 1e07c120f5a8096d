// Local permutation between token order [N, M] and the expert buffers [E, G, C, M], driven by the
// router's (expert, slot, gate) triples (Tutel / Megatron style index form: the fast path).
//
// The buffer is GShard's EGCM order (Algorithm 2 line 3): expert-major, so that splitting it over the
// expert dimension for an all-to-all is a contiguous split. This class never communicates: a
// dispatcher that moves the buffers between ranks (all-to-all over the expert axis, or index-select +
// all-reduce) goes between dispatch() and the experts, and between the experts and combine().
#pragma once
#include <cstdint>
#include <vector>

#include "model/moe/router.hpp"

namespace meshmoe {

template <typename T>
class IndexDispatcher {
 public:
  // Builds the slot -> token maps of routing r. token_offset: global index of local token 0.
  void plan(const Routing<T>& r, uint64_t token_offset);

  // x [N, M] -> buf [E, G, C, M] (overwritten; zeros in unused slots)
  void dispatch(const Routing<T>& r, const T* x, T* buf, int M) const;
  // dbuf [E, G, C, M] -> dx [N, M] (added)
  void dispatch_backward(const Routing<T>& r, const T* dbuf, T* dx, int M) const;

  // out [E, G, C, M] -> y [N, M] (overwritten): y[n] = sum over n's dispatched choices of
  // gate * out[e, g, slot] (GShard Algorithm 2 line 8 in index form)
  void combine(const Routing<T>& r, const T* out, T* y, int M) const;
  // dy [N, M], out [E, G, C, M] -> dout [E, G, C, M] (overwritten), dgate [N*k] (overwritten;
  // dgate = <dy[n], out[e, g, slot]>, 0 where not dispatched)
  void combine_backward(const Routing<T>& r, const T* dy, const T* out, T* dout, T* dgate, int M) const;

  // [E*G*C] global token index in each slot, -1 for an empty slot (keys the expert dropout).
  const std::vector<int64_t>& slot_token_global() const { return slot_global_; }
  // [E*G*C] local token index in each slot, -1 for an empty slot.
  const std::vector<int>& slot_token() const { return slot_token_; }

 private:
  std::vector<int> slot_token_;
  std::vector<int64_t> slot_global_;
};

}  // namespace meshmoe
