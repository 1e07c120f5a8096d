// MESHMOE_HD marks a function that runs on the host and, compiled by nvcc, on a CUDA device: the
// bodies of the layers' loops (src/tensor/launch.hpp) and what they call (Philox, activations).
#pragma once

#if defined(__CUDACC__)
#define MESHMOE_HD __host__ __device__
#else
#define MESHMOE_HD
#endif
