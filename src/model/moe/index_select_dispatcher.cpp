#include "model/moe/index_select_dispatcher.hpp"

#include <stdexcept>
#include <string>

#include "tensor/elementwise.hpp"

namespace meshmoe {

template <typename T>
IndexSelectDispatcher<T>::IndexSelectDispatcher(const Placement& place, int E, int M)
    : comm_(place.tensor),
      tensor_size_(place.tensor_size),
      experts_(split_evenly(E, place.tensor_rank, place.tensor_size)),
      M_(M),
      local_(E, M, DispatchLayout{experts_.offset, experts_.local}) {
  if (tensor_size_ > 1 && (!comm_ || comm_->size() != tensor_size_ || comm_->rank() != place.tensor_rank))
    throw std::logic_error("IndexSelectDispatcher: the tensor Comm does not match tensor_size / tensor_rank");
}

// out [rows, M] -> partial y [N, M] (+ the shared experts' partial output) -> y, summed over tensor
template <typename T>
void IndexSelectDispatcher<T>::combine(const StepContext& ctx, const Routing<T>& r, const T* shared, T* y) {
  local_.combine(ctx, r, shared, y);
  reduce_output(ctx, y, size_t(r.N) * size_t(M_));
}

template <typename T>
void IndexSelectDispatcher<T>::combine_backward(const StepContext& ctx, const Routing<T>& r, const T* dy) {
  local_.combine_backward(ctx, r, dy);
  dx_elems_ = size_t(r.N) * size_t(M_);
}

// The partial dx starts at zero: the shared experts' partial input gradient goes in before the
// dispatch's (shared_input_grad).
template <typename T>
ExpertGradRows<T> IndexSelectDispatcher<T>::expert_grads() {
  const ExpertGradRows<T> rows = local_.expert_grads();
  fill_buffer(dxp_, dx_elems_, T(0));
  return rows;
}

// dxe [rows, M] -> partial dx [N, M], partial dgate [N k] -> summed over tensor -> dx (added)
template <typename T>
void IndexSelectDispatcher<T>::dispatch_backward(const StepContext& ctx, const Routing<T>& r, T* dx) {
  local_.dispatch_backward(ctx, r, dxp_.data());
  Buffer<T>& dgate = local_.gate_grad();
  reduce_grads(ctx, dxp_.data(), dx_elems_, dgate.data(), dgate.size());
  add_into(dx, dxp_.data(), dx_elems_);
}

template <typename T>
void IndexSelectDispatcher<T>::reduce_output(const StepContext& ctx, T* y, size_t n) {
  if (tensor_size_ == 1) return;
  ScopedPhase t(ctx.timers, "moe_allreduce");
  comm_->all_reduce(y, n, Op::Sum);
}

template <typename T>
void IndexSelectDispatcher<T>::reduce_grads(const StepContext& ctx, T* dx_partial, size_t n_dx, T* dgate,
                                            size_t n_gate) {
  if (tensor_size_ == 1) return;
  pack_.resize(n_dx + n_gate);
  copy_from(pack_.data(), dx_partial, n_dx);
  copy_from(pack_.data() + n_dx, dgate, n_gate);
  {
    ScopedPhase t(ctx.timers, "moe_allreduce");
    comm_->all_reduce(pack_.data(), pack_.size(), Op::Sum);
  }
  copy_from(dx_partial, pack_.data(), n_dx);
  copy_from(dgate, pack_.data() + n_dx, n_gate);
}

template class IndexSelectDispatcher<float>;
template class IndexSelectDispatcher<double>;

}  // namespace meshmoe
