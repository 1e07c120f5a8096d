#include "tensor/device.hpp"

#include <cblas.h>

#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <vector>

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
  if (d != g_device) device_synchronize();
  g_device = d;
  g_buffers_on_device = d == Device::Cuda || g_deferred_host_device;
}

#ifdef MESHMOE_CUDA
void* cuda_device_alloc(size_t bytes);  // tensor/cuda_device.cu
void cuda_device_free(void* p) noexcept;
void cuda_zero_async(void* p, size_t bytes);
void cuda_copy_async(void* dst, const void* src, size_t bytes);
void cuda_copy_to_host(void* host, const void* device, size_t bytes);
void cuda_copy_from_host(void* device, const void* host, size_t bytes);
void cuda_wait();
#endif

namespace {
// The device arenas hand out blocks without a header (the host must not write device memory):
// buffer_free asks them first whether a block is theirs. Never destroyed: Buffers may outlive
// static destruction order, and the CUDA context goes at exit.
Arena* g_cuda_arena = nullptr;
Arena* g_deferred_arena = nullptr;

#ifdef MESHMOE_CUDA
// The GPU's Buffers: one pooled arena over cudaMalloc'd chunks.
Arena& cuda_arena() {
  if (!g_cuda_arena) g_cuda_arena = new Arena({cuda_device_alloc, cuda_device_free}, size_t(256) << 20);
  return *g_cuda_arena;
}
#endif

// The deferred host device (tensor/device.hpp): its Buffers' chunks are mapped pages that are
// made inaccessible while device work is queued, and with DeviceAccess::Copies always, but inside
// copy_to_host and copy_from_host (as cudaMalloc'd memory is to the host).
struct DeferredDevice {
  std::vector<std::function<void()>> queue;
  std::vector<std::pair<void*, size_t>> chunks;
  DeviceAccess access = DeviceAccess::AfterWait;
  bool locked = false;  // chunks inaccessible
  void lock(bool on) {
    if (on == locked) return;
    for (const auto& [p, bytes] : chunks) mprotect(p, bytes, on ? PROT_NONE : PROT_READ | PROT_WRITE);
    locked = on;
  }
  bool copies_only() const { return access != DeviceAccess::AfterWait; }
  bool in_chunk(const void* a) const {
    for (const auto& [p, bytes] : chunks)
      if (a >= p && a < static_cast<const char*>(p) + bytes) return true;
    return false;
  }
};
DeferredDevice g_deferred;
bool g_work_queued = false;
size_t g_waits = 0;  // device_synchronize calls that found work queued

// DeviceAccess::CopiesListed: a host access to a device Buffer prints its call stack (once per
// place) and goes on: the faulting page is opened for that one instruction (the trap flag
// single-steps it; SIGTRAP closes the page again), so every later access is caught as well.
constexpr int kListedFrames = 12;
std::vector<std::vector<void*>> g_listed;  // call stacks printed so far
struct sigaction g_previous_segv {}, g_previous_trap {};
bool g_listing = false;  // list_host_access is the SIGSEGV handler
constexpr int kOpenPages = 8;
void* g_open_pages[kOpenPages];  // opened for the instruction being single-stepped
int g_open_count = 0;
void close_open_pages(int, siginfo_t*, void* context) {
  for (int i = 0; i < g_open_count; ++i)
    if (g_deferred.locked) mprotect(g_open_pages[i], size_t(getpagesize()), PROT_NONE);
  g_open_count = 0;
#if defined(__x86_64__)
  static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_EFL] &= ~0x100LL;
#endif
}
void list_host_access(int sig, siginfo_t* info, void* context) {
  if (g_deferred_host_device && g_deferred.access == DeviceAccess::CopiesListed && g_deferred.in_chunk(info->si_addr)) {
    void* frames[kListedFrames];
    const int n = backtrace(frames, kListedFrames);
    std::vector<void*> stack(frames + 2, frames + std::max(n, 2));  // past this handler and the signal frame
    bool seen = false;
    for (const auto& s : g_listed) seen = seen || s == stack;
    if (!seen) {
      g_listed.push_back(stack);
      const char head[] = "meshmoe: host access to device memory at\n";
      (void)!write(2, head, sizeof head - 1);
      backtrace_symbols_fd(stack.data(), int(stack.size()), 2);
    }
#if defined(__x86_64__)
    void* page = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(info->si_addr) & ~uintptr_t(getpagesize() - 1));
    mprotect(page, size_t(getpagesize()), PROT_READ | PROT_WRITE);
    if (g_open_count < kOpenPages) g_open_pages[g_open_count++] = page;
    static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_EFL] |= 0x100LL;  // trap after one instruction
