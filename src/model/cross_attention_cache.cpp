#include "model/cross_attention_cache.hpp"

#include <algorithm>
#include <stdexcept>

#include "model/attention_core.hpp"
#include "tensor/blas.hpp"

namespace meshmoe {

template <typename T>
void CrossAttentionCache<T>::reset(const CrossAttention<T>& cross, int d_model, const T* enc,
                                   const std::vector<int>& source_begin) {
  if (source_begin.empty() || source_begin.front() != 0) throw std::logic_error("CrossAttentionCache: no sources");
  for (size_t s = 1; s < source_begin.size(); ++s)
    if (source_begin[s] <= source_begin[s - 1]) throw std::logic_error("CrossAttentionCache: an empty source");
  begin_ = source_begin;
  M_ = d_model;
  D_ = d_model / cross.num_heads();
  heads_l_ = cross.local_heads();
  A_l_ = heads_l_ * D_;
  const int rows = begin_.back();
  k_.resize(size_t(rows) * A_l_);
  v_.resize(size_t(rows) * A_l_);
  // k, v [rows, A_l] = enc [rows, M] W [M, A_l], as the full forward's projections
  matmul(false, false, rows, A_l_, M_, enc, cross.wk.w, k_.data());
  matmul(false, false, rows, A_l_, M_, enc, cross.wv.w, v_.data());
}

// x [n, M] -> y [n, M]
template <typename T>
void CrossAttentionCache<T>::forward(CrossAttention<T>& cross, int n, const int32_t* source, const T* x, T* y) {
  const int A_l = A_l_;
  const size_t n_A = size_t(n) * A_l;
  q_.resize(n_A);
  att_.resize(n_A);
  int longest = 0;
  for (int s = 0; s < sources(); ++s) longest = std::max(longest, begin_[size_t(s) + 1] - begin_[size_t(s)]);
  p_.resize(size_t(heads_l_) * longest);
  // q [n, A_l] = x [n, M] wq [M, A_l]
  matmul(false, false, n, A_l, M_, x, cross.wq.w, q_.data());
  for (int i = 0; i < n; ++i) {
    const int s = source[i];
    if (s < 0 || s >= sources()) throw std::logic_error("CrossAttentionCache: a token of an unknown source");
    const size_t first = size_t(begin_[size_t(s)]) * A_l;
    const int Tk = begin_[size_t(s) + 1] - begin_[size_t(s)];
    const AttentionPairs one_query{.B = 1, .heads_l = heads_l_, .D = D_, .Tq = 1, .Tk = Tk};
    masked_attention_forward(one_query, q_.data() + size_t(i) * A_l, k_.data() + first, v_.data() + first, p_.data(),
                             att_.data() + size_t(i) * A_l);
  }
  // y [n, M] = att [n, A_l] wo [A_l, M]  (partial over heads when sharded)
  matmul(false, false, n, M_, A_l, att_.data(), cross.wo.w, y);
  if (cross.sharded() && cross.tensor_allreduce) cross.tensor_allreduce(y, size_t(n) * M_);
}

template class CrossAttentionCache<float>;
template class CrossAttentionCache<double>;

}  // namespace meshmoe
