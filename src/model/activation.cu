// The activations' loop bodies on the GPU (tensor/launch_cuda.cuh).
#include "model/activation_bodies.hpp"
#include "tensor/launch_cuda.cuh"

#define MESHMOE_ACTIVATION_BODIES(T, A)                                        \
  MESHMOE_CUDA_BODY(meshmoe::ActivationForward<T, meshmoe::Activation::A>) \
  MESHMOE_CUDA_BODY(meshmoe::ActivationBackward<T, meshmoe::Activation::A>)

MESHMOE_ACTIVATION_BODIES(float, Relu)
MESHMOE_ACTIVATION_BODIES(float, Gelu)
MESHMOE_ACTIVATION_BODIES(float, Geglu)
MESHMOE_ACTIVATION_BODIES(float, Swiglu)
MESHMOE_ACTIVATION_BODIES(double, Relu)
MESHMOE_ACTIVATION_BODIES(double, Gelu)
MESHMOE_ACTIVATION_BODIES(double, Geglu)
MESHMOE_ACTIVATION_BODIES(double, Swiglu)
