#include "model/moe/dispatcher.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"
#include "model/moe/dispatcher_bodies.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

template <typename T>
void IndexDispatcher<T>::plan(const Routing<T>& r, uint64_t token_offset, DispatchLayout layout) {
  const int e0 = layout.e0, El = layout.count < 0 ? r.E - e0 : layout.count, G = r.G;
  for (int n = 0; n < r.N; ++n)
    for (int i = 0; i < r.k; ++i) {
      const size_t c = size_t(n) * r.k + i;
      if (r.expert[c] < 0) continue;
      if (r.expert[c] >= r.E || r.slot[c] < 0 || r.slot[c] >= r.C)
        throw Error("MoE routing: choice " + std::to_string(c) + " has expert " + std::to_string(r.expert[c]) +
                    " slot " + std::to_string(r.slot[c]) + " outside E = " + std::to_string(r.E) +
                    ", C = " + std::to_string(r.C));
    }
  // start [El*G]: first row of (expert e0 + el, group g); fill [El*G]: its rows (highest slot + 1).
  start_.assign(size_t(El) * G, 0);
  fill_.assign(size_t(El) * G, 0);
  for (int n = 0; n < r.N; ++n)
    for (int i = 0; i < r.k; ++i) {
      const size_t c = size_t(n) * r.k + i;
      const int el = r.expert[c] - e0;
      if (r.expert[c] < 0 || el < 0 || el >= El) continue;
      int64_t& f = fill_[size_t(el) * G + n / r.S];
      f = std::max<int64_t>(f, r.slot[c] + 1);
    }
  expert_rows_.assign(size_t(El), 0);
  int64_t total = 0;
  for (int el = 0; el < El; ++el)
    for (int g = 0; g < G; ++g) {
      start_[size_t(el) * G + g] = total;
      total += fill_[size_t(el) * G + g];
      expert_rows_[el] += int(fill_[size_t(el) * G + g]);
    }
  slot_token_.assign(size_t(total), -1);
  slot_global_.assign(size_t(total), -1);
  slot_choice_.assign(size_t(total), -1);
  choice_row_.assign(size_t(r.N) * r.k, -1);
  token_rows_.assign(size_t(r.N) * r.k, -1);
  for (int n = 0; n < r.N; ++n) {
    int64_t* rows_of_n = &token_rows_[size_t(n) * r.k];
    int held = 0;
    for (int i = 0; i < r.k; ++i) {
      const size_t c = size_t(n) * r.k + i;
      const int el = r.expert[c] - e0;
      if (r.expert[c] < 0 || el < 0 || el >= El) continue;
      const int64_t row = start_[size_t(el) * G + n / r.S] + r.slot[c];
      choice_row_[c] = row;
      slot_token_[row] = n;
      slot_global_[row] = int64_t(token_offset + uint64_t(n));
      slot_choice_[row] = int64_t(c);
      rows_of_n[held++] = row;
    }
    std::sort(rows_of_n, rows_of_n + held);
  }
}

template <typename T>
void IndexDispatcher<T>::reserve(size_t rows) {
  slot_token_.reserve(rows);
  slot_global_.reserve(rows);
  slot_choice_.reserve(rows);
}

// x [N, M] -> buf [rows, M]
template <typename T>
void IndexDispatcher<T>::dispatch(const Routing<T>& r, const T* x, T* buf, int M) const {
  for_each_index_2d(rows(), M, GatherRows<T, int>{x, slot_token_.data(), buf, M});
}

// dbuf [rows, M] -> dx [N, M] (added)
template <typename T>
void IndexDispatcher<T>::dispatch_backward(const Routing<T>& r, const T* dbuf, T* dx, int M) const {
  for_each_index_2d(r.N, M, DispatchBackwardElement<T>{dbuf, token_rows_.data(), dx, M, r.k});
}

// out [rows, M] -> y [N, M]
template <typename T>
void IndexDispatcher<T>::combine(const Routing<T>& r, const T* out, T* y, int M) const {
  for_each_index_2d(r.N, M, CombineElement<T>{out, r.gate.data(), choice_row_.data(), y, M, r.k});
}

// dy [N, M], out [rows, M] -> dout [rows, M], dgate [N*k]
template <typename T>
void IndexDispatcher<T>::combine_backward(const Routing<T>& r, const T* dy, const T* out, T* dout, T* dgate,
                                          int M) const {
  for_each_index_2d(rows(), M,
                 CombineBackwardOutElement<T>{dy, r.gate.data(), slot_choice_.data(), dout, M, r.k});
  for_each_index(int64_t(r.N) * r.k, CombineBackwardGateChoice<T>{dy, out, choice_row_.data(), dgate, M, r.k});
}

template class IndexDispatcher<float>;
template class IndexDispatcher<double>;

}  // namespace meshmoe
