#include "run/select_device.hpp"

#include <sched.h>

#include <cstdio>

#include "core/error.hpp"
#include "mesh/agree.hpp"
#include "tensor/blas.hpp"
#include "tensor/deferred_device.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

namespace {

// Cores this process may run on (its CPU affinity: mpirun binds each rank to one core by default,
// srun to its --cpus-per-task).
int allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

}  // namespace

void warn_threads_over_cores(int threads, MPI_Comm world) {
  int cores = allowed_cores(), rank = 0;
  if (cores <= 0) cores = threads;
  MPI_Allreduce(MPI_IN_PLACE, &cores, 1, MPI_INT, MPI_MIN, world);
  MPI_Comm_rank(world, &rank);
  if (rank == 0 && threads > cores)
    std::fprintf(stderr,
                 "meshmoe: warning: %d threads per rank (run.threads) but a rank may run on only %d core%s (its CPU "
                 "affinity): the threads share %s. Launch with `mpirun --map-by slot:PE=%d` (or --bind-to none), or "
                 "`srun --cpus-per-task=%d`\n",
                 threads, cores, cores == 1 ? "" : "s", cores == 1 ? "it" : "them", threads, threads);
}

std::string select_device(Device device, Precision precision, MPI_Comm world) {
  set_gemm_precision(precision);
  const bool bf16 = precision == Precision::Bf16;
  if (device != Device::Cuda) {
    set_device(Device::Cpu);
    // Tests only (tests/scripts/deferred_device.sh): the host path run as the GPU path runs, its work
    // queued until each transfer point (tensor/deferred_device.hpp).
    // "copies": the host reaches the Buffers only through copy_to_host / copy_from_host (device
    // memory's rule, the GPU's); "list": as "copies", printing each other access; "1": any access
    // after a wait (a weaker rule, the queue's order alone).
    const std::string deferred = std::getenv("MESHMOE_TEST_DEFERRED_DEVICE") ? std::getenv("MESHMOE_TEST_DEFERRED_DEVICE") : "";
    if (deferred == "1" || deferred == "copies" || deferred == "list") {
      set_deferred_host_device(true, deferred == "1"        ? DeviceAccess::AfterWait
                                     : deferred == "copies" ? DeviceAccess::Copies
                                                            : DeviceAccess::CopiesListed);
      return "device: cpu, deferred as a GPU's work (MESHMOE_TEST_DEFERRED_DEVICE=" + deferred + ", tests only)";
    }
    return bf16 ? "device: cpu (OpenBLAS; GEMM operands rounded to bf16, fp32 sums)" : "device: cpu (OpenBLAS, fp32)";
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);

  std::string why;
  try {
    if (!cuda_compiled()) throw Error("this meshmoe was built without CUDA (nvcc not found at build time; make CUDA=1)");
    const int gpus = cuda_device_count();
    if (gpus > 0 && gpus < local_size)
      throw Error(std::to_string(local_size) + " ranks on this node share " + std::to_string(gpus) +
                  " GPU(s); run one rank per GPU (srun --gpus-per-task=1, or fewer ranks per node)");
    cuda_bind(local_rank);
    set_device(Device::Cuda);
  } catch (const std::exception& e) {
    why = e.what();
  }
  // The first failing rank tells everyone why.
  const std::string msg =
      first_error(why.empty() ? "" : "run.device = \"cuda\": rank " + std::to_string(rank) + " on " + host_name() + ": " + why, world);
  if (!msg.empty()) {
    set_device(Device::Cpu);
    throw InputError(msg);
  }
  return "device: cuda, " + cuda_device_name() + " on rank 0; cuBLAS " +
         (bf16 ? "bf16 GEMM operands, fp32 accumulation" : "fp32") + ", device memory";
}

}  // namespace meshmoe
