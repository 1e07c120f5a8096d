#include "model/moe/dispatcher.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"

namespace meshmoe {

namespace {
// Row of the EGCM buffer for choice c of token n.
template <typename T>
inline size_t buffer_row(const Routing<T>& r, int n, size_t c) {
  return (size_t(r.expert[c]) * r.G + size_t(n / r.S)) * r.C + size_t(r.slot[c]);
}
}  // namespace

template <typename T>
void IndexDispatcher<T>::plan(const Routing<T>& r, uint64_t token_offset) {
  const size_t rows = size_t(r.E) * r.G * r.C;
  slot_token_.assign(rows, -1);
  slot_global_.assign(rows, -1);
  for (int n = 0; n < r.N; ++n)
    for (int i = 0; i < r.k; ++i) {
      const size_t c = size_t(n) * r.k + i;
      if (r.expert[c] < 0) continue;
      if (r.expert[c] >= r.E || r.slot[c] < 0 || r.slot[c] >= r.C)
        throw Error("MoE routing: choice " + std::to_string(c) + " has expert " + std::to_string(r.expert[c]) +
                    " slot " + std::to_string(r.slot[c]) + " outside E = " + std::to_string(r.E) +
                    ", C = " + std::to_string(r.C));
      const size_t row = buffer_row(r, n, c);
      slot_token_[row] = n;
      slot_global_[row] = int64_t(token_offset + uint64_t(n));
    }
}

// x [N, M] -> buf [E, G, C, M]
template <typename T>
void IndexDispatcher<T>::dispatch(const Routing<T>& r, const T* x, T* buf, int M) const {
  for (size_t row = 0; row < slot_token_.size(); ++row) {
    T* dst = buf + row * M;
    const int n = slot_token_[row];
    if (n < 0) std::fill(dst, dst + M, T(0));
    else std::copy(x + size_t(n) * M, x + size_t(n + 1) * M, dst);
  }
}

// dbuf [E, G, C, M] -> dx [N, M] (added)
template <typename T>
void IndexDispatcher<T>::dispatch_backward(const Routing<T>& r, const T* dbuf, T* dx, int M) const {
  for (size_t row = 0; row < slot_token_.size(); ++row) {
    const int n = slot_token_[row];
    if (n < 0) continue;
    const T* src = dbuf + row * M;
    T* d = dx + size_t(n) * M;
    for (int m = 0; m < M; ++m) d[m] += src[m];
  }
}

// out [E, G, C, M] -> y [N, M]
template <typename T>
void IndexDispatcher<T>::combine(const Routing<T>& r, const T* out, T* y, int M) const {
  std::fill(y, y + size_t(r.N) * M, T(0));
  for (int n = 0; n < r.N; ++n)
    for (int i = 0; i < r.k; ++i) {
      const size_t c = size_t(n) * r.k + i;
      if (r.expert[c] < 0) continue;
      const T g = r.gate[c];
      const T* src = out + buffer_row(r, n, c) * M;
      T* d = y + size_t(n) * M;
      for (int m = 0; m < M; ++m) d[m] += g * src[m];
    }
}

// dy [N, M], out [E, G, C, M] -> dout [E, G, C, M], dgate [N*k]
template <typename T>
void IndexDispatcher<T>::combine_backward(const Routing<T>& r, const T* dy, const T* out, T* dout, T* dgate,
                                          int M) const {
  std::fill(dout, dout + slot_token_.size() * M, T(0));
  for (int n = 0; n < r.N; ++n)
    for (int i = 0; i < r.k; ++i) {
      const size_t c = size_t(n) * r.k + i;
      dgate[c] = T(0);
      if (r.expert[c] < 0) continue;
      const size_t row = buffer_row(r, n, c);
      const T* o = out + row * M;
      const T* d = dy + size_t(n) * M;
      T* dst = dout + row * M;
      T acc = 0;
      for (int m = 0; m < M; ++m) {
        acc += d[m] * o[m];
        dst[m] = r.gate[c] * d[m];
      }
      dgate[c] = acc;
    }
}

template class IndexDispatcher<float>;
template class IndexDispatcher<double>;

}  // namespace meshmoe
