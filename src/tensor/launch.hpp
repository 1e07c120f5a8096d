// for_each_index(n, body): body(i) for every i in [0, n), as a host loop or, with run.device =
// "cuda", as a CUDA kernel with one thread per index. for_each_index_2d(rows, cols, body):
// body(r, c) over a rows x cols grid (row-major), for element-wise work on matrices: the host runs
// two nested loops (no division per element), the GPU one thread per element. A body is a small struct of raw pointers
// and sizes with a `MESHMOE_HD void operator()(int64_t i) const` (named for what it computes, next
// to the layer that uses it); it must write only what index i owns, so the order of the indices
// never matters. The host loop can run backwards (set_host_loop_reversed) so that a test can
// prove that: any body that reads what another index writes changes the result.
//
// On the host, a loop of at least kParallelWork elements (indices x work_per_index, the elements
// one index touches: a row body passes its row length) is split over host_loop_threads() threads
// in contiguous blocks (tensor/host_threads.hpp). Each index still runs the same arithmetic alone,
// so the result is bitwise the same for any thread count; smaller loops stay serial, where waking
// a thread costs more than it saves. for_each_task(n, fn) is for coarse tasks that call gemm
// (tensor/blas.hpp) themselves: on the host the tasks are spread over the threads with OpenBLAS
// single-threaded inside, on the GPU they run in order on the stream.
//
// A body used on the GPU is instantiated in the layer's .cu file with MESHMOE_CUDA_BODY (see
// tensor/launch_cuda.cuh); a missing one is a link error in a CUDA build.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "core/hd.hpp"
#include "tensor/device.hpp"
#include "tensor/host_threads.hpp"

namespace meshmoe {

constexpr int64_t kParallelWork = int64_t(1) << 15;

// The threads a host loop of `work` elements gets: 1 when small, reversed, or already inside a
// threaded part (no nesting).
inline int host_threads_for(int64_t work) {
  if (work < kParallelWork || host_loop_reversed() || in_host_parts()) return 1;
  return host_loop_threads();
}

// fn(i) for i in [begin, end); a body may offer the block as `range(begin, end)` (the same
// results: e.g. FillWith, whose block of zeros is a memset).
template <class Fn>
void host_block(int64_t begin, int64_t end, const Fn& fn) {
  if constexpr (requires { fn.range(begin, end); })
    fn.range(begin, end);
  else
    for (int64_t i = begin; i < end; ++i) fn(i);
}

// Runs fn(i) for i in [0, n) on up to `threads` host threads, each a contiguous block of indices.
template <class Fn>
void host_parallel_for(int64_t n, int threads, const Fn& fn) {
  const int parts = int(n < threads ? n : threads);
  if (parts <= 1) return host_block(0, n, fn);
  run_host_parts(parts, [&](int p) { host_block(n * p / parts, n * (p + 1) / parts, fn); });
}

#ifdef MESHMOE_CUDA
template <class Body>
void launch_on_cuda(int64_t rows, int64_t cols, const Body& body);  // tensor/launch_cuda.cuh
#endif

// The host side of the launches: fn(i) for every i in [0, n) on the host threads (`work`: the
// loop's total work, which sets how many), or backwards on one thread when the tests ask
// (host_loop_reversed); queued instead where the backend queues host work (run_host_work).
template <class Fn>
void run_host_indices(int64_t n, int64_t work, const Fn& fn) {
  run_host_work([n, work, fn] {
    if (host_loop_reversed())
      for (int64_t i = n; i-- > 0;) fn(i);
    else
      host_parallel_for(n, host_threads_for(work), fn);
  });
}

template <class Body>
void for_each_index(int64_t n, const Body& body, int64_t work_per_index = 1) {
  if (current_device() == Device::Cuda) {
#ifdef MESHMOE_CUDA
    launch_on_cuda(n, 1, body);
    return;
#else
    throw std::logic_error("for_each_index on Device::Cuda in a build without CUDA");
#endif
  }
  run_host_indices(n, n * work_per_index, body);
}

template <class Body>
void for_each_index_2d(int64_t rows, int64_t cols, const Body& body) {
  if (current_device() == Device::Cuda) {
#ifdef MESHMOE_CUDA
    launch_on_cuda(rows, cols, body);
    return;
#else
    throw std::logic_error("for_each_index_2d on Device::Cuda in a build without CUDA");
#endif
  }
  run_host_indices(rows, rows * cols, [cols, body](int64_t r) {
    if (host_loop_reversed()) {
      for (int64_t c = cols; c-- > 0;) body(r, c);
    } else {
      for (int64_t c = 0; c < cols; ++c) body(r, c);
    }
  });
}

// fn(i) for i in [0, n), each task free to call gemm (see above).
template <class Fn>
void for_each_task(int64_t n, const Fn& fn) {
  const bool serial = current_device() == Device::Cuda || device_backend().queue_host_work || host_loop_reversed() ||
                      in_host_parts();
  const int threads = serial ? 1 : host_loop_threads();
  if (threads <= 1 || n < 2) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  set_blas_threads_for_tasks(true);
  host_parallel_for(n, threads, fn);
  set_blas_threads_for_tasks(false);
}

}  // namespace meshmoe
