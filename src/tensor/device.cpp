#include "tensor/device.hpp"

#include <cblas.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#include "core/error.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

namespace {
Device g_device = Device::Cpu;
bool g_reversed = false;  // host loops backwards (tensor/launch.hpp, for the race tests)
int g_saved_blas_threads = 0;

// Every Buffer allocation starts with a 64-byte header that says how it was made.
constexpr size_t kHeader = 64;
enum : uint32_t { kHostBlock = 0x484f5354u, kManagedBlock = 0x4d414e47u };
}  // namespace

Device current_device() { return g_device; }
void set_device(Device d) {
  if (d == Device::Cuda && !cuda_compiled())
    throw Error("run.device = \"cuda\": this meshmoe was built without CUDA (nvcc not found at build time; make CUDA=1)");
  g_device = d;
}

#ifdef MESHMOE_CUDA
void* cuda_managed_alloc(size_t bytes);  // tensor/cuda_device.cu
void cuda_managed_free(void* p) noexcept;
#endif

void* buffer_alloc(size_t bytes) {
  char* base = nullptr;
#ifdef MESHMOE_CUDA
  if (g_device == Device::Cuda) {
    base = static_cast<char*>(cuda_managed_alloc(bytes + kHeader));
    *reinterpret_cast<uint32_t*>(base) = kManagedBlock;
    return base + kHeader;
  }
#endif
  base = static_cast<char*>(::operator new(bytes + kHeader, std::align_val_t(kHeader)));
  *reinterpret_cast<uint32_t*>(base) = kHostBlock;
  return base + kHeader;
}

void buffer_free(void* p) noexcept {
  if (!p) return;
  char* base = static_cast<char*>(p) - kHeader;
#ifdef MESHMOE_CUDA
  if (*reinterpret_cast<uint32_t*>(base) == kManagedBlock) {
    cuda_managed_free(base);
    return;
  }
#endif
  ::operator delete(base, std::align_val_t(kHeader));
}

#ifndef MESHMOE_CUDA
bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }
void cuda_bind(int) { throw Error("this meshmoe was built without CUDA (make CUDA=1 on a machine with nvcc)"); }
std::string cuda_device_name() { return "none"; }
void device_synchronize() {}
void cuda_gemm(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*, int) {
  throw Error("cuda_gemm: built without CUDA");
}
void cuda_gemm(bool, bool, int, int, int, double, const double*, int, const double*, int, double, double*, int) {
  throw Error("cuda_gemm: built without CUDA");
}
#endif

bool host_loop_reversed() { return g_reversed; }
void set_host_loop_reversed(bool reversed) { g_reversed = reversed; }

void set_blas_threads_for_tasks(bool tasks_running) {
  if (tasks_running) {
    g_saved_blas_threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
  } else {
    openblas_set_num_threads(g_saved_blas_threads);
  }
}

}  // namespace meshmoe
