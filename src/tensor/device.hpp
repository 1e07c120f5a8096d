// Where the model's numbers live and are computed (docs/ARCHITECTURE.md "Principles" 4: one code path, two
// devices). With run.device = "cuda" every model buffer (parameters, gradients, activations,
// optimizer state) is a Buffer in GPU memory (cudaMalloc'd chunks of the rank's arena), which the
// host reaches only through the transfer copies below; the layers' loops are functors that
// for_each_index (tensor/launch.hpp) runs as a host loop or as a CUDA kernel, and GEMMs go to
// OpenBLAS or cuBLAS (tensor/blas.hpp). Which of these happens is the device backend's to say
// (tensor/device_backend.hpp: the host, cuda, or the tests' deferred host device).
//
// Transfer points (docs/ARCHITECTURE.md "Device work and transfer points"): CUDA launches and GEMMs
// are queued on one stream and return at once. Host code reads or writes a device Buffer's
// elements only by copy_to_host / copy_from_host (upload, download, host_view, HostCopy,
// HostStaged); a Buffer made on the device is zeroed there (no host value-initialisation). Without
// a GPU the tests check every such point with the deferred host device (tensor/deferred_device.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/compute_kinds.hpp"
#include "tensor/device_backend.hpp"

namespace meshmoe {

// The process's device: where launches and GEMMs run (the backend's).
inline Device current_device() { return device_backend().device; }
// The host's backend, or the GPU's (throws Error in a build without CUDA); set once, before the
// model allocates anything (select_device).
void set_device(Device d);

bool cuda_compiled();        // built with nvcc (make CUDA=1)
int cuda_device_count();     // GPUs visible to this process; 0 without CUDA or without a driver
// Binds this process to GPU (node_local_rank % count) and creates its cuBLAS handle. Throws Error
// naming the reason (no GPU, driver error).
void cuda_bind(int node_local_rank);
std::string cuda_device_name();  // of the bound GPU, for the run's start-up lines
// Waits for the device work queued so far (a no-op when none is queued; on the plain host path
// nothing is ever queued).
void device_synchronize();
// Launches, GEMMs and collectives call this just before they queue device work.
void before_device_work();
size_t device_waits();  // Tests only: device_synchronize() calls that found work queued

// The host's waits for the device (docs/ARCHITECTURE.md "Device work and transfer points"), counted
// where Buffers live on a device (the GPU, the deferred host device; never on the host path): each
// copy to the host (copy_to_host: a round trip to the device, its wait for the queued work
// included) and each other device_synchronize() that found work queued. The trainer reports them
// per step (MESHMOE_TEST_HOST_WAITS); the tests bound them.
struct HostWaits {
  size_t synchronize = 0;  // device_synchronize() outside the copies, with work queued
  size_t copies = 0;       // copy_to_host of device memory
  size_t total() const { return synchronize + copies; }
  HostWaits operator-(const HostWaits& o) const { return {synchronize - o.synchronize, copies - o.copies}; }
};
HostWaits host_waits();

// Whether Buffers allocated now are device memory, never touched by the host between transfer
// points (run.device = "cuda", or the deferred host device).
inline bool buffers_on_device() { return device_backend().buffers_on_device; }

// Host loops and GEMMs: fn() now, or queued until device_synchronize() where the backend queues
// host work (the deferred host device).
template <class Fn>
void run_host_work(const Fn& fn) {
  if (const auto queue = device_backend().queue_host_work) return queue(fn);
  fn();
}

// A Buffer's value-initialisation on the device: the elements' bytes are zeroed by the device
// before the next device work (consecutive elements make one range, one memset).
struct PendingZero {
  char *begin = nullptr, *end = nullptr;
};
inline PendingZero g_pending_zero;
void zero_on_device_later_slow(char* p, size_t bytes);
inline void zero_on_device_later(void* p, size_t bytes) {
  char* c = static_cast<char*>(p);
  if (c == g_pending_zero.end && c) {
    g_pending_zero.end += bytes;
    return;
  }
  zero_on_device_later_slow(c, bytes);
}

// Raw storage for Buffer: 64-byte aligned host memory on the host; on a device a block of the
// backend's arena (tensor/arena.hpp; on the GPU pooled cudaMalloc chunks). A Buffer is freed where
// it came from.
void* buffer_alloc(size_t bytes);
void buffer_free(void* p) noexcept;
// Makes the current device's arena hold `bytes` in one piece (the memory plan's total, before the
// model allocates); nothing on the host.
void reserve_buffer_memory(size_t bytes);
// Tests only: host Buffers come from `arena` (null: the heap again) until the next call.
void set_host_buffer_arena(Arena* arena);

// The host's copies of device memory, the only host accesses to it that cudaMalloc allows:
// copy_to_host waits for the queued work, then copies; copy_from_host is queued in order with the
// work, from the host's bytes as they are at the call. Plain memcpy on the host path.
void copy_to_host(void* host, const void* device, size_t bytes);
void copy_from_host(void* device, const void* host, size_t bytes);
// Whether p points into device memory (the GPU's or the deferred host device's arena).
bool device_memory(const void* p);

// Host work while the model's Buffers live on a device (decoding, host code, for eval.bleu_every):
// waits for the device's queued work, then, while it lives, launches and GEMMs run on the host and
// new Buffers are host memory. The device's Buffers stay where they are (the deferred host
// device's stay inaccessible), so the host copies what it needs of them before. Not nested.
class HostSection {
 public:
  HostSection();
  ~HostSection();
  HostSection(const HostSection&) = delete;
  HostSection& operator=(const HostSection&) = delete;

