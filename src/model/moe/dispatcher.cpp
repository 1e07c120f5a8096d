#include "model/moe/dispatcher.hpp"

#include <string>

#include "core/error.hpp"
#include "model/moe/dispatcher_bodies.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

// The rows of each (expert, group) and their offsets, on the device (dispatcher_bodies.hpp).
template <typename T>
void IndexDispatcher<T>::count_rows(const Routing<T>& r, DispatchLayout layout) {
  e0_ = layout.e0;
  el_ = layout.count < 0 ? r.E - e0_ : layout.count;
  const int G = r.G;
  fill_.resize(size_t(el_) * G);
  start_.resize(size_t(el_) * G);
  bad_.resize(size_t(G));
  sizes_.resize(size_t(el_) + 2);
  for_each_index(G, PlanFillGroup{r.expert.data(), r.slot.data(), fill_.data(), bad_.data(), r.S, r.k, r.E, r.C, e0_, el_, G},
                 int64_t(r.S) * r.k);
  for_each_index(1, PlanStarts{fill_.data(), bad_.data(), start_.data(), sizes_.data(), el_, G});
}

// The host sizes the maps from the counts (a transfer point), then every choice's row on the device.
template <typename T>
void IndexDispatcher<T>::map_rows(const Routing<T>& r, uint64_t token_offset) {
  const int El = el_;
  std::vector<int64_t> sizes(sizes_.size());
  download(sizes_, 0, sizes.size(), sizes.data());  // a transfer point: the host reads the row counts
  if (const int64_t c = sizes[size_t(El) + 1]; c >= 0)
    throw Error("MoE routing: choice " + std::to_string(c) + " has expert " +
                std::to_string(download_one(r.expert, size_t(c))) + " slot " +
                std::to_string(download_one(r.slot, size_t(c))) + " outside E = " + std::to_string(r.E) +
                ", C = " + std::to_string(r.C));
  expert_rows_.resize(size_t(El));
  for (int el = 0; el < El; ++el) expert_rows_[size_t(el)] = int(sizes[size_t(el)]);
  const size_t rows = size_t(sizes[size_t(El)]);
  slot_token_.resize(rows);
  slot_global_.resize(rows);
  slot_choice_.resize(rows);
  choice_row_.resize(size_t(r.N) * r.k);
  token_rows_.resize(size_t(r.N) * r.k);
  for_each_index(int64_t(rows), PlanClearRow{slot_token_.data(), slot_global_.data(), slot_choice_.data()});
  for_each_index(r.N,
                 PlanScatterToken{r.expert.data(), r.slot.data(), start_.data(), slot_token_.data(), slot_global_.data(),
                                  slot_choice_.data(), choice_row_.data(), token_rows_.data(), token_offset, r.S, r.k,
                                  e0_, El, r.G},
                 r.k);
}

template <typename T>
void IndexDispatcher<T>::reserve(size_t rows) {
  slot_token_.reserve(rows);
  slot_global_.reserve(rows);
  slot_choice_.reserve(rows);
}

// x [N, M] -> buf [rows, M]
template <typename T>
void IndexDispatcher<T>::dispatch(const Routing<T>& r, const T* x, T* buf, int M, uint16_t* buf16) const {
  for_each_index_2d(rows(), M, GatherRows<T, int>{x, slot_token_.data(), buf, M, buf16});
}

// dbuf [rows, M] -> dx [N, M] (added)
template <typename T>
void IndexDispatcher<T>::dispatch_backward(const Routing<T>& r, const T* dbuf, T* dx, int M) const {
  for_each_index_2d(r.N, M, DispatchBackwardElement<T>{dbuf, token_rows_.data(), dx, M, r.k});
}

// out [rows, M] -> y [N, M]
template <typename T>
void IndexDispatcher<T>::combine(const Routing<T>& r, const T* out, T* y, int M) const {
  for_each_index_2d(r.N, M, CombineElement<T>{out, r.gate.data(), choice_row_.data(), y, M, r.k});
}

// dy [N, M], out [rows, M] -> dout [rows, M], dgate [N*k]
template <typename T>
void IndexDispatcher<T>::combine_backward(const Routing<T>& r, const T* dy, const T* out, T* dout, T* dgate,
                                          int M) const {
  for_each_index_2d(rows(), M,
                 CombineBackwardOutElement<T>{dy, r.gate.data(), slot_choice_.data(), dout, M, r.k});
  for_each_index(int64_t(r.N) * r.k, CombineBackwardGateChoice<T>{dy, out, choice_row_.data(), dgate, M, r.k});
}

template class IndexDispatcher<float>;
template class IndexDispatcher<double>;

}  // namespace meshmoe
