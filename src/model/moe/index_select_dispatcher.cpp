#include "model/moe/index_select_dispatcher.hpp"

#include <stdexcept>
#include <string>

#include "tensor/elementwise.hpp"

namespace meshmoe {

template <typename T>
IndexSelectDispatcher<T>::IndexSelectDispatcher(const Placement& place, int E)
    : comm_(place.tensor), tensor_size_(place.tensor_size), experts_(split_evenly(E, place.tensor_rank, place.tensor_size)) {
  if (tensor_size_ > 1 && (!comm_ || comm_->size() != tensor_size_ || comm_->rank() != place.tensor_rank))
    throw std::logic_error("IndexSelectDispatcher: the tensor Comm does not match tensor_size / tensor_rank");
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
