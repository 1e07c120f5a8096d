#include "model/attention_cache.hpp"

#include <cmath>
#include <string>

#include "core/error.hpp"
#include "model/rope.hpp"
#include "tensor/blas.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {

template <typename T>
void AttentionCache<T>::reset(int streams, int capacity, int d_model, const CausalSelfAttention<T>& attn) {
  if (streams < 0 || capacity < 1) throw std::logic_error("AttentionCache: no room");
  capacity_ = capacity;
  M_ = d_model;
  D_ = d_model / attn.num_heads();
  A_l_ = attn.local_heads() * D_;
  KV_l_ = attn.shape().KV_l;
  length_.assign(size_t(streams), 0);
  const size_t n = size_t(streams) * size_t(capacity) * size_t(KV_l_);
  k_.resize(n);
  v_.resize(n);
}

// x [n, M] -> y [n, M]
template <typename T>
void AttentionCache<T>::forward(CausalSelfAttention<T>& attn, const CachedTokens& tok, const T* x, T* y) {
  const int n = tok.n, A_l = A_l_, KV_l = KV_l_, D = D_, heads_l = attn.local_heads(), cap = capacity_;
  const AttentionShape& shape = attn.shape();
  const size_t n_A = size_t(n) * A_l, n_KV = size_t(n) * KV_l;
  q_.resize(n_A);
  kn_.resize(n_KV);
  vn_.resize(n_KV);
  att_.resize(n_A);
  // q [n, A_l], k, v [n, KV_l] = x [n, M] W, as the full forward's projections
  matmul(false, false, n, A_l, M_, x, attn.wq.w, q_.data());
  matmul(false, false, n, KV_l, M_, x, attn.wk.w, kn_.data());
  matmul(false, false, n, KV_l, M_, x, attn.wv.w, vn_.data());
  // Rotary positions (rope.hpp): the new tokens' queries and keys at their own positions; the cached
  // keys were rotated when they were appended.
  if (attn.rope_base() > 0) {
    rope_rotate(q_.data(), n, heads_l, D, A_l, tok.position, 1, attn.rope_base(), false);
    rope_rotate(kn_.data(), n, shape.kv_heads_l, D, KV_l, tok.position, 1, attn.rope_base(), false);
  }
  where_.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    const int s = tok.stream[i];
    if (s < 0 || s >= streams()) throw std::logic_error("AttentionCache: token of an unknown stream");
    if (length_[size_t(s)] == cap)
      throw Error("decoding: stream " + std::to_string(s) + " holds its " + std::to_string(cap) +
                  " tokens already (the cache's capacity)");
    const int j = length_[size_t(s)]++;
    where_[size_t(i)] = j;
    const size_t at = (size_t(s) * cap + size_t(j)) * KV_l;
    copy_from(k_.data() + at, kn_.data() + size_t(i) * KV_l, size_t(KV_l));
    copy_from(v_.data() + at, vn_.data() + size_t(i) * KV_l, size_t(KV_l));
  }
  // Per (token, local head): the scaled scores over the keys it sees, the softmax in the full
  // forward's order (max, exp, sum, times 1/sum; attention_bodies.hpp), then the weighted values.
  // Grouped-query attention: query head h reads its group's key/value head (kv_heads.hpp).
  const T scale = T(1) / std::sqrt(T(D));
  for_each_task(int64_t(n) * heads_l, [&](int64_t ih) {
    const int i = int(ih / heads_l), h = int(ih % heads_l), self = where_[size_t(i)];
    const int kv = (shape.head0 + h) / shape.group() - shape.kv0;
    const size_t stream_base = size_t(tok.stream[i]) * cap * KV_l + size_t(kv) * D;
    const uint8_t* vis = tok.visible ? tok.visible + size_t(i) * cap : nullptr;
    auto sees = [&](int j) { return j == self || !vis || vis[j] != 0; };
    const T* q = q_.data() + size_t(i) * A_l + size_t(h) * D;
    std::vector<T> p(size_t(self) + 1, T(0));
    T mx = 0;
    bool any = false;
    for (int j = 0; j <= self; ++j) {
      if (!sees(j)) continue;
      const T* k = k_.data() + stream_base + size_t(j) * KV_l;
      T dot = 0;
      for (int d = 0; d < D; ++d) dot += q[d] * k[d];
      p[size_t(j)] = scale * dot;
      mx = any && mx > p[size_t(j)] ? mx : p[size_t(j)];
      any = true;
    }
    T sum = 0;
    for (int j = 0; j <= self; ++j) {
      p[size_t(j)] = sees(j) ? std::exp(p[size_t(j)] - mx) : T(0);
      sum += p[size_t(j)];
    }
    const T inv = T(1) / sum;
    T* o = att_.data() + size_t(i) * A_l + size_t(h) * D;
    for (int d = 0; d < D; ++d) o[d] = 0;
    for (int j = 0; j <= self; ++j) {
      if (!sees(j)) continue;
      const T w = p[size_t(j)] * inv;
      const T* v = v_.data() + stream_base + size_t(j) * KV_l;
      for (int d = 0; d < D; ++d) o[d] += w * v[d];
    }
  });
  // y [n, M] = att [n, A_l] wo [A_l, M]  (partial over heads when sharded)
  matmul(false, false, n, M_, A_l, att_.data(), attn.wo.w, y);
  if (attn.sharded() && attn.tensor_allreduce) attn.tensor_allreduce(y, size_t(n) * M_);
}

template class AttentionCache<float>;
template class AttentionCache<double>;

}  // namespace meshmoe