 private:
  const DeviceBackend* saved_;
};

// A host range for host code (MPI, checkpoints) that reads or writes a range of memory: the range
// itself, or, for device memory, a host copy (taken at construction when `read`; written back by
// write_back()).
class HostStaged {
 public:
  HostStaged() = default;
  HostStaged(const void* p, size_t bytes, bool read);
  HostStaged(const HostStaged&) = delete;  // host() may point into copy_
  HostStaged& operator=(const HostStaged&) = delete;
  HostStaged(HostStaged&&) noexcept = default;  // a moved vector keeps its storage
  HostStaged& operator=(HostStaged&&) noexcept = default;
  void* host() const { return host_; }
  void write_back();

 private:
  void* device_ = nullptr;
  void* host_ = nullptr;
  std::vector<char> copy_;
};

// Copies `bytes` from one Buffer's storage to another's where they live: queued on the device
// (in order with the launches), a memcpy on the host.
void copy_buffer_bytes(void* dst, const void* src, size_t bytes);

// New elements of a Buffer are zero: zeroed by the device (queued, one range) or, on the host,
// by one memset.
inline void zero_new_elements(void* p, size_t bytes) {
  if (bytes == 0) return;
  if (buffers_on_device())
    zero_on_device_later(p, bytes);
  else
    std::memset(p, 0, bytes);
}

template <class T>
struct DeviceAllocator {
  using value_type = T;
  DeviceAllocator() = default;
  template <class U>
  DeviceAllocator(const DeviceAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(buffer_alloc(n * sizeof(T))); }
  void deallocate(T* p, size_t) noexcept { buffer_free(p); }
  // Value-initialisation writes nothing per element: Buffer zeroes its new elements in one piece
  // (zero_new_elements), so std::vector's per-element loop is empty (on the GPU a loop over every
  // element of the memory plan took ~17 s of the first step). An element constructed from a value
  // (emplace_back into reserved room) is a copy from the host on the device.
  template <class U>
  void construct(U*) {
    static_assert(std::is_trivially_default_constructible_v<U>, "Buffer elements are plain numbers");
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    if (!buffers_on_device()) {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
      return;
    }
    const U value(std::forward<Args>(args)...);
    copy_from_host(p, &value, sizeof(U));
  }
  template <class U>
  bool operator==(const DeviceAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const DeviceAllocator<U>&) const { return false; }
};

// A vector whose elements a CUDA kernel can read and write when run.device = "cuda". New
// elements are zero; on the device they are zeroed there, and a copy of a Buffer and the old
// elements of a Buffer that grows into new storage are copied there: the host touches none. The
// forms that take the host's values ((n, value), (first, last), {values}, assign) upload them on
// the device; element access (operator[], iterators) is for host Buffers only.
template <class T>
class Buffer : public std::vector<T, DeviceAllocator<T>> {
  using Base = std::vector<T, DeviceAllocator<T>>;

 public:
  Buffer() = default;
  explicit Buffer(size_t n) : Base(n) { zero_new_elements(this->data(), n * sizeof(T)); }
  Buffer(size_t n, const T& value) { assign(n, value); }
  template <class It, class = typename std::iterator_traits<It>::iterator_category>
  Buffer(It first, It last) {
    assign(first, last);
  }
  Buffer(std::initializer_list<T> values) { assign(values.begin(), values.end()); }
  Buffer(const Buffer& other) : Base() { copy(other); }
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(const Buffer& other) {
    if (this != &other) copy(other);
    return *this;
  }
  Buffer& operator=(Buffer&&) noexcept = default;

