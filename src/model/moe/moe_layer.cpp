#include "model/moe/moe_layer.hpp"

#include <algorithm>

namespace meshmoe {

template <typename T>
MoeLayer<T>::MoeLayer(const MoeOptions& opt) : router(opt), experts(opt), opt_(opt) {
  opt_.validate();
}

template <typename T>
void MoeLayer<T>::declare(ParamStore<T>& store, const std::string& prefix) {
  router.declare(store, prefix + ".router");
  experts.declare(store, prefix + ".experts");
}

template <typename T>
void MoeLayer<T>::route(const StepContext& ctx, const T* x, int N) {
  router.forward(ctx, x, N);
  const Routing<T>& r = router.routing();
  stats_.aux_sum = router.aux_sum;
  stats_.z_sum = router.z_sum;
  stats_.load = r.load;
  stats_.wanted = r.wanted;
  stats_.dropped = r.dropped;
  stats_.rerouted = r.rerouted;
  stats_.declined = r.declined;
}

template <typename T>
void MoeLayer<T>::dispatch(const T* x) {
  const Routing<T>& r = router.routing();
  rows_ = r.G * r.C;
  buf_.resize(size_t(r.E) * rows_ * opt_.d_model);
  dispatcher.dispatch(r, x, buf_.data(), opt_.d_model);
}

template <typename T>
void MoeLayer<T>::run_experts(const StepContext& ctx) {
  out_.resize(buf_.size());
  experts.forward(ctx, buf_.data(), out_.data(), rows_, dispatcher.slot_token_global().data());
}

template <typename T>
void MoeLayer<T>::combine(T* y) {
  dispatcher.combine(router.routing(), out_.data(), y, opt_.d_model);
}

// x [N, M] -> triples -> buf [E, G, C, M] -> out [E, G, C, M] -> y [N, M]
template <typename T>
void MoeLayer<T>::forward(const StepContext& ctx, const T* x, T* y, int N) {
  route(ctx, x, N);
  dispatcher.plan(router.routing(), ctx.token_offset);
  dispatch(x);
  run_experts(ctx);
  combine(y);
}

// dy [N, M] -> dout, dgate -> dbuf [E, G, C, M] -> dx [N, M] (dispatch path + router path)
template <typename T>
void MoeLayer<T>::backward(const StepContext& ctx, const T* dy, T* dx, int N, double aux_weight, double z_weight) {
  const Routing<T>& r = router.routing();
  const int M = opt_.d_model;
  std::vector<T> dout(out_.size()), dbuf(buf_.size(), T(0)), dgate(size_t(N) * r.k);
  dispatcher.combine_backward(r, dy, out_.data(), dout.data(), dgate.data(), M);
  experts.backward(ctx, dout.data(), dbuf.data(), rows_);
  dispatcher.dispatch_backward(r, dbuf.data(), dx, M);
  router.backward(ctx, dgate.data(), dx, N, aux_weight, z_weight);
}

template class MoeLayer<float>;
template class MoeLayer<double>;

}  // namespace meshmoe
