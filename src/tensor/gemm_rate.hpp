// The fp32 GEMM ceiling of this machine: the rate model FLOPs utilisation (MFU) and the speed
// benchmark (bench/speed.sh) are measured against.
#pragma once
#include <string>

namespace meshmoe {

// Best rate (FLOP/s) of an n x n x n sgemm on the current device with the BLAS threads in force,
// over repeated calls that together take about `seconds` (after one warm-up call), timed
// `per_wait` calls at a time (the device waited for after each group).
double sgemm_rate(int n, double seconds, int per_wait = 1);

// This rank's peak that `meshmoe train` reports model FLOPs utilisation against: on the host the
// best of n = 512 and 1024 in about 0.3 s; on a GPU the model's GEMM (its precision's) at n = 4096,
// 16 calls per wait, in about 0.4 s.
double measure_peak_flops();

struct BenchGemmOptions {
  int threads = 0;  // BLAS threads per rank; 0 keeps OPENBLAS_NUM_THREADS (or 1)
  std::string sizes = "512,1024,2048";
  double seconds = 1.0;  // per size
};

// `meshmoe bench-gemm`: every rank measures at once (the ranks of a node share its cores as in a
// training step), rank 0 prints the rate of each size summed over ranks, and the ceiling (the best).
int bench_gemm_main(const BenchGemmOptions& opt);

}  // namespace meshmoe
