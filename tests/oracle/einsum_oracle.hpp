// TEST ONLY: GShard Algorithm 2 with dense one-hot tensors, written as plain loops, as the oracle of
// the index-form dispatch / experts / combine. Built from the same routing triples as the fast path:
//   dispatch_mask   [G, S, E, C]  1 where token s of group g sits in slot c of expert e
//   combine_weights [G, S, E, C]  the gate there
//   dispatched = einsum(GSEC,GSM->EGCM)     (line 3)
//   h          = act(einsum(EGCM,EMH->EGCH)) (lines 4-5; geglu: H' = 2H columns, then gate)
//   out        = einsum(EGCH,EHM->EGCM)      (line 6; EGCM instead of GECM, same values)
//   y          = einsum(GSEC,EGCM->GSM)      (line 8)
// No expert dropout. Quadratically slow: small sizes only.
#pragma once
#include <vector>

#include "model/activation.hpp"
#include "model/moe/router.hpp"

namespace meshmoe {

template <typename T>
class EinsumMoeOracle {
 public:
  // x [N, M], w_in [E, M, H'], w_out [E, H, M] -> y [N, M] (overwritten)
  void forward(const Routing<T>& r, Activation act, int M, int H, const T* x, const T* w_in, const T* w_out, T* y);
  // dy [N, M] -> dx [N, M], dw_in, dw_out (added); dgate [N*k] (overwritten: d loss / d combine
  // weight at each choice's (e, slot), 0 where not dispatched). Uses what forward saved.
  void backward(const T* dy, T* dx, T* dw_in, T* dw_out, T* dgate);

  std::vector<T> dispatch_mask, combine_weights;  // [G, S, E, C]

 private:
  const Routing<T>* r_ = nullptr;
  Activation act_ = Activation::Relu;
  int M_ = 0, H_ = 0;
  const T *x_ = nullptr, *w_in_ = nullptr, *w_out_ = nullptr;
  std::vector<T> disp_, pre_, h_, out_;  // [E, G, C, M], [E, G, C, H'], [E, G, C, H], [E, G, C, M]
};

}  // namespace meshmoe
