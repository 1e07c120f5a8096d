#include "model/moe/moe_layer.hpp"

#include "tensor/elementwise.hpp"

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
    : router(opt), experts(make_experts<T>(opt, placement)), opt_(opt), place_(placement) {
  opt_.validate();
  if (place_.expert_parallel_data())
    a2a = std::make_unique<AllToAllDispatcher<T>>(place_, opt.num_experts, opt.d_model);
  if (place_.expert_parallel_tensor())
    isel = std::make_unique<IndexSelectDispatcher<T>>(place_, opt.num_experts);
  if (opt.shared_experts > 0) {
    shared = std::make_unique<MLP<T>>(place_.shared_shape(opt.d_model, opt.shared_hidden(), opt.activation), 0.0,
                                      opt.layer_id);
    // Experts over tensor: the combine's all-reduce sums the shared partial output too (header).
    if (shared->sharded() && !isel)
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

// The router's totals into stats_ (dispatch: the wait for them is also the row counts' wait).
template <typename T>
void MoeLayer<T>::record_stats() {
  router.read_totals();
  const Routing<T>& r = router.routing();
  stats_.aux_sum = router.aux_sum;
  stats_.z_sum = router.z_sum;
  stats_.load.assign(r.load.begin(), r.load.end());
  stats_.wanted = r.wanted;
  stats_.dropped = r.dropped;
  stats_.rerouted = r.rerouted;
  stats_.declined = r.declined;
  stats_.tokens = r.N;
  stats_.second_choices = int64_t(r.N) * (r.k - 1);
  stats_.capacity = r.C;
  stats_.entropy_sum = router.entropy_sum;
  stats_.bias_max_abs = router.bias_max_abs();
  stats_.experts_per_token = r.experts_per_token;
}

// Capacity routing: the row buffers get the room of the full [E, G, C, M] layout once, what the
// memory plan counts (train/memory.cpp), so that no step reallocates them as the filled rows vary.
// A capacity that reaches the group (C >= S: dropless routing, a large capacity factor, dropless
// decoding) keeps its buffers at the filled rows: the full layout would be E times the tokens.
template <typename T>
void MoeLayer<T>::reserve_full_layout(const Routing<T>& r) {
  if (r.C >= r.S) return;
  const size_t M = size_t(opt_.d_model), GC = size_t(r.G) * size_t(r.C);
  const size_t token_side = size_t(isel ? isel->e_local() : r.E) * GC;
  // all-to-all: every source rank sends at most G*C rows per expert
  const size_t sources = a2a ? size_t(place_.expert_parallel) : 1;
  const size_t expert_side = size_t(experts.e_local()) * sources * GC;
  dispatcher.reserve(token_side);
  experts.reserve(expert_side, sources * GC);
  if (a2a) a2a->reserve(expert_side);
  buf_.reserve(token_side * M);
  out_.reserve(token_side * M);
  reserve_token_side_ = token_side;  // for the backward scratch
  reserve_expert_side_ = expert_side;
}

// x [N, M] -> buf [rows, M] (local, expert-major) -> xin [rows', M] (all-to-all path)
template <typename T>
void MoeLayer<T>::dispatch(const StepContext& ctx, const T* x) {
  const Routing<T>& r = router.routing();
  const int M = opt_.d_model;
  // Only the filled slots get a row (dispatcher.hpp): an empty slot of the [E, G, C, M] form would
  // be an all-zero row through every expert GEMM, and moves over the all-to-all for nothing.
  // The layer's one wait: the router's totals and the row counts are read together.
  dispatcher.count_rows(r, isel ? isel->layout() : DispatchLayout{});
  record_stats();
  dispatcher.map_rows(r, ctx.token_offset);
  reserve_full_layout(r);
  buf_.resize(dispatcher.rows() * M);
  dispatcher.dispatch(r, x, buf_.data(), M);
  if (a2a) {
    a2a->plan(ctx, dispatcher.expert_rows(), dispatcher.slot_token_global().data());
    xin_.resize(a2a->expert_rows_total() * M);
    a2a->to_experts(ctx, buf_.data(), xin_.data());
  }
}

template <typename T>
void MoeLayer<T>::run_experts(const StepContext& ctx) {
  if (a2a) {
    expert_side_elems_ = xin_.size();
    xout_.resize(xin_.size());
    experts.forward(ctx, xin_.data(), xout_.data(), a2a->expert_rows(), a2a->expert_row_token().data());
    Buffer<T>().swap(xin_);
  } else {
    out_.resize(buf_.size());
    experts.forward(ctx, buf_.data(), out_.data(), dispatcher.expert_rows(), dispatcher.slot_token_global().data());
  }
}

// x [N, M] -> shared_out [N, M]: the shared experts' sum (this rank's partial sum with isel)
template <typename T>
void MoeLayer<T>::run_shared(const StepContext& ctx, const T* x, int N) {
  shared_out_.resize(size_t(N) * opt_.d_model);
  ScopedPhase t(ctx.timers, "expert");
  shared->forward(ctx, x, shared_out_.data(), N);
}

// xout [rows', M] -> out [rows, M] (all-to-all path) -> y [N, M] (+ shared_out) (-> all-reduce,
// index-select path)
template <typename T>
void MoeLayer<T>::combine(const StepContext& ctx, T* y) {
  const int M = opt_.d_model;
  const size_t NM = size_t(router.routing().N) * M;
  if (a2a) {
    out_.resize(buf_.size());
    a2a->from_experts(ctx, xout_.data(), out_.data());
    Buffer<T>().swap(xout_);
  }
  dispatcher.combine(router.routing(), out_.data(), y, M);
  if (shared) add_into(y, shared_out_.data(), NM);  // DeepSeekMoE eq. 3: routed + shared
  if (isel) isel->reduce_output(ctx, y, NM);
}

template <typename T>
void MoeLayer<T>::forward(const StepContext& ctx, const T* x, T* y, int N) {
  {
    ScopedPhase t(ctx.timers, "gate");
    router.route(ctx, x, N);
  }
  {
    ScopedPhase t(ctx.timers, "dispatch");
    dispatch(ctx, x);
  }
  {
    ScopedPhase t(ctx.timers, "expert");
    run_experts(ctx);
  }
  if (shared) run_shared(ctx, x, N);
  ScopedPhase t(ctx.timers, "combine");
  combine(ctx, y);
}

// dy [N, M] -> dout [rows, M], dgate [N*k] -> (all-to-all) -> experts -> (all-to-all) -> dbuf [rows, M]
// -> dx [N, M] (dispatch path; summed over tensor with dgate on the index-select path) -> router
template <typename T>
void MoeLayer<T>::backward(const StepContext& ctx, const T* dy, T* dx, int N, double aux_weight, double z_weight) {
  const Routing<T>& r = router.routing();
  const int M = opt_.d_model;
  const size_t NM = size_t(N) * M;
  dout_.reserve(reserve_token_side_ * M);
  dxe_.reserve(reserve_expert_side_ * M);
  dout_.resize(out_.size());
  dgate_.resize(size_t(N) * r.k);
  {
    ScopedPhase t(ctx.timers, "combine");
    dispatcher.combine_backward(r, dy, out_.data(), dout_.data(), dgate_.data(), M);
    if (a2a) {
      dexp_.resize(expert_side_elems_);
      a2a->to_experts(ctx, dout_.data(), dexp_.data());
    }
  }
  fill_buffer(dxe_, a2a ? expert_side_elems_ : buf_.size(), T(0));
  {
    ScopedPhase t(ctx.timers, "expert");
    experts.backward(ctx, a2a ? dexp_.data() : dout_.data(), dxe_.data());
    if (a2a) Buffer<T>().swap(dexp_);  // alive only during the pass, as xin_ and xout_
  }
  // With isel dxp_ is this rank's partial dx: the shared experts' partial input gradient goes in
  // before the dispatch's all-reduce (header).
  if (isel) fill_buffer(dxp_, NM, T(0));
  if (shared) {
    ScopedPhase t(ctx.timers, "expert");
    shared->backward(ctx, dy, isel ? dxp_.data() : dx, N);
  }
  {
    ScopedPhase t(ctx.timers, "dispatch");
    // All-to-all path: the input gradient rows come back into dout_ (token side, free again).
    if (a2a) a2a->from_experts(ctx, dxe_.data(), dout_.data());
    const T* db = a2a ? dout_.data() : dxe_.data();
    if (isel) {
      dispatcher.dispatch_backward(r, db, dxp_.data(), M);
      isel->reduce_grads(ctx, dxp_.data(), NM, dgate_.data(), dgate_.size());
      add_into(dx, dxp_.data(), NM);
    } else {
      dispatcher.dispatch_backward(r, db, dx, M);
    }
  }
  ScopedPhase t(ctx.timers, "gate");
  router.backward(ctx, dgate_.data(), dx, N, aux_weight, z_weight);
}

template class MoeLayer<float>;
template class MoeLayer<double>;

}  // namespace meshmoe
