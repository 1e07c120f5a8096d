// The fused attention on tensor cores (model/fused_attention_tc.hpp): FlashAttention-2 (Dao 2023,
// Algorithms 1 and 2) with one thread block of kWarps warps per (sequence b, head h, block of 64
// query rows) for the forward and dQ, or of 64 key rows for dK and dV. Each warp owns one 16-row
// tile of its block, the host's tile (kFusedTile), and walks the other side's 16-row tiles in the
// host bodies' order (model/fused_attention_bodies.hpp): the online softmax rescales at the same
// tiles, and the same values are rounded to bf16 (Q, K, V, dO as staged; P unnormalised per key
// tile before P V; P before P^T dO and dS before dS K and dS^T Q). The products run on WMMA 16x16x16
// bf16 fragments with fp32 accumulators, a tile's product summed fresh and then added to the
// running rows as the host adds its tile's sum; S, the running max and sum, exp, lse and P for dS
// stay fp32. Every output element is written by one warp and every sum runs in one fixed order,
// with no atomics: two runs are bitwise equal. Above the diagonal (causal) whole blocks are skipped.
//
// Shared memory per block (dynamic, 128-byte aligned parts): the staged 64-row blocks in bf16 (rows
// past T zero, so a short last tile adds exact zeros and reads nothing out of range), and per warp
// its tile's S (and dP), P (and dS) and the fp32 rows it accumulates or writes out. Barriers:
// __syncthreads around each staging (every warp reads every staged row), __syncwarp between a
// warp's phases (its lanes share its tile's arrays). The kernels need sm_80 (bf16 WMMA); compiled
// for an older arch their body traps and fused_attention_tc_ready says no (the tile kernel runs).
#include "model/fused_attention_tc.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "tensor/bf16.hpp"
#include "tensor/cuda_check.hpp"
#include "tensor/cuda_profile.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

