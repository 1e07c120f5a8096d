// A build without nvcc (make CUDA=0): the CUDA entry points of tensor/ as stand-ins that say so.
// Nothing reaches them but a run that asked for the GPU (select_device refuses it first) or a test.
#ifndef MESHMOE_CUDA
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "tensor/cuda_gemm_bf16.hpp"
#include "tensor/cuda_gemm_grouped.hpp"
#include "tensor/cuda_profile.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

const DeviceBackend* cuda_backend() { return nullptr; }
bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }
void cuda_bind(int) { throw Error("this meshmoe was built without CUDA (make CUDA=1 on a machine with nvcc)"); }
std::string cuda_device_name() { return "none"; }

void cuda_gemm(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*, int) {
  throw Error("cuda_gemm: built without CUDA");
}
void cuda_gemm(bool, bool, int, int, int, double, const double*, int, const double*, int, double, double*, int) {
  throw Error("cuda_gemm: built without CUDA");
}
void cuda_gemm_strided_batched(bool, bool, int, int, int, float, const float*, int, int64_t, const float*, int, int64_t,
                               float, float*, int, int64_t, int) {
  throw Error("cuda_gemm_strided_batched: built without CUDA");
}
void cuda_gemm_strided_batched(bool, bool, int, int, int, double, const double*, int, int64_t, const double*, int,
                               int64_t, double, double*, int, int64_t, int) {
  throw Error("cuda_gemm_strided_batched: built without CUDA");
}

void cuda_gemm_bf16(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*, int,
                    const uint16_t*, const uint16_t*) {
  throw Error("cuda_gemm_bf16: built without CUDA");
}
void cuda_round_to_bf16(const float*, int64_t, uint16_t*) { throw Error("cuda_round_to_bf16: built without CUDA"); }
void cuda_gemm_bf16_strided_batched(bool, bool, int, int, int, float, const float*, int, int64_t, const float*, int,
                                    int64_t, float, float*, int, int64_t, int) {
  throw Error("cuda_gemm_bf16_strided_batched: built without CUDA");
}
bool cuda_gemm_bf16_two_level_batched(bool, bool, int, int, int, float, const float*, int, int64_t, int64_t,
                                      const float*, int, int64_t, int64_t, float, float*, int, int64_t, int64_t, int,
                                      int, const uint16_t*, const uint16_t*) {
  throw Error("cuda_gemm_bf16_two_level_batched: built without CUDA");
}
void cuda_gemm_grouped(bool, bool, float, float, const GemmGroup<float>*, int) {
  throw Error("cuda_gemm_grouped: built without CUDA");
}
void cuda_gemm_grouped(bool, bool, double, double, const GemmGroup<double>*, int) {
  throw Error("cuda_gemm_grouped: built without CUDA");
}
void cuda_gemm_grouped_bf16(bool, bool, float, float, const GemmGroup<float>*, int) {
  throw Error("cuda_gemm_grouped_bf16: built without CUDA");
}
void cuda_profile_restart() {}

}  // namespace meshmoe
#endif
