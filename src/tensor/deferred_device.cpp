#include "tensor/deferred_device.hpp"

#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tensor/device.hpp"

namespace meshmoe {

namespace {

// The queued work, and the Buffers' chunks: mapped pages, made inaccessible while device work is
// queued, and with DeviceAccess::Copies always, but inside the copies to and from the host.
using WorkItems = std::vector<std::function<void()>>;
struct DeferredDevice {
  WorkItems queue;
  WorkItems* recording = nullptr;  // a device graph's capture (tensor/device_graph.hpp): work goes here
  WorkItems& work() { return recording ? *recording : queue; }
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
extern const DeviceBackend kDeferredBackend;
bool deferred_backend_on() { return g_device_backend == &kDeferredBackend; }

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
  if (deferred_backend_on() && g_deferred.access == DeviceAccess::CopiesListed && g_deferred.in_chunk(info->si_addr)) {
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

// The listing handlers in place while `on`, the previous ones back otherwise.
void list_host_accesses(bool on) {
  if (on && !g_listing) {
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
  } else if (!on && g_listing) {
    sigaction(SIGSEGV, &g_previous_segv, nullptr);
    sigaction(SIGTRAP, &g_previous_trap, nullptr);
  }
  g_listing = on;
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
Arena* deferred_arena() {
  static Arena* arena = make_device_arena({deferred_chunk_alloc, deferred_chunk_free}, size_t(64) << 20);
  return arena;
}

// The backend's entries (tensor/device_backend.hpp): device.cpp has called before_device_work
// before the queued ones and device_synchronize before copy_to_host.
void queue_host_work(std::function<void()> work) {
  before_device_work();
  g_deferred.work().push_back(std::move(work));
}
void lock_pages() { g_deferred.lock(true); }
void queue_zero(void* p, size_t bytes) {
  g_deferred.work().push_back([p, bytes] { std::memset(p, 0, bytes); });
}
void queue_copy(void* dst, const void* src, size_t bytes) {
  g_deferred.work().push_back([dst, src, bytes] { std::memcpy(dst, src, bytes); });
}
void queue_copy_from_host(void* device, const void* host, size_t bytes) {
  // From the host's bytes as they are now (cudaMemcpy's semantics).
  auto bytes_now = std::make_shared<std::vector<char>>(static_cast<const char*>(host), static_cast<const char*>(host) + bytes);
  g_deferred.queue.push_back([device, bytes_now] { std::memcpy(device, bytes_now->data(), bytes_now->size()); });
}
// Device graphs, CUDA graphs' model: the capture records the work items (each with its arguments
// as they were then: the closures' copies of the loop bodies and sizes), and a launch queues copies
// of them, which run at the next wait in order with the rest.
void begin_recording() { g_deferred.recording = new WorkItems; }
void* end_recording() { return std::exchange(g_deferred.recording, nullptr); }
void cancel_recording() { delete std::exchange(g_deferred.recording, nullptr); }
void queue_recording(void* graph) {
  const WorkItems& items = *static_cast<const WorkItems*>(graph);
  g_deferred.queue.insert(g_deferred.queue.end(), items.begin(), items.end());
}
void free_recording(void* graph) { delete static_cast<WorkItems*>(graph); }

void copy_to_host_opened(void* host, const void* device, size_t bytes) {
  g_deferred.lock(false);
  std::memcpy(host, device, bytes);
  g_deferred.lock(g_deferred.copies_only());
}
void run_queue() {
  g_deferred.lock(false);
  // Work may queue more work only through device_synchronize's callers, never from inside.
  std::vector<std::function<void()>> queue;
  queue.swap(g_deferred.queue);
  for (const auto& work : queue) work();
  g_deferred.lock(g_deferred.copies_only());
}

const DeviceBackend kDeferredBackend = {
    .name = "deferred host device",
    .device = Device::Cpu,
    .buffers_on_device = true,
    .queue_host_work = queue_host_work,
    .arena = deferred_arena,
    .work_queued = lock_pages,
    .zero = queue_zero,
    .copy = queue_copy,
    .copy_from_host = queue_copy_from_host,
    .copy_to_host = copy_to_host_opened,
    .wait = run_queue,
    .begin_capture = begin_recording,
    .end_capture = end_recording,
    .cancel_capture = cancel_recording,
    .launch_graph = queue_recording,
    .destroy_graph = free_recording,
};

}  // namespace

void set_deferred_host_device(bool on, DeviceAccess access) {
  if (on && current_device() != Device::Cpu)
    throw std::logic_error(std::string("the deferred host device stands in for the host's backend, not ") +
                           device_backend().name);
  device_synchronize();
  g_deferred.lock(false);
  g_deferred.access = on ? access : DeviceAccess::AfterWait;
  if (on)
    set_device_backend(kDeferredBackend);
  else if (deferred_backend_on())
    set_device_backend(kHostBackend);
  list_host_accesses(on && access == DeviceAccess::CopiesListed);
  g_deferred.lock(g_deferred.copies_only());
}

size_t deferred_host_work_queued() {
  return g_deferred.queue.size() + (g_pending_zero.begin != g_pending_zero.end ? 1 : 0);
}

size_t listed_host_accesses() { return g_listed.size(); }

}  // namespace meshmoe
