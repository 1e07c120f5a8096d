#include "oracle/einsum_oracle.hpp"

#include <algorithm>

namespace meshmoe {

template <typename T>
void EinsumMoeOracle<T>::forward(const Routing<T>& r, Activation act, int M, int H, const T* x, const T* w_in,
                                 const T* w_out, T* y) {
  r_ = &r, act_ = act, M_ = M, H_ = H, x_ = x, w_in_ = w_in, w_out_ = w_out;
  const int G = r.G, S = r.S, E = r.E, C = r.C, Hin = activation_in_width(act, H);
  auto gsec = [&](int g, int s, int e, int c) { return ((size_t(g) * S + s) * E + e) * C + c; };
  auto egc = [&](int e, int g, int c) { return (size_t(e) * G + g) * C + c; };

  // Top2Gating's outputs from the triples.
  dispatch_mask.assign(size_t(G) * S * E * C, T(0));
  combine_weights.assign(dispatch_mask.size(), T(0));
  for (int n = 0; n < r.N; ++n)
    for (int i = 0; i < r.k; ++i) {
      const size_t c = size_t(n) * r.k + i;
      if (r.expert[c] < 0) continue;
      const size_t at = gsec(n / S, n % S, r.expert[c], r.slot[c]);
      dispatch_mask[at] = T(1);
      combine_weights[at] = r.gate[c];
    }

  disp_.assign(size_t(E) * G * C * M, T(0));
  pre_.assign(size_t(E) * G * C * Hin, T(0));
  h_.assign(size_t(E) * G * C * H, T(0));
  out_.assign(size_t(E) * G * C * M, T(0));
  // einsum(GSEC,GSM->EGCM)
  for (int e = 0; e < E; ++e)
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < C; ++c)
        for (int m = 0; m < M; ++m) {
          T acc = 0;
          for (int s = 0; s < S; ++s) acc += dispatch_mask[gsec(g, s, e, c)] * x[(size_t(g) * S + s) * M + m];
          disp_[egc(e, g, c) * M + m] = acc;
        }
  // einsum(EGCM,EMH->EGCH), act
  for (int e = 0; e < E; ++e)
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < C; ++c) {
        for (int j = 0; j < Hin; ++j) {
          T acc = 0;
          for (int m = 0; m < M; ++m) acc += disp_[egc(e, g, c) * M + m] * w_in[(size_t(e) * M + m) * Hin + j];
          pre_[egc(e, g, c) * Hin + j] = acc;
        }
        activation_forward(act, &pre_[egc(e, g, c) * Hin], &h_[egc(e, g, c) * H], 1, H);
      }
  // einsum(EGCH,EHM->EGCM)
  for (int e = 0; e < E; ++e)
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < C; ++c)
        for (int m = 0; m < M; ++m) {
          T acc = 0;
          for (int j = 0; j < H; ++j) acc += h_[egc(e, g, c) * H + j] * w_out[(size_t(e) * H + j) * M + m];
          out_[egc(e, g, c) * M + m] = acc;
        }
  // einsum(GSEC,EGCM->GSM)
  for (int g = 0; g < G; ++g)
    for (int s = 0; s < S; ++s)
      for (int m = 0; m < M; ++m) {
        T acc = 0;
        for (int e = 0; e < E; ++e)
          for (int c = 0; c < C; ++c) acc += combine_weights[gsec(g, s, e, c)] * out_[egc(e, g, c) * M + m];
        y[(size_t(g) * S + s) * M + m] = acc;
      }
}

