// GPU time per queued launch (docs/gpu.md, MESHMOE_DEVICE_PROFILE=1): with the variable set,
// every kernel, GEMM and zeroing that the CUDA path queues is bracketed by two CUDA events; when
// the host next waits (device_synchronize), the finished pairs are summed per kernel body or GEMM
// shape, and at exit the table goes to stderr, largest total first, with each GEMM shape's
// TFLOP/s and the device's busy time against the wall time since the first launch. The events
// cost host time per launch: a profile, not a timing run.
#pragma once
#include <string>

namespace meshmoe {

bool cuda_profiling();  // MESHMOE_DEVICE_PROFILE is set and not "0" (read once)
// Around one launch on the stream: begin before it, end after it with the name of what ran and
// its floating-point operations (0 for kernels).
void cuda_profile_begin();
void cuda_profile_end(std::string what, double flops = 0);
// launch() between the two events when profiling; name() (what ran) is built only then.
template <class Launch, class Name>
void profiled(const Launch& launch, const Name& name, double flops = 0) {
  if (!cuda_profiling()) return launch();
  cuda_profile_begin();
  launch();
  cuda_profile_end(name(), flops);
}
// After the host waited for the device: adds the finished launches to the totals.
void cuda_profile_collect();
// Forgets the totals so far (the trainer, after its first step: start-up is not a step's profile).
// A no-op without the variable, and in a build without CUDA.
void cuda_profile_restart();
// "sgemm NT 8192x3072x1024 (x16)" style names for the GEMMs.
std::string gemm_profile_name(const char* kind, bool trans_a, bool trans_b, int M, int N, int K, int count = 1);

}  // namespace meshmoe
