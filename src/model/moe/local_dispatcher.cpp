#include "model/moe/local_dispatcher.hpp"

#include "tensor/blas.hpp"
#include "tensor/elementwise.hpp"

namespace meshmoe {

template <typename T>
LocalDispatcher<T>::LocalDispatcher(int E, int M, DispatchLayout held, bool feeds_experts)
    : M_(M), held_(held), E_held_(held.count < 0 ? E - held.e0 : held.count), feeds_experts_(feeds_experts) {}

// Capacity routing: the row buffers get the room of the full [E, G, C, M] layout once, what the
// memory plan counts (run/memory.cpp), so that no step reallocates them as the filled rows vary.
// A capacity that reaches the group (C >= S: dropless routing, a large capacity factor, dropless
// decoding) keeps its buffers at the filled rows: the full layout would be E times the tokens.
template <typename T>
void LocalDispatcher<T>::reserve_full_layout(const Routing<T>& r) {
  if (r.C >= r.S) return;
  room_per_expert_ = size_t(r.G) * size_t(r.C);
  room_ = size_t(E_held_) * room_per_expert_;
  index_.reserve(room_);
  rows_.reserve(room_ * size_t(M_));
  out_.reserve(room_ * size_t(M_));
  if (feeds_experts_ && bf16_operand_copies<T>()) rows16_.reserve(room_ * size_t(M_));
}

// x [N, M] -> rows [rows, M] (the held experts', expert-major), with their bf16 copy when they are
// the experts' input and the experts' GEMMs read copies
template <typename T>
void LocalDispatcher<T>::dispatch(const StepContext& ctx, const Routing<T>& r, const T* x,
                                  const AtDispatchWait& at_wait) {
  // Only the filled slots get a row (dispatcher.hpp): an empty slot of the [E, G, C, M] form would
  // be an all-zero row through every expert GEMM, and moves over the all-to-all for nothing.
  index_.count_rows(r, held_);
  at_wait();  // the layer's one wait: the router's totals and the row counts are read together
  index_.map_rows(r, ctx.token_offset);
  reserve_full_layout(r);
  rows_.resize(index_.rows() * size_t(M_));
  uint16_t* rows16 = feeds_experts_ ? bf16_copy_room<T>(rows16_, rows_.size()) : nullptr;
  index_.dispatch(r, x, rows_.data(), M_, rows16);
}

template <typename T>
T* LocalDispatcher<T>::output_rows() {
  out_.resize(rows_.size());
  return out_.data();
}

template <typename T>
ExpertRows<T> LocalDispatcher<T>::expert_input() {
  T* y = output_rows();
  return {rows_.data(), y, index_.expert_rows(), index_.slot_token_global().data(), room_,
          rows16_.empty() ? nullptr : rows16_.data()};
}

// out [rows, M] -> y [N, M] (+ shared [N, M]: DeepSeekMoE eq. 3, routed + shared)
template <typename T>
void LocalDispatcher<T>::combine(const StepContext& ctx, const Routing<T>& r, const T* shared, T* y) {
  index_.combine(r, out_.data(), y, M_);
  if (shared) add_into(y, shared, size_t(r.N) * size_t(M_));
}

// dy [N, M], out [rows, M] -> dout [rows, M], dgate [N k]
template <typename T>
void LocalDispatcher<T>::combine_backward(const StepContext& ctx, const Routing<T>& r, const T* dy) {
  dout_.reserve(room_ * size_t(M_));
  dout_.resize(out_.size());
  dgate_.resize(size_t(r.N) * size_t(r.k));
  index_.combine_backward(r, dy, out_.data(), dout_.data(), dgate_.data(), M_);
}

template <typename T>
ExpertGradRows<T> LocalDispatcher<T>::expert_grads() {
  dxe_.reserve(room_ * size_t(M_));
  fill_buffer(dxe_, rows_.size(), T(0));
  return {dout_.data(), dxe_.data()};
}

// dxe [rows, M] -> dx [N, M] (added)
template <typename T>
void LocalDispatcher<T>::dispatch_backward(const StepContext& ctx, const Routing<T>& r, T* dx) {
  index_.dispatch_backward(r, dxe_.data(), dx, M_);
}

template class LocalDispatcher<float>;
template class LocalDispatcher<double>;

}  // namespace meshmoe
