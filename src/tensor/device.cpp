#include "tensor/device.hpp"

#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>

#include "core/error.hpp"
#include "tensor/arena.hpp"
#include "tensor/device_graph.hpp"

namespace meshmoe {

namespace {
// The host's backend: nothing is ever queued, the copies are plain ones.
void host_zero(void* p, size_t bytes) { std::memset(p, 0, bytes); }
void host_copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void host_wait() {}
}  // namespace

const DeviceBackend kHostBackend = {
    .name = "host",
    .device = Device::Cpu,
    .buffers_on_device = false,
    .queue_host_work = nullptr,
    .arena = nullptr,
    .work_queued = nullptr,
    .zero = host_zero,
    .copy = host_copy,
    .copy_from_host = host_copy,
    .copy_to_host = host_copy,
    .wait = host_wait,
    .begin_capture = nullptr,
    .end_capture = nullptr,
    .cancel_capture = nullptr,
    .launch_graph = nullptr,
    .destroy_graph = nullptr,
};

void set_device_backend(const DeviceBackend& b) {
  if (&b != g_device_backend) device_synchronize();
  g_device_backend = &b;
}

void set_device(Device d) {
  if (d == current_device()) return;  // on the host: the host's backend, or the deferred host device, stays
  if (d == Device::Cpu) return set_device_backend(kHostBackend);
  if (!cuda_backend())
    throw Error("run.device = \"cuda\": this meshmoe was built without CUDA (make CUDA=1 builds it)");
  set_device_backend(*cuda_backend());
}

namespace {
bool g_work_queued = false;
size_t g_waits = 0;  // device_synchronize calls that found work queued
HostWaits g_host_waits;

// Queues the pending value-initialisation zeroes (tensor/device.hpp) ahead of what comes next.
void queue_pending_zero() {
  if (g_pending_zero.begin == g_pending_zero.end) return;
  char* p = g_pending_zero.begin;
  const size_t bytes = size_t(g_pending_zero.end - g_pending_zero.begin);
  g_pending_zero = {};
  capture_uses(p, bytes);
  device_backend().zero(p, bytes);
}
}  // namespace

void before_device_work() {
  queue_pending_zero();
  g_work_queued = true;
  if (const auto work_queued = device_backend().work_queued) work_queued();
}

void zero_on_device_later_slow(char* p, size_t bytes) {
  // The new range counts as queued work (the host must synchronise to touch it); it is queued
  // itself only when it stops growing.
  before_device_work();
  g_pending_zero = {p, p + bytes};
}

void device_synchronize() {
  refuse_in_capture("a host wait (device_synchronize)");
  queue_pending_zero();
  if (!g_work_queued) return;
  g_work_queued = false;
  ++g_waits;
  ++g_host_waits.synchronize;
  device_backend().wait();
}

size_t device_waits() { return g_waits; }
HostWaits host_waits() { return g_host_waits; }

HostSection::HostSection() : saved_(g_device_backend) {
  device_synchronize();
  g_device_backend = &kHostBackend;
}
HostSection::~HostSection() { g_device_backend = saved_; }

void copy_buffer_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (buffers_on_device()) before_device_work();
  capture_uses(dst, bytes);
  capture_uses(src, bytes);
  device_backend().copy(dst, src, bytes);
}

void copy_to_host(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return;
  if (!buffers_on_device()) return device_backend().copy_to_host(host, device, bytes);
  refuse_in_capture("a copy to the host (a host wait)");
  ++g_host_waits.copies;
  const size_t others = g_host_waits.synchronize;
  device_synchronize();
  g_host_waits.synchronize = others;  // its wait is the copy's
  device_backend().copy_to_host(host, device, bytes);
}

void copy_from_host(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return;
  refuse_in_capture("a copy from the host (pinned staging on the GPU)");
  if (buffers_on_device()) before_device_work();
  device_backend().copy_from_host(device, host, bytes);
}

namespace {
// The device arenas made so far (the GPU's, the deferred host device's).
constexpr int kMaxDeviceArenas = 4;
Arena* g_device_arenas[kMaxDeviceArenas] = {};
int g_device_arena_count = 0;

Arena* g_host_arena = nullptr;  // tests: host Buffers from an arena (set_host_buffer_arena)

// Every host Buffer allocation starts with a 64-byte header that says how it was made: from the
// heap, or from the tests' host arena (whose address follows the tag).
constexpr size_t kHeader = 64;
enum : uint32_t { kHostBlock = 0x484f5354u, kArenaBlock = 0x4152454eu };
struct BlockHeader {
  uint32_t tag;
  Arena* arena;
};
static_assert(sizeof(BlockHeader) <= kHeader);

// Where Buffers come from now: the backend's arena, else the tests' host arena or (null) the heap.
Arena* buffer_arena() {
  if (const auto arena = device_backend().arena) return arena();
  return g_host_arena;
}
}  // namespace

Arena* make_device_arena(Arena::Backend chunks, size_t chunk_bytes) {
  if (g_device_arena_count == kMaxDeviceArenas) throw std::logic_error("make_device_arena: too many device arenas");
  Arena* arena = new Arena(std::move(chunks), chunk_bytes);
  g_device_arenas[g_device_arena_count++] = arena;
  return arena;
}

bool device_memory(const void* p) {
  if (!p || !buffers_on_device()) return false;
  for (int i = 0; i < g_device_arena_count; ++i)
    if (g_device_arenas[i]->contains(p)) return true;
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

void* buffer_alloc(size_t bytes) {
  if (const auto arena = device_backend().arena) {  // device memory: no header
    refuse_in_capture("a device Buffer allocated (or grown into new storage)");
    return arena()->allocate(bytes);
  }
  BlockHeader header{kHostBlock, g_host_arena};
  char* base = nullptr;
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
  for (int i = 0; i < g_device_arena_count; ++i)
    if (g_device_arenas[i]->owns(p)) {
      device_block_freed(p);
      return g_device_arenas[i]->deallocate(p);
    }
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

void set_host_buffer_arena(Arena* arena) { g_host_arena = arena; }

}  // namespace meshmoe
