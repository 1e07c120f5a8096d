#include "model/layernorm.hpp"

#include "model/layer_shapes.hpp"
#include "model/layernorm_bodies.hpp"
#include "tensor/blas.hpp"
#include "tensor/launch.hpp"
#include "tensor/launch_rows.hpp"

namespace meshmoe {

template <typename T>
void LayerNorm<T>::declare(ParamStore<T>& store, const std::string& prefix) {
  if (kind_ == NormKind::LayerNorm)
    declare_params(store, norm_params(prefix, M_, kind_), {&gain, &bias});
  else
    declare_params(store, norm_params(prefix, M_, kind_), {&gain});
}

// x [N, M] -> y [N, M]
template <typename T>
void LayerNorm<T>::forward(const StepContext& ctx, const T* x, T* y, int N) {
  if (xhat_.size() < size_t(N) * M_) xhat_.resize(size_t(N) * M_);
  if (rstd_.size() < size_t(N)) rstd_.resize(N);
  uint16_t* y16 = feeds_gemms_ ? bf16_copy_room<T>(y16_, size_t(N) * M_) : nullptr;
  if (!y16) y16_ = Buffer<uint16_t>();
  if (kind_ == NormKind::RmsNorm) {
    for_each_row(N,
                 RmsNormForwardRow<T>{.x = x, .gain = gain.w, .xhat = xhat_.data(), .rstd = rstd_.data(), .y = y,
                                      .M = M_, .eps = T(eps_), .y16 = y16},
                 M_);
    return;
  }
  for_each_row(N,
               LayerNormForwardRow<T>{.x = x,
                                      .gain = gain.w,
                                      .bias = bias.w,
                                      .xhat = xhat_.data(),
                                      .rstd = rstd_.data(),
                                      .y = y,
                                      .M = M_,
                                      .eps = T(eps_),
                                      .y16 = y16},
               M_);
}

// dy [N, M] -> dx [N, M] (+=), gain.g and bias.g (+=)
template <typename T>
void LayerNorm<T>::backward(const StepContext& ctx, const T* dy, T* dx, int N) {
  const bool rms = kind_ == NormKind::RmsNorm;
  if (rms)
    for_each_row(N,
                 RmsNormBackwardRow<T>{
                     .dy = dy, .xhat = xhat_.data(), .rstd = rstd_.data(), .gain = gain.w, .dx = dx, .M = M_},
                 M_);
  else
    for_each_row(N,
                 LayerNormBackwardRow<T>{
                     .dy = dy, .xhat = xhat_.data(), .rstd = rstd_.data(), .gain = gain.w, .dx = dx, .M = M_},
                 M_);
  const int chunks = (N + LayerNormParamGradPartials<T>::kRows - 1) / LayerNormParamGradPartials<T>::kRows;
  const size_t tables = rms ? 1 : 2;  // gain's partials, and bias's (layernorm)
  if (partials_.size() < tables * size_t(chunks) * M_) partials_.resize(tables * size_t(chunks) * M_);
  T* partial_gain = partials_.data();
  T* partial_bias = rms ? nullptr : partial_gain + size_t(chunks) * M_;
  for_each_index_2d(chunks, M_,
                    LayerNormParamGradPartials<T>{.dy = dy,
                                                  .xhat = xhat_.data(),
                                                  .partial_gain = partial_gain,
                                                  .partial_bias = partial_bias,
                                                  .N = N,
                                                  .M = M_});
  for_each_index(M_,
                 LayerNormParamGradSum<T>{.partial_gain = partial_gain,
                                          .partial_bias = partial_bias,
                                          .dgain = gain.g,
                                          .dbias = rms ? nullptr : bias.g,
                                          .chunks = chunks,
                                          .M = M_},
                 chunks);
}

template class LayerNorm<float>;
template class LayerNorm<double>;

}  // namespace meshmoe