namespace {

using bf16 = __nv_bfloat16;
constexpr int kWarps = 4;                        // a block's warps, one 16-row tile each
constexpr int kBlockRows = kWarps * kFusedTile;  // 64 query rows (forward, dQ) or key rows (dK, dV)
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 8;  // bf16 row padding of the staged blocks (ldm stays a multiple of 8 elements)
constexpr int kTileElements = kFusedTile * kFusedTile;

// Consecutive 128-byte aligned arrays of one shared memory block; from a null base (the host) it
// only counts the bytes, so launch and kernel share one layout.
struct Carve {
  uintptr_t at;
  size_t bytes = 0;
  template <typename U>
  MESHMOE_HD U* take(size_t n) {
    U* p = reinterpret_cast<U*>(at + bytes);
    bytes += (n * sizeof(U) + 127) / 128 * 128;
    return p;
  }
  // A staged block of 64 rows, kWarps tiles (one a warp), kWarps 16-row blocks of D columns.
  template <int D>
  MESHMOE_HD bf16* staged() { return take<bf16>(kBlockRows * (D + kPad)); }
  template <typename U>
  MESHMOE_HD U* warp_tiles() { return take<U>(kWarps * kTileElements); }
  template <int D>
  MESHMOE_HD float* warp_rows() { return take<float>(kWarps * kFusedTile * D); }
};

// The staged rows: [kBlockRows][D + kPad] bf16; the per-warp arrays: kWarps of each, warp w's at w x size.
template <int D>
struct ForwardShared {
  bf16 *q, *k, *v;
  float* s;    // [kFusedTile][kFusedTile]: Q K^T, then scale Q K^T
  bf16* p;     // [kFusedTile][kFusedTile]: P of the tile, unnormalised, rounded
  float* row;  // [kFusedTile]: each row's rescaling exp(m_old - m_new), at the end 1 / l
  float* pv;   // [kFusedTile][D]: the tile's P V
  float* o;    // [kFusedTile][D]: the running output rows
  size_t bytes;
  MESHMOE_HD explicit ForwardShared(void* base) {
    Carve c{reinterpret_cast<uintptr_t>(base)};
    q = c.staged<D>(), k = c.staged<D>(), v = c.staged<D>();
    s = c.warp_tiles<float>(), p = c.warp_tiles<bf16>();
    row = c.take<float>(kWarps * kFusedTile);
    pv = c.warp_rows<D>(), o = c.warp_rows<D>();
    bytes = c.bytes;
  }
};

// The backward's (both kernels): q, dO and k, v staged; s, dp the tile's Q K^T and dO V^T; p, ds
// its P and dS rounded; out [kFusedTile][D] the warp's gradient rows on their way out.
template <int D>
struct BackwardShared {
  bf16 *q, *dO, *k, *v;
  float *s, *dp;
  bf16 *p, *ds;
  float* out;
  size_t bytes;
  MESHMOE_HD explicit BackwardShared(void* base) {
    Carve c{reinterpret_cast<uintptr_t>(base)};
    q = c.staged<D>(), dO = c.staged<D>(), k = c.staged<D>(), v = c.staged<D>();
    s = c.warp_tiles<float>(), dp = c.warp_tiles<float>(), p = c.warp_tiles<bf16>(), ds = c.warp_tiles<bf16>();
    out = c.warp_rows<D>();
    bytes = c.bytes;
  }
  // The same with the per-warp arrays at warp w's.
  MESHMOE_HD BackwardShared of_warp(int w) const {
    BackwardShared r = *this;
    r.s += w * kTileElements, r.dp += w * kTileElements, r.p += w * kTileElements, r.ds += w * kTileElements;
    r.out += w * kFusedTile * D;
    return r;
  }
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
namespace wmma = nvcuda::wmma;
using RowA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using ColA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using RowB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using ColB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// A thread's place: its warp w and lane in the block, the block's head h and sequence b.
struct Place {
  int w, lane, h;
  int64_t b;
};
__device__ inline Place thread_place() {
  return {int(threadIdx.x) / 32, int(threadIdx.x) % 32, int(blockIdx.y), int64_t(blockIdx.z)};
}

// The host's round_bf16 (tensor/bf16.hpp), as the bf16 type the fragments load.
__device__ inline bf16 to_bf16(float x) { return __ushort_as_bfloat16(bf16_bits(x)); }

// dst [kBlockRows][D + kPad] = rows row0 .. row0 + 63 of x's head h in bf16, zero past T; the
// block's threads along each row (coalesced).
template <int D>
__device__ void stage_rows(const FusedAttentionOperands<float>& a, const float* x, int64_t b, int h, int row0,
                           bf16* dst) {
  for (int e = threadIdx.x; e < kBlockRows * D; e += kThreads) {
    const int r = e / D, d = e % D, i = row0 + r;
    dst[r * (D + kPad) + d] = i < a.Tq ? to_bf16(x[a.at(b, i, h) + d]) : __ushort_as_bfloat16(0);
  }
}

// out [16][16] (row-major) = X Y^T of two staged 16-row tiles over the D columns, in order of the
// 16-column chunks: Q K^T (scores before the scale) and dO V^T (dP).
template <int D>
__device__ void tile_rows_product(const bf16* x, const bf16* y, float* out) {
  Acc acc;
  wmma::fill_fragment(acc, 0.0f);
  for (int c = 0; c < D / 16; ++c) {
    RowA xf;
    ColB yf;  // Y^T: element (d, j) at y[j * ld + d]
    wmma::load_matrix_sync(xf, x + c * 16, D + kPad);
    wmma::load_matrix_sync(yf, y + c * 16, D + kPad);
    wmma::mma_sync(acc, xf, yf, acc);
  }
  wmma::store_matrix_sync(out, acc, kFusedTile, wmma::mem_row_major);
}

// grad[c] += factor (M X) of the chunk c of D: M a loaded 16 x 16 fragment (P, P^T, dS or dS^T),
// X a staged 16-row tile; each chunk's product summed fresh, then added (the host's g += factor acc).
template <int D, class MFragment>
__device__ void add_tile_products(const MFragment& m, const bf16* x, float factor, Acc (&grad)[D / 16]) {
  for (int c = 0; c < D / 16; ++c) {
    RowB xf;
    Acc part;
    wmma::load_matrix_sync(xf, x + c * 16, D + kPad);
    wmma::fill_fragment(part, 0.0f);
    wmma::mma_sync(part, m, xf, part);
    for (int e = 0; e < part.num_elements; ++e) grad[c].x[e] += factor * part.x[e];
  }
}

// Rows row0 .. row0 + 15 of dst's head h (those inside T) = grad, through the warp's out rows.
template <int D>
__device__ void write_rows(const FusedAttentionOperands<float>& a, Acc (&grad)[D / 16], float* out, int64_t b, int h,
                           int row0, float* dst, int lane) {
  for (int c = 0; c < D / 16; ++c) wmma::store_matrix_sync(out + c * 16, grad[c], D, wmma::mem_row_major);
  __syncwarp();
  for (int e = lane; e < kFusedTile * D; e += 32) {
    const int r = e / D, d = e % D;
    if (row0 + r < a.Tq) dst[a.at(b, row0 + r, h) + d] = out[e];
  }
  __syncwarp();
}

// P and dS of the tile of query rows i0 .. and key rows j0 .. from its Q K^T (s) and dP, over the
// warp's lanes: P = exp(scale s - lse_i) where i sees j, else 0 (FusedAttentionOperands::
// probabilities), dS = P (dP - delta_i) (score_grads); both rounded, P only where p is asked for.
// lse and delta are read only for visible rows (inside T).
__device__ void probability_grads(const FusedAttentionOperands<float>& a, int64_t b, int h, int i0, int j0,
                                  const float* lse, const float* delta, const float* s, const float* dp, bf16* p,
                                  bf16* ds, int lane) {
  for (int e = lane; e < kTileElements; e += 32) {
    const int r = e / kFusedTile, c = e % kFusedTile;
    const int64_t row = (b * a.heads_l + h) * a.Tq + i0 + r;
    const float pe = a.sees(b, i0 + r, j0 + c) ? expf(a.scale * s[e] - lse[row]) : 0.0f;
    const float dse = pe == 0.0f ? 0.0f : pe * (dp[e] - delta[row]);
    if (p) p[e] = to_bf16(pe);
    ds[e] = to_bf16(dse);
  }
}

// The query side's walk (forward, dQ): each key block up to the query block's last (causal: its
// own) staged as K and V, then tile(t, kt) for the warp's key tiles in it, in order.
template <int D, class Tile>
__device__ void walk_key_tiles(const FusedAttentionOperands<float>& a, int64_t b, int h, int qb, int qt, bool active,
                               bf16* k, bf16* v, const Tile& tile) {
  const int last_block = a.causal ? qb : (a.Tq - 1) / kBlockRows;
  for (int kb = 0; kb <= last_block; ++kb) {
    __syncthreads();  // the query rows staged; every warp done with the previous K and V
    stage_rows<D>(a, a.k, b, h, kb * kBlockRows, k);
    stage_rows<D>(a, a.v, b, h, kb * kBlockRows, v);
    __syncthreads();
    if (!active) continue;
    for (int t = 0; t < kWarps; ++t) {
      const int kt = kb * kWarps + t;
      if (kt > a.last_key_tile(qt)) break;  // causal: kt <= qt; else the last tile (< T)
      tile(t, kt);
    }
  }
}

// One block: the query tiles qb*4 .. qb*4+3, warp w the tile qb*4 + w (FusedAttentionForwardTile).
template <int D>
__device__ void forward_block(const FusedAttentionOperands<float>& a, float* O, float* lse) {
  extern __shared__ __align__(128) unsigned char shared[];
  const ForwardShared<D> sh(shared);
  constexpr int ld = D + kPad;
  const auto [w, lane, h, b] = thread_place();
  const int qb = int(gridDim.x - 1 - blockIdx.x);  // the causal mask's longest rows first
  const int qt = qb * kWarps + w, i0 = qt * kFusedTile;
  const bool active = i0 < a.Tq;  // a warp past T stages with the others and computes nothing
  float* s = sh.s + w * kTileElements;
  bf16* p = sh.p + w * kTileElements;
  float* row = sh.row + w * kFusedTile;
  float* pv = sh.pv + w * kFusedTile * D;
  float* o = sh.o + w * kFusedTile * D;
  stage_rows<D>(a, a.q, b, h, qb * kBlockRows, sh.q);
  for (int e = lane; e < kFusedTile * D; e += 32) o[e] = 0;
  float m = -INFINITY, l = 0;  // lane r < 16: query row i0 + r's running max and sum
  walk_key_tiles<D>(a, b, h, qb, qt, active, sh.k, sh.v, [&](int t, int kt) {
    tile_rows_product<D>(sh.q + w * kFusedTile * ld, sh.k + t * kFusedTile * ld, s);
    __syncwarp();
    if (lane < kFusedTile) {  // row i: the online softmax of one key tile
      const int i = i0 + lane, j0 = kt * kFusedTile;
      float* sr = s + lane * kFusedTile;
      bf16* pr = p + lane * kFusedTile;
      bool vis[kFusedTile];
      float mt = m;
#pragma unroll
      for (int c = 0; c < kFusedTile; ++c) {
        vis[c] = a.sees(b, i, j0 + c);
        sr[c] = a.scale * sr[c];
        if (vis[c]) mt = sr[c] > mt ? sr[c] : mt;
      }
      float alpha = 1;  // no key of this row's example yet (or a row past T): m, l, O stay, P = 0
      if (mt == -INFINITY) {
#pragma unroll
        for (int c = 0; c < kFusedTile; ++c) pr[c] = __ushort_as_bfloat16(0);
      } else {
        alpha = m == -INFINITY ? 0.0f : expf(m - mt);
        float sum = 0;
#pragma unroll
        for (int c = 0; c < kFusedTile; ++c) {
          const float pc = vis[c] ? expf(sr[c] - mt) : 0.0f;
          sum += pc;
          pr[c] = to_bf16(pc);
        }
        l = l * alpha + sum;
        m = mt;
      }
      row[lane] = alpha;
    }
    __syncwarp();
    RowA pf;
    wmma::load_matrix_sync(pf, p, kFusedTile);
    for (int c = 0; c < D / 16; ++c) {
      RowB vf;
      Acc part;
      wmma::load_matrix_sync(vf, sh.v + t * kFusedTile * ld + c * 16, ld);
      wmma::fill_fragment(part, 0.0f);
      wmma::mma_sync(part, pf, vf, part);
      wmma::store_matrix_sync(pv + c * 16, part, D, wmma::mem_row_major);
    }
    __syncwarp();
    for (int e = lane; e < kFusedTile * D; e += 32) o[e] = o[e] * row[e / D] + pv[e];
    __syncwarp();  // s, p, row and pv are the next tile's
  });
  if (!active) return;  // no barrier follows
  // Every row inside T sees at least itself: l > 0.
  if (lane < kFusedTile && i0 + lane < a.Tq) {
    row[lane] = 1.0f / l;
    lse[(b * a.heads_l + h) * a.Tq + i0 + lane] = m + logf(l);
  }
  __syncwarp();
  for (int e = lane; e < kFusedTile * D; e += 32) {
    const int r = e / D, d = e % D;
    if (i0 + r < a.Tq) O[a.at(b, i0 + r, h) + d] = o[e] * row[r];
  }
}

// One block: dQ of the query tiles qb*4 .. qb*4+3, warp w the tile qb*4 + w, over the key tiles in
// order (FusedAttentionBackwardQueryTile).
template <int D>
__device__ void query_grad_block(const FusedAttentionOperands<float>& a, const float* lse, const float* dO,
                                 const float* delta, float* dq) {
  extern __shared__ __align__(128) unsigned char shared[];
  constexpr int ld = D + kPad;
  const auto [w, lane, h, b] = thread_place();
  const BackwardShared<D> sh = BackwardShared<D>(shared).of_warp(w);
  const int qb = int(gridDim.x - 1 - blockIdx.x);
  const int qt = qb * kWarps + w, i0 = qt * kFusedTile;
  const bool active = i0 < a.Tq;
  stage_rows<D>(a, a.q, b, h, qb * kBlockRows, sh.q);
  stage_rows<D>(a, dO, b, h, qb * kBlockRows, sh.dO);
  Acc grad[D / 16];
  for (auto& g : grad) wmma::fill_fragment(g, 0.0f);
  walk_key_tiles<D>(a, b, h, qb, qt, active, sh.k, sh.v, [&](int t, int kt) {
    tile_rows_product<D>(sh.q + w * kFusedTile * ld, sh.k + t * kFusedTile * ld, sh.s);
    tile_rows_product<D>(sh.dO + w * kFusedTile * ld, sh.v + t * kFusedTile * ld, sh.dp);
    __syncwarp();
    probability_grads(a, b, h, i0, kt * kFusedTile, lse, delta, sh.s, sh.dp, nullptr, sh.ds, lane);
    __syncwarp();
    RowA dsf;
    wmma::load_matrix_sync(dsf, sh.ds, kFusedTile);
    add_tile_products<D>(dsf, sh.k + t * kFusedTile * ld, a.scale, grad);
    __syncwarp();
  });
  if (!active) return;
  write_rows<D>(a, grad, sh.out, b, h, i0, dq, lane);
}

// One block: dK and dV of the key tiles kb*4 .. kb*4+3, warp w the tile kb*4 + w, over the query
// tiles in order (FusedAttentionBackwardKeyTile).
template <int D>
__device__ void key_grad_block(const FusedAttentionOperands<float>& a, const float* lse, const float* dO,
                               const float* delta, float* dk, float* dv) {
  extern __shared__ __align__(128) unsigned char shared[];
  constexpr int ld = D + kPad;
  const auto [w, lane, h, b] = thread_place();
  const BackwardShared<D> sh = BackwardShared<D>(shared).of_warp(w);
  const int kb = int(blockIdx.x);  // causal: the first key blocks have the most query tiles
  const int kt = kb * kWarps + w, j0 = kt * kFusedTile;
  const bool active = j0 < a.Tq;
  stage_rows<D>(a, a.k, b, h, kb * kBlockRows, sh.k);
  stage_rows<D>(a, a.v, b, h, kb * kBlockRows, sh.v);
  Acc grad_k[D / 16], grad_v[D / 16];
  for (int c = 0; c < D / 16; ++c) {
    wmma::fill_fragment(grad_k[c], 0.0f);
    wmma::fill_fragment(grad_v[c], 0.0f);
  }
  const int first_block = a.causal ? kb : 0, last_block = (a.Tq - 1) / kBlockRows;
  for (int qb = first_block; qb <= last_block; ++qb) {
    __syncthreads();
    stage_rows<D>(a, a.q, b, h, qb * kBlockRows, sh.q);
    stage_rows<D>(a, dO, b, h, qb * kBlockRows, sh.dO);
    __syncthreads();
    if (!active) continue;
    for (int t = 0; t < kWarps; ++t) {
      const int qt = qb * kWarps + t;
      if (qt >= a.tiles()) break;
      if (qt < a.first_query_tile(kt)) continue;
      tile_rows_product<D>(sh.q + t * kFusedTile * ld, sh.k + w * kFusedTile * ld, sh.s);
      tile_rows_product<D>(sh.dO + t * kFusedTile * ld, sh.v + w * kFusedTile * ld, sh.dp);
      __syncwarp();
      probability_grads(a, b, h, qt * kFusedTile, j0, lse, delta, sh.s, sh.dp, sh.p, sh.ds, lane);
      __syncwarp();
      ColA pt, dst;  // P^T and dS^T: element (key c, query r) at [r * 16 + c]
      wmma::load_matrix_sync(pt, sh.p, kFusedTile);
      wmma::load_matrix_sync(dst, sh.ds, kFusedTile);
      add_tile_products<D>(pt, sh.dO + t * kFusedTile * ld, 1.0f, grad_v);
      add_tile_products<D>(dst, sh.q + t * kFusedTile * ld, a.scale, grad_k);
      __syncwarp();
    }
  }
  if (!active) return;
  write_rows<D>(a, grad_k, sh.out, b, h, j0, dk, lane);
  write_rows<D>(a, grad_v, sh.out, b, h, j0, dv, lane);
}
#endif  // sm_80 or the host pass

template <int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(FusedAttentionOperands<float> a, float* O, float* lse) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  forward_block<D>(a, O, lse);
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched: fused_attention_tc_ready is false below sm_80
#endif
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    query_grad_kernel(FusedAttentionOperands<float> a, const float* lse, const float* dO, const float* delta, float* dq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  query_grad_block<D>(a, lse, dO, delta, dq);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

template <int D>
__global__ void __launch_bounds__(kThreads) key_grad_kernel(FusedAttentionOperands<float> a, const float* lse,
                                                            const float* dO, const float* delta, float* dk, float* dv) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  key_grad_block<D>(a, lse, dO, delta, dk, dv);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

template <int D>
size_t forward_bytes() {
  return ForwardShared<D>(nullptr).bytes;
}
template <int D>
size_t backward_bytes() {
  return BackwardShared<D>(nullptr).bytes;
}

// The kernels of width D run here: their PTX is sm_80's or later (a kernel compiled for an older
// arch is a trap) and the device grants their shared memory, which is then allowed above 48 KiB.
template <int D>
bool ready_for_width() {
  int device = 0, optin = 0;
  cudaFuncAttributes attributes{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      cudaFuncGetAttributes(&attributes, forward_kernel<D>) != cudaSuccess) {
    (void)cudaGetLastError();  // no image of the kernels for this GPU: the tile kernel runs
    return false;
  }
  if (attributes.ptxVersion < 80 || forward_bytes<D>() > size_t(optin) || backward_bytes<D>() > size_t(optin))
    return false;
  cuda_check(cudaFuncSetAttribute(forward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(forward_bytes<D>())),
             "fused attention forward: shared memory");
  cuda_check(cudaFuncSetAttribute(query_grad_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(backward_bytes<D>())),
             "fused attention dQ: shared memory");
  cuda_check(cudaFuncSetAttribute(key_grad_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(backward_bytes<D>())),
             "fused attention dK, dV: shared memory");
  return true;
}

// (blocks of 64 rows, heads, sequences); no launch when one is 0 (an empty grid is an error).
bool empty(const FusedAttentionOperands<float>& a) { return a.Tq == 0 || a.heads_l == 0 || a.B == 0; }
dim3 grid_of(const FusedAttentionOperands<float>& a) {
  return dim3(unsigned((a.Tq + kBlockRows - 1) / kBlockRows), unsigned(a.heads_l), unsigned(a.B));
}

std::string profile_name(const char* what, int D) {
  return std::string("fused attention ") + what + " (tensor cores, D " + std::to_string(D) + ")";
}

template <int D>
void forward_on_width(const FusedAttentionOperands<float>& a, float* O, float* lse) {
  if (empty(a)) return;
  before_device_work();
  profiled(
      [&] {
        forward_kernel<D><<<grid_of(a), kThreads, forward_bytes<D>(), cuda_stream()>>>(a, O, lse);
        cuda_check(cudaGetLastError(), "fused attention forward launch");
      },
      [] { return profile_name("forward", D); });
}

template <int D>
void backward_on_width(const FusedAttentionOperands<float>& a, const float* lse, const float* dO, const float* delta,
                       float* dq, float* dk, float* dv) {
  if (empty(a)) return;
  before_device_work();
  profiled(
      [&] {
        query_grad_kernel<D><<<grid_of(a), kThreads, backward_bytes<D>(), cuda_stream()>>>(a, lse, dO, delta, dq);
        cuda_check(cudaGetLastError(), "fused attention dQ launch");
      },
      [] { return profile_name("dQ", D); });
  profiled(
      [&] {
        key_grad_kernel<D><<<grid_of(a), kThreads, backward_bytes<D>(), cuda_stream()>>>(a, lse, dO, delta, dk, dv);
        cuda_check(cudaGetLastError(), "fused attention dK, dV launch");
      },
      [] { return profile_name("dK, dV", D); });
}

}  // namespace

bool fused_attention_tc_ready(int D) {
  if (D == 64) {
    static const bool ready = ready_for_width<64>();
    return ready;
  }
  if (D == 128) {
    static const bool ready = ready_for_width<128>();
    return ready;
  }
  return false;
}

void fused_attention_tc_forward(const FusedAttentionOperands<float>& a, float* O, float* lse) {
  if (a.D == 64) return forward_on_width<64>(a, O, lse);
  if (a.D == 128) return forward_on_width<128>(a, O, lse);
  throw std::logic_error("fused attention on tensor cores: head width " + std::to_string(a.D));
}

void fused_attention_tc_backward(const FusedAttentionOperands<float>& a, const float* lse, const float* dO,
                                 const float* delta, float* dq, float* dk, float* dv) {
  if (a.D == 64) return backward_on_width<64>(a, lse, dO, delta, dq, dk, dv);
  if (a.D == 128) return backward_on_width<128>(a, lse, dO, delta, dq, dk, dv);
  throw std::logic_error("fused attention on tensor cores: head width " + std::to_string(a.D));
}

}  // namespace meshmoe
