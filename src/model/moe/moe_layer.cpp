#include "model/moe/moe_layer.hpp"

#include "tensor/step_scalars.hpp"

namespace meshmoe {

namespace {
// Experts of this rank: [e0, e0 + E_local) and hidden units [h0, h0 + H_local).
template <typename T>
Experts<T> make_experts(const MoeOptions& opt, const Placement& p) {
  p.validate_experts(opt.num_experts, opt.d_ff, opt.shared_hidden());
  return Experts<T>(opt, p.expert_shape(opt.d_model, opt.num_experts, opt.d_ff, opt.activation),
                    p.hidden_split() ? p.tensor : nullptr);
}
}  // namespace

template <typename T>
MoeLayer<T>::MoeLayer(const MoeOptions& opt, const Placement& placement)
    : router(opt),
      experts(make_experts<T>(opt, placement)),
      dispatcher(placement, opt.num_experts, opt.d_model),
      opt_(opt),
      place_(placement) {
  opt_.validate();
  if (opt.shared_experts > 0) {
    shared = std::make_unique<MLP<T>>(place_.shared_shape(opt.d_model, opt.shared_hidden(), opt.activation), 0.0,
                                      opt.layer_id);
    // Experts over tensor: the dispatcher's all-reduces sum the shared partial sums too (header).
    if (shared->sharded() && !dispatcher.folds_shared_partial_sums())
      shared->tensor_allreduce = [comm = place_.tensor](T* buf, size_t n) { comm->all_reduce(buf, n, Op::Sum); };
  }
}

template <typename T>
void MoeLayer<T>::declare(ParamStore<T>& store, const std::string& prefix) {
  router.declare(store, prefix + ".router");
  experts.declare(store, prefix + ".experts");
  if (shared)
    declare_params(store,
                   shared_expert_params(prefix + ".shared", place_.shared_shape(opt_.d_model, opt_.shared_hidden(), opt_.activation),
                                        opt_.d_ff),
                   {&shared->w_in, &shared->w_out});
}

// The router's totals into stats_, read with the step's other scalars while a training step
// collects them (tensor/step_scalars.hpp), else at once (called in dispatch, whose row counts' wait
// then reads them too). The routing's shapes are this forward's, taken now.
template <typename T>
void MoeLayer<T>::record_stats() {
  const Routing<T>& r = router.routing();
  const int64_t N = r.N, k = r.k, C = r.C;
  step_scalars().defer(router.totals().data(), router.totals().size() * sizeof(double), [this, N, k, C](const void* host) {
    router.take_totals(static_cast<const double*>(host));
    const Routing<T>& r = router.routing();
    stats_.aux_sum = router.aux_sum;
    stats_.z_sum = router.z_sum;
    stats_.load.assign(r.load.begin(), r.load.end());
    stats_.wanted = r.wanted;
    stats_.dropped = r.dropped;
    stats_.rerouted = r.rerouted;
    stats_.declined = r.declined;
    stats_.expert_dropped = r.expert_dropped;
    stats_.expert_rerouted = r.expert_rerouted;
    stats_.expert_declined = r.expert_declined;
    stats_.tokens = N;
    stats_.second_choices = N * (k - 1);
    stats_.capacity = C;
    stats_.entropy_sum = router.entropy_sum;
    stats_.bias_max_abs = router.bias_max_abs();
    stats_.experts_per_token = r.experts_per_token;
  });
}

// x [N, M] -> shared_out [N, M]: the shared experts' sum (this rank's partial sum when the
// dispatcher folds it into its all-reduce)
template <typename T>
void MoeLayer<T>::run_shared(const StepContext& ctx, const T* x, int N) {
  shared_out_.resize(size_t(N) * opt_.d_model);
  ScopedPhase t(ctx.timers, "expert");
  shared->forward(ctx, x, shared_out_.data(), N);
}

// route -> dispatch -> experts (+ shared experts) -> combine
template <typename T>
void MoeLayer<T>::forward(const StepContext& ctx, const T* x, T* y, int N) {
  {
    ScopedPhase t(ctx.timers, "gate");
    router.route(ctx, x, N);
  }
  const Routing<T>& r = router.routing();
  {
    ScopedPhase t(ctx.timers, "dispatch");
    dispatcher.dispatch(ctx, r, x, [this] { record_stats(); });
  }
  {
    ScopedPhase t(ctx.timers, "expert");
    experts.forward(ctx, dispatcher.expert_input());
    dispatcher.release_expert_input();
  }
  if (shared) run_shared(ctx, x, N);
  ScopedPhase t(ctx.timers, "combine");
  dispatcher.combine(ctx, r, shared ? shared_out_.data() : nullptr, y);
}

// combine -> experts (+ shared experts) -> dispatch -> route, each the backward of its forward stage
template <typename T>
void MoeLayer<T>::backward(const StepContext& ctx, const T* dy, T* dx, int N, double aux_weight, double z_weight) {
  const Routing<T>& r = router.routing();
  {
    ScopedPhase t(ctx.timers, "combine");
    dispatcher.combine_backward(ctx, r, dy);
  }
  const ExpertGradRows<T> grads = dispatcher.expert_grads();
  {
    ScopedPhase t(ctx.timers, "expert");
    experts.backward(ctx, grads);
    dispatcher.release_expert_input();
  }
  if (shared) {
    T* dxs = dispatcher.shared_input_grad(dx);
    ScopedPhase t(ctx.timers, "expert");
    shared->backward(ctx, dy, dxs, N);
  }
  {
    ScopedPhase t(ctx.timers, "dispatch");
    dispatcher.dispatch_backward(ctx, r, dx);
  }
  ScopedPhase t(ctx.timers, "gate");
  router.backward(ctx, dispatcher.gate_grad(), dx, N, aux_weight, z_weight);
}

template class MoeLayer<float>;
template class MoeLayer<double>;

}  // namespace meshmoe