#else
    g_deferred.lock(false);  // until the next device work locks them again
#endif
    return;
  }
  sigaction(SIGSEGV, &g_previous_segv, nullptr);  // anything else: the default's crash
  (void)sig;
  (void)context;
}

void* deferred_chunk_alloc(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  if (g_deferred.locked) mprotect(p, bytes, PROT_NONE);
  g_deferred.chunks.emplace_back(p, bytes);
  return p;
}
void deferred_chunk_free(void* p) {
  for (size_t i = 0; i < g_deferred.chunks.size(); ++i)
    if (g_deferred.chunks[i].first == p) {
      munmap(p, g_deferred.chunks[i].second);
      g_deferred.chunks.erase(g_deferred.chunks.begin() + std::ptrdiff_t(i));
      return;
    }
}
Arena& deferred_arena() {
  if (!g_deferred_arena) g_deferred_arena = new Arena({deferred_chunk_alloc, deferred_chunk_free}, size_t(64) << 20);
  return *g_deferred_arena;
}

// Queues the pending value-initialisation zeroes (tensor/device.hpp) ahead of what comes next.
void queue_pending_zero() {
  if (g_pending_zero.begin == g_pending_zero.end) return;
  char* p = g_pending_zero.begin;
  const size_t bytes = size_t(g_pending_zero.end - g_pending_zero.begin);
  g_pending_zero = {};
  if (g_deferred_host_device && g_device == Device::Cpu) {
    g_deferred.queue.push_back([p, bytes] { std::memset(p, 0, bytes); });
    return;
  }
#ifdef MESHMOE_CUDA
  cuda_zero_async(p, bytes);
#endif
}
}  // namespace

void before_device_work() {
  queue_pending_zero();
  g_work_queued = true;
  if (g_deferred_host_device) g_deferred.lock(true);
}

size_t listed_host_accesses() { return g_listed.size(); }

void zero_on_device_later_slow(char* p, size_t bytes) {
  queue_pending_zero();
  // The new range counts as queued work (the host must synchronise to touch it); it is queued
  // itself only when it stops growing.
  g_work_queued = true;
  if (g_deferred_host_device) g_deferred.lock(true);
  g_pending_zero = {p, p + bytes};
}

void device_synchronize() {
  queue_pending_zero();
  if (!g_work_queued) return;
  g_work_queued = false;
  ++g_waits;
  if (g_deferred_host_device) {
    g_deferred.lock(false);
    // Work may queue more work only through device_synchronize's callers, never from inside.
    std::vector<std::function<void()>> queue;
    queue.swap(g_deferred.queue);
    for (const auto& work : queue) work();
    g_deferred.lock(g_deferred.copies_only());
  }
#ifdef MESHMOE_CUDA
  cuda_wait();
#endif
}

void set_deferred_host_device(bool on, DeviceAccess access) {
  if (on && g_device != Device::Cpu) throw std::logic_error("the deferred host device needs Device::Cpu");
  device_synchronize();
  g_deferred.lock(false);
  g_deferred_host_device = on;
  g_deferred.access = on ? access : DeviceAccess::AfterWait;
  g_buffers_on_device = on || g_device == Device::Cuda;
  const bool listing = on && access == DeviceAccess::CopiesListed;
  if (listing && !g_listing) {
    struct sigaction a {};
    a.sa_sigaction = list_host_access;
    a.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&a.sa_mask);
    sigaction(SIGSEGV, &a, &g_previous_segv);
    struct sigaction t {};
    t.sa_sigaction = close_open_pages;
    t.sa_flags = SA_SIGINFO;
    sigemptyset(&t.sa_mask);
    sigaction(SIGTRAP, &t, &g_previous_trap);
  } else if (!listing && g_listing) {
    sigaction(SIGSEGV, &g_previous_segv, nullptr);
    sigaction(SIGTRAP, &g_previous_trap, nullptr);
  }
  g_listing = listing;
  g_deferred.lock(g_deferred.copies_only());
}