  void resize(size_t n) {
    const size_t old = this->size();
    if (n > this->capacity() && old > 0 && buffers_on_device()) {  // new storage, filled on the device
      Buffer grown;
      static_cast<Base&>(grown).resize(n);  // writes nothing (the allocator constructs nothing)
      copy_buffer_bytes(grown.data(), this->data(), old * sizeof(T));
      zero_new_elements(grown.data() + old, (n - old) * sizeof(T));
      this->swap(grown);
      return;
    }
    Base::resize(n);
    if (n > old) zero_new_elements(this->data() + old, (n - old) * sizeof(T));
  }
  void resize(size_t n, const T& value) {
    if (!buffers_on_device()) return Base::resize(n, value);
    const size_t old = this->size();
    resize(n);
    if (n > old) {
      const std::vector<T> tail(n - old, value);
      copy_from_host(this->data() + old, tail.data(), tail.size() * sizeof(T));
    }
  }
  // n elements that the caller overwrites next (an upload): the old ones are dropped, nothing is
  // zeroed or copied on the device.
  void resize_to_overwrite(size_t n) {
    this->clear();
    Base::resize(n);  // writes nothing (the allocator constructs nothing)
  }
  // Room for n elements; into new storage the old elements are copied on the device, as resize's.
  void reserve(size_t n) {
    if (n <= this->capacity() || this->empty() || !buffers_on_device()) return Base::reserve(n);
    Buffer grown;
    static_cast<Base&>(grown).reserve(n);
    static_cast<Base&>(grown).resize(this->size());  // writes nothing (the allocator constructs nothing)
    copy_buffer_bytes(grown.data(), this->data(), this->size() * sizeof(T));
    this->swap(grown);
  }
  // The host's values, copied in order with the queued work on the device.
  void assign(size_t n, const T& value) {
    if (!buffers_on_device()) return Base::assign(n, value);
    const std::vector<T> values(n, value);
    upload_values(values.data(), n);
  }
  template <class It, class = typename std::iterator_traits<It>::iterator_category>
  void assign(It first, It last) {
    if (!buffers_on_device()) return Base::assign(first, last);
    if constexpr (std::contiguous_iterator<It> && std::is_same_v<std::iter_value_t<It>, T>) {
      upload_values(std::to_address(first), size_t(last - first));  // the host's elements as they are
    } else {
      const std::vector<T> values(first, last);
      upload_values(values.data(), values.size());
    }
  }
  void assign(std::initializer_list<T> values) { assign(values.begin(), values.end()); }

 private:
  void upload_values(const T* host, size_t n) {
    resize_to_overwrite(n);
    copy_from_host(this->data(), host, n * sizeof(T));
  }
  void copy(const Buffer& other) {
    if (!buffers_on_device()) {
      Base::operator=(other);
      return;
    }
    this->clear();
    Base::resize(other.size());  // writes nothing: the copy fills every element
    copy_buffer_bytes(this->data(), other.data(), other.size() * sizeof(T));
  }
};

// The transfer points on Buffers (docs/ARCHITECTURE.md "Device work and transfer points"): the
// host's elements into a Buffer (resized to n), in order with the queued work...
template <class T>
void upload(Buffer<T>& b, const T* host, size_t n) {
  b.assign(host, host + n);
}
// ... a Buffer's elements [first, first + n) into host memory, after the queued work...
template <class T>
void download(const Buffer<T>& b, size_t first, size_t n, T* host) {
  copy_to_host(host, b.data() + first, n * sizeof(T));
}
template <class T>
std::vector<T> download(const Buffer<T>& b) {
  std::vector<T> host(b.size());
  download(b, 0, b.size(), host.data());
  return host;
}
template <class T>
T download_one(const Buffer<T>& b, size_t i) {
  T v;
  download(b, i, 1, &v);
  return v;
}
// ... and the host's view of a whole Buffer: the Buffer itself on the host path, else a copy in
// `scratch` (valid until scratch changes).
template <class T>
std::span<const T> host_view(const Buffer<T>& b, std::vector<T>& scratch) {
  if (!buffers_on_device()) return {b.data(), b.size()};
  scratch.resize(b.size());
  download(b, 0, b.size(), scratch.data());
  return {scratch.data(), scratch.size()};
}

// HostStaged of n elements, typed, read first: the host's working copy of [p, p + n), written back
// by upload() (transfer points).
template <class T>
class HostCopy {
 public:
  HostCopy(T* p, size_t n) : staged_(p, n * sizeof(T), /*read=*/true) {}
  T* data() { return static_cast<T*>(staged_.host()); }
  void upload() { staged_.write_back(); }

 private:
  HostStaged staged_;
};

// Row-major GEMM on the bound GPU (cuBLAS, fp32 without TF32, or fp64); see tensor/blas.hpp.
void cuda_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc);
void cuda_gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
               const double* B, int ldb, double beta, double* C, int ldc);
// `count` such GEMMs, matrix i of each operand `stride` elements after matrix i - 1 (one cuBLAS call).
void cuda_gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                               int64_t stride_a, const float* B, int ldb, int64_t stride_b, float beta, float* C,
                               int ldc, int64_t stride_c, int count);
void cuda_gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A,
                               int lda, int64_t stride_a, const double* B, int ldb, int64_t stride_b, double beta,
                               double* C, int ldc, int64_t stride_c, int count);

}  // namespace meshmoe
