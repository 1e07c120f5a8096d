#include "tensor/gemm_rate.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <vector>

#include "core/error.hpp"
#include "core/timers.hpp"
#include "tensor/blas.hpp"
#include "tensor/device.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/host_threads.hpp"

namespace meshmoe {

double sgemm_rate(int n, double seconds, int per_wait) {
  const size_t nn = size_t(n) * n;
  Buffer<float> a, b, c(nn);  // on the current device, written there
  fill_buffer(a, nn, 0.5f);
  fill_buffer(b, nn, 0.25f);
  matmul(false, false, n, n, n, a.data(), b.data(), c.data());                     // warm-up
  device_synchronize();
  double best = 0, spent = 0;
  while (spent < seconds) {
    const double t0 = wall_seconds();
    for (int i = 0; i < per_wait; ++i) matmul(false, false, n, n, n, a.data(), b.data(), c.data());
    device_synchronize();
    const double dt = wall_seconds() - t0;
    spent += dt;
    best = std::max(best, 2.0 * n * n * n * per_wait / dt);
  }
  return best;
}

// On a GPU the model's GEMM (cuBLAS fp32, or bf16 with its operands' rounding) at a size that fills
// it, several between waits: at n = 1024 a GPU's rate is the launch's and the wait's, not its own.
// n = 4096 (192 MiB of operands, which stay in the device arena for the model's later use).
double measure_peak_flops() {
  if (current_device() == Device::Cuda) return sgemm_rate(4096, 0.4, 16);
  return std::max(sgemm_rate(512, 0.1), sgemm_rate(1024, 0.2));
}

namespace {
std::vector<int> parse_gemm_sizes(const std::string& text) {
  std::vector<int> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long n = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || n < 16 || n > 16384)
      throw InputError("bench-gemm: --sizes '" + text + "': '" + item + "' is not a matrix size in [16, 16384]");
    sizes.push_back(int(n));
  }
  if (sizes.empty()) throw InputError("bench-gemm: --sizes is empty; give e.g. 512,1024,2048");
  return sizes;
}
}  // namespace

int bench_gemm_main(const BenchGemmOptions& opt) {
  const std::vector<int> sizes = parse_gemm_sizes(opt.sizes);
  if (!(opt.seconds > 0 && opt.seconds <= 3600)) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", opt.seconds);
    throw InputError(std::string("bench-gemm: --seconds ") + text + ": must be in (0, 3600] (time spent per size)");
  }
  // More threads than cores only measure the threads' contention, and OpenBLAS stops at its
  // build's NUM_THREADS: refused, naming the range.
  const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  if (opt.threads < 0 || opt.threads > cores)
    throw InputError("bench-gemm: --threads " + std::to_string(opt.threads) + ": must be in [0, " + std::to_string(cores) +
                     "] (0: OPENBLAS_NUM_THREADS, or 1; at most the " + std::to_string(cores) + " cores of this node)");
  const int threads = apply_run_threads(opt.threads);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (rank == 0)
    std::printf("bench-gemm: fp32 sgemm n x n x n, %d rank%s x %d BLAS thread%s, best of %.2g s per size\n"
                "%8s  %12s\n", ranks, ranks == 1 ? "" : "s", threads, threads == 1 ? "" : "s", opt.seconds, "n", "GFLOP/s");
  double ceiling = 0;
  for (int n : sizes) {
    MPI_Barrier(MPI_COMM_WORLD);
    double rate = sgemm_rate(n, opt.seconds);
    MPI_Allreduce(MPI_IN_PLACE, &rate, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    ceiling = std::max(ceiling, rate);
    if (rank == 0) std::printf("%8d  %12.1f\n", n, rate / 1e9);
  }
  if (rank == 0) std::printf("ceiling %.1f GFLOP/s\n", ceiling / 1e9);
  return 0;
}

}  // namespace meshmoe