HostSection::HostSection() : device_(g_device), deferred_(g_deferred_host_device) {
  device_synchronize();
  g_device = Device::Cpu;
  g_deferred_host_device = false;
  g_buffers_on_device = false;
}
HostSection::~HostSection() {
  g_device = device_;
  g_deferred_host_device = deferred_;
  g_buffers_on_device = device_ == Device::Cuda || deferred_;
}

size_t device_waits() { return g_waits; }

size_t deferred_host_work_queued() {
  return g_deferred.queue.size() + (g_pending_zero.begin != g_pending_zero.end ? 1 : 0);
}

void copy_buffer_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (!buffers_on_device()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  if (g_deferred_host_device && g_device == Device::Cpu) {
    defer_host_work([dst, src, bytes] { std::memcpy(dst, src, bytes); });
    return;
  }
#ifdef MESHMOE_CUDA
  before_device_work();
  cuda_copy_async(dst, src, bytes);
#endif
}

void copy_to_host(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return;
  if (!buffers_on_device()) {
    std::memcpy(host, device, bytes);
    return;
  }
  device_synchronize();
  if (g_deferred_host_device) {
    g_deferred.lock(false);
    std::memcpy(host, device, bytes);
    g_deferred.lock(g_deferred.copies_only());
    return;
  }
#ifdef MESHMOE_CUDA
  cuda_copy_to_host(host, device, bytes);
#endif
}

void copy_from_host(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return;
  if (!buffers_on_device()) {
    std::memcpy(device, host, bytes);
    return;
  }
  if (g_deferred_host_device) {
    // In order with the queued work, from the host's bytes as they are now (cudaMemcpy's semantics).
    auto bytes_now = std::make_shared<std::vector<char>>(static_cast<const char*>(host), static_cast<const char*>(host) + bytes);
    defer_host_work([device, bytes_now] { std::memcpy(device, bytes_now->data(), bytes_now->size()); });
    return;
  }
#ifdef MESHMOE_CUDA
  before_device_work();
  cuda_copy_from_host(device, host, bytes);
#endif
}

bool device_memory(const void* p) {
  if (!p || !buffers_on_device()) return false;
  for (const Arena* arena : {g_cuda_arena, g_deferred_arena})
    if (arena && arena->contains(p)) return true;
  return false;
}

HostStaged::HostStaged(const void* p, size_t bytes, bool read) : host_(const_cast<void*>(p)) {
  if (bytes == 0 || !device_memory(p)) return;
  device_ = const_cast<void*>(p);
  copy_.resize(bytes);
  host_ = copy_.data();
  if (read) copy_to_host(host_, p, bytes);
}

void HostStaged::write_back() {
  if (device_) copy_from_host(device_, copy_.data(), copy_.size());
}

void defer_host_work(std::function<void()> work) {
  before_device_work();
  g_deferred.queue.push_back(std::move(work));
}

namespace {
Arena* buffer_arena() {
#ifdef MESHMOE_CUDA
  if (g_device == Device::Cuda) return &cuda_arena();
#endif
  if (g_deferred_host_device) return &deferred_arena();
  return g_host_arena;
}
bool device_arena(const Arena* arena) { return arena && (arena == g_cuda_arena || arena == g_deferred_arena); }
}  // namespace

void* buffer_alloc(size_t bytes) {
  Arena* arena = buffer_arena();
  if (device_arena(arena)) return arena->allocate(bytes);
  char* base = nullptr;
  BlockHeader header{kHostBlock, arena};
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
  for (Arena* arena : {g_cuda_arena, g_deferred_arena})
    if (arena && arena->owns(p)) return arena->deallocate(p);
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