template <typename T>
void EinsumMoeOracle<T>::backward(const T* dy, T* dx, T* dw_in, T* dw_out, T* dgate) {
  const Routing<T>& r = *r_;
  const int G = r.G, S = r.S, E = r.E, C = r.C, M = M_, H = H_, Hin = activation_in_width(act_, H);
  auto gsec = [&](int g, int s, int e, int c) { return ((size_t(g) * S + s) * E + e) * C + c; };
  auto egc = [&](int e, int g, int c) { return (size_t(e) * G + g) * C + c; };

  // y = einsum(GSEC,EGCM->GSM): dcombine = einsum(GSM,EGCM->GSEC), dout = einsum(GSEC,GSM->EGCM)
  std::vector<T> dcw(combine_weights.size(), T(0)), dout(out_.size(), T(0));
  for (int g = 0; g < G; ++g)
    for (int s = 0; s < S; ++s)
      for (int e = 0; e < E; ++e)
        for (int c = 0; c < C; ++c) {
          T acc = 0;
          for (int m = 0; m < M; ++m) acc += dy[(size_t(g) * S + s) * M + m] * out_[egc(e, g, c) * M + m];
          dcw[gsec(g, s, e, c)] = acc;
        }
  for (int e = 0; e < E; ++e)
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < C; ++c)
        for (int m = 0; m < M; ++m) {
          T acc = 0;
          for (int s = 0; s < S; ++s) acc += combine_weights[gsec(g, s, e, c)] * dy[(size_t(g) * S + s) * M + m];
          dout[egc(e, g, c) * M + m] = acc;
        }
  // out = einsum(EGCH,EHM->EGCM): dw_out = einsum(EGCH,EGCM->EHM), dh = einsum(EGCM,EHM->EGCH)
  std::vector<T> dh(h_.size(), T(0)), dpre(pre_.size(), T(0)), ddisp(disp_.size(), T(0));
  for (int e = 0; e < E; ++e)
    for (int j = 0; j < H; ++j)
      for (int m = 0; m < M; ++m) {
        T acc = 0;
        for (int g = 0; g < G; ++g)
          for (int c = 0; c < C; ++c) acc += h_[egc(e, g, c) * H + j] * dout[egc(e, g, c) * M + m];
        dw_out[(size_t(e) * H + j) * M + m] += acc;
      }
  for (int e = 0; e < E; ++e)
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < C; ++c) {
        for (int j = 0; j < H; ++j) {
          T acc = 0;
          for (int m = 0; m < M; ++m) acc += dout[egc(e, g, c) * M + m] * w_out_[(size_t(e) * H + j) * M + m];
          dh[egc(e, g, c) * H + j] = acc;
        }
        activation_backward(act_, &pre_[egc(e, g, c) * Hin], &dh[egc(e, g, c) * H], &dpre[egc(e, g, c) * Hin], 1, H);
      }
  // pre = einsum(EGCM,EMH->EGCH): dw_in = einsum(EGCM,EGCH->EMH), ddisp = einsum(EGCH,EMH->EGCM)
  for (int e = 0; e < E; ++e)
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < Hin; ++j) {
        T acc = 0;
        for (int g = 0; g < G; ++g)
          for (int c = 0; c < C; ++c) acc += disp_[egc(e, g, c) * M + m] * dpre[egc(e, g, c) * Hin + j];
        dw_in[(size_t(e) * M + m) * Hin + j] += acc;
      }
  for (int e = 0; e < E; ++e)
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < C; ++c)
        for (int m = 0; m < M; ++m) {
          T acc = 0;
          for (int j = 0; j < Hin; ++j) acc += dpre[egc(e, g, c) * Hin + j] * w_in_[(size_t(e) * M + m) * Hin + j];
          ddisp[egc(e, g, c) * M + m] = acc;
        }
  // dispatched = einsum(GSEC,GSM->EGCM): dx = einsum(GSEC,EGCM->GSM)
  for (int g = 0; g < G; ++g)
    for (int s = 0; s < S; ++s)
      for (int m = 0; m < M; ++m) {
        T acc = 0;
        for (int e = 0; e < E; ++e)
          for (int c = 0; c < C; ++c) acc += dispatch_mask[gsec(g, s, e, c)] * ddisp[egc(e, g, c) * M + m];
        dx[(size_t(g) * S + s) * M + m] += acc;
      }
  // The gate of choice (n, i) is combine_weights at its (g, s, e, slot).
  for (int n = 0; n < r.N; ++n)
    for (int i = 0; i < r.k; ++i) {
      const size_t c = size_t(n) * r.k + i;
      dgate[c] = r.expert[c] < 0 ? T(0) : dcw[gsec(n / S, n % S, r.expert[c], r.slot[c])];
    }
}

template class EinsumMoeOracle<float>;
template class EinsumMoeOracle<double>;

}  // namespace meshmoe
