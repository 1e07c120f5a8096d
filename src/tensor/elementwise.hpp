// Whole-buffer element-wise operations on the current device (tensor/launch.hpp): residual adds,
// fills, scaling, copies, and the non-finite scan that names the first bad layer.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/hd.hpp"
#include "tensor/launch.hpp"
#include "tensor/launch_rows.hpp"

namespace meshmoe {

template <typename T>
struct AddInto {  // dst[i] += src[i]
  T* dst;
  const T* src;
  MESHMOE_HD void operator()(int64_t i) const { dst[i] += src[i]; }
};

template <typename T>
struct FillWith {  // dst[i] = value
  T* dst;
  T value;
  MESHMOE_HD void operator()(int64_t i) const { dst[i] = value; }
  // Host blocks (tensor/launch.hpp): +0 as memset, whose non-temporal stores on large blocks skip
  // reading the lines first (the gradients' zeroing each step: half the memory traffic); the
  // same bytes (+0 is all zero bits; -0 is not, and takes the loop).
  void range(int64_t begin, int64_t end) const {
    if (value == T(0) && !std::signbit(value)) {
      std::memset(static_cast<void*>(dst + begin), 0, size_t(end - begin) * sizeof(T));
      return;
    }
    for (int64_t i = begin; i < end; ++i) dst[i] = value;
  }
};

template <typename T>
struct ScaleBy {  // dst[i] *= factor
  T* dst;
  T factor;
  MESHMOE_HD void operator()(int64_t i) const { dst[i] *= factor; }
};

template <typename T>
struct CopyFrom {  // dst[i] = src[i]
  T* dst;
  const T* src;
  MESHMOE_HD void operator()(int64_t i) const { dst[i] = src[i]; }
};

// bad[c] = 1 when chunk c of v (kChunk elements) holds a NaN or an Inf.
template <typename T>
struct FlagNonFiniteChunk {
  static constexpr int64_t kChunk = 4096;
  const T* v;
  int64_t n;
  int32_t* bad;
  // A row body (tensor/launch_rows.hpp): one warp per chunk on the GPU.
  template <class Lanes>
  MESHMOE_HD void operator()(int64_t c, const Lanes& lanes) const {
    const int64_t end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
    int32_t b = 0;
    for (int64_t i = c * kChunk + lanes.first; i < end; i += lanes.step) b |= !std::isfinite(v[i]);
    b = lanes.max(b);
    if (lanes.leader()) bad[c] = b;
  }
};

template <typename T>
void add_into(T* dst, const T* src, size_t n) {
  for_each_index(int64_t(n), AddInto<T>{dst, src});
}
template <typename T>
void fill_with(T* dst, size_t n, T value) {
  for_each_index(int64_t(n), FillWith<T>{dst, value});
}
// b resized to n elements, every one `value`, written by the device (Buffer::assign would write
// them from the host: a transfer point).
template <typename T>
void fill_buffer(Buffer<T>& b, size_t n, T value) {
  b.resize(n);
  fill_with(b.data(), n, value);
}
template <typename T>
void scale_by(T* dst, size_t n, T factor) {
  for_each_index(int64_t(n), ScaleBy<T>{dst, factor});
}
template <typename T>
void copy_from(T* dst, const T* src, size_t n) {
  for_each_index(int64_t(n), CopyFrom<T>{dst, src});
}
// Queues the scan of v[0, n) for NaN and Inf: bad[c] = 1 when chunk c (FlagNonFiniteChunk::kChunk
// values) holds one, else 0. No wait: the host reads `bad` after device_synchronize().
template <typename T>
void flag_nonfinite(const T* v, size_t n, Buffer<int32_t>& bad) {
  const int64_t chunks = (int64_t(n) + FlagNonFiniteChunk<T>::kChunk - 1) / FlagNonFiniteChunk<T>::kChunk;
  bad.resize(size_t(chunks));
  for_each_row(chunks, FlagNonFiniteChunk<T>{v, int64_t(n), bad.data()}, FlagNonFiniteChunk<T>::kChunk);
}

}  // namespace meshmoe
