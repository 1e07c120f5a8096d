#include "tensor/device.hpp"

#include <cblas.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#include "core/error.hpp"
#include "tensor/arena.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

namespace {
Device g_device = Device::Cpu;
bool g_reversed = false;  // host loops backwards (tensor/launch.hpp, for the race tests)
int g_saved_blas_threads = 0;

// Every Buffer allocation starts with a 64-byte header that says how it was made: from the host heap,
// or from an arena (whose address follows the tag).
constexpr size_t kHeader = 64;
enum : uint32_t { kHostBlock = 0x484f5354u, kArenaBlock = 0x4152454eu };
struct BlockHeader {
  uint32_t tag;
  Arena* arena;
};
static_assert(sizeof(BlockHeader) <= kHeader);

Arena* g_host_arena = nullptr;  // tests: host Buffers from an arena (set_host_buffer_arena)
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

namespace {
// The GPU's Buffers: one pooled arena over managed memory (the host path still reads some device
// results between kernels; the arena's backend becomes cudaMalloc once those reads are gone).
Arena& cuda_arena() {
  // Never destroyed: Buffers may outlive static destruction order, and the CUDA context goes at exit.
  static Arena* arena = new Arena({cuda_managed_alloc, cuda_managed_free}, size_t(256) << 20);
  return *arena;
}
}  // namespace
#endif

namespace {
Arena* buffer_arena() {
#ifdef MESHMOE_CUDA
  if (g_device == Device::Cuda) return &cuda_arena();
#endif
  return g_host_arena;
}
}  // namespace

void* buffer_alloc(size_t bytes) {
  char* base = nullptr;
  BlockHeader header{kHostBlock, buffer_arena()};
  if (header.arena) {
    header.tag = kArenaBlock;
    base = static_cast<char*>(header.arena->allocate(bytes + kHeader));
  } else {
    base = static_cast<char*>(::operator new(bytes + kHeader, std::align_val_t(kHeader)));
  }
  *reinterpret_cast<BlockHeader*>(base) = header;
  return base + kHeader;
}

void buffer_free(void* p) noexcept {
  if (!p) return;
  char* base = static_cast<char*>(p) - kHeader;
  const BlockHeader header = *reinterpret_cast<const BlockHeader*>(base);
  if (header.tag == kArenaBlock) {
    header.arena->deallocate(base);
    return;
  }
  ::operator delete(base, std::align_val_t(kHeader));
}

void reserve_buffer_memory(size_t bytes) {
  if (Arena* arena = buffer_arena()) arena->reserve(bytes);
}

std::optional<Arena::Stats> buffer_arena_stats() {
  if (const Arena* arena = buffer_arena()) return arena->stats();
  return std::nullopt;
}

void set_host_buffer_arena(Arena* arena) { g_host_arena = arena; }

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
void cuda_gemm_strided_batched(bool, bool, int, int, int, float, const float*, int, int64_t, const float*, int, int64_t,
                               float, float*, int, int64_t, int) {
  throw Error("cuda_gemm_strided_batched: built without CUDA");
}
void cuda_gemm_strided_batched(bool, bool, int, int, int, double, const double*, int, int64_t, const double*, int,
                               int64_t, double, double*, int, int64_t, int) {
  throw Error("cuda_gemm_strided_batched: built without CUDA");
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
