// The CUDA side of tensor/device.hpp: the GPU's device backend (device memory, its copies and
// waits), GPU binding, cuBLAS GEMM; everything on the rank's non-blocking stream (cuda_stream()),
// returning without waiting (device_synchronize waits).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.hpp"
#include "tensor/cuda_check.hpp"
#include "tensor/cuda_profile.hpp"
#include "tensor/device.hpp"
#include "tensor/launch.hpp"
#include "tensor/staging_ring.hpp"

namespace meshmoe {

namespace {
cublasHandle_t g_cublas = nullptr;
int g_gpu = -1;
cudaStream_t g_stream = nullptr;  // cuda_stream(); never destroyed (the process's lifetime)

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "alloc failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "arch mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
  }
}
cublasHandle_t handle() {
  if (!g_cublas) throw Error("CUDA GEMM before cuda_bind(): no GPU bound to this process");
  return g_cublas;
}

// One cuBLAS call, timed per shape under MESHMOE_DEVICE_PROFILE (tensor/cuda_profile.hpp).
template <class Call>
void gemm_call(Call call, const char* what, bool trans_a, bool trans_b, int M, int N, int K, int count = 1) {
  profiled([&] { check_cublas(call(), what); },
           [&] { return gemm_profile_name(what, trans_a, trans_b, M, N, K, count); },
           2.0 * double(M) * double(N) * double(K) * count);
}
}  // namespace

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuBLAS ") + what + ": " + cublas_status_name(s));
}

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

cudaStream_t cuda_stream() {
  if (!g_stream)
    cuda_check(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (the rank's stream)");
  return g_stream;
}

bool cuda_compiled() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

void cuda_bind(int node_local_rank) {
  const int n = cuda_device_count();
  if (n == 0)
    throw Error("no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES, "
                "--gpus-per-task, the driver)");
  g_gpu = node_local_rank % n;
  cuda_check(cudaSetDevice(g_gpu), "cudaSetDevice");
  if (!g_cublas) {
    check_cublas(cublasCreate(&g_cublas), "cublasCreate");
    check_cublas(cublasSetStream(g_cublas, cuda_stream()), "cublasSetStream");
    // Plain fp32 (no TF32 tensor-op rounding): the CUDA run must match the host run to float
    // tolerance (docs/ARCHITECTURE.md "Invariants", exactness against oracles).
    check_cublas(cublasSetMathMode(g_cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
}

std::string cuda_device_name() {
  if (g_gpu < 0) return "none";
  cudaDeviceProp p{};
  cuda_check(cudaGetDeviceProperties(&p, g_gpu), "cudaGetDeviceProperties");
  return std::string(p.name) + " (GPU " + std::to_string(g_gpu) + ")";
}

namespace {
// The GPU's device backend (tensor/device_backend.hpp): device.cpp calls before_device_work before
// the queued entries and device_synchronize before copy_to_host.
// Uploads through pinned staging (tensor/staging_ring.hpp): copy_from_host copies the host's bytes
// into pinned memory before it returns and queues the device's copy from there, so an upload waits
// for nothing queued (from pageable memory cudaMemcpy waits for the whole stream). An upload larger
// than the ring is a cudaMemcpy. Made on the first upload; never freed (the process's lifetime).
constexpr size_t kStagingBytes = size_t(32) << 20;
struct PinnedStaging {
  char* memory = nullptr;
  std::vector<cudaEvent_t> free_events;
  std::unordered_map<uint64_t, cudaEvent_t> events;  // by ticket, recorded after each queued copy
  uint64_t next_ticket = 0;
  StagingRing ring{kStagingBytes, [this](uint64_t ticket) {
                     const cudaEvent_t e = events.at(ticket);
                     events.erase(ticket);
                     free_events.push_back(e);
                     cuda_check(cudaEventSynchronize(e), "cudaEventSynchronize (pinned staging reused)");
                   }};
};
PinnedStaging* g_staging = nullptr;

PinnedStaging& staging() {
  if (!g_staging) {
    auto* s = new PinnedStaging;
    cuda_check(cudaHostAlloc(reinterpret_cast<void**>(&s->memory), kStagingBytes, cudaHostAllocDefault),
               "cudaHostAlloc (pinned staging for uploads)");
    g_staging = s;
  }
  return *g_staging;
}

void cuda_wait() {
  if (g_gpu < 0) return;
  cuda_check(cudaStreamSynchronize(cuda_stream()), "device work (kernels, GEMMs, copies, collectives)");
  if (g_staging) g_staging->ring.all_done();
  if (cuda_profiling()) cuda_profile_collect();
}
void cuda_zero_async(void* p, size_t bytes) {
  const auto zero = [&] {
    cuda_check(cudaMemsetAsync(p, 0, bytes, cuda_stream()), "cudaMemsetAsync (a Buffer's value-initialisation)");
  };
  profiled(zero, [] { return "cudaMemsetAsync (Buffers' zeroing)"; });
}

void cuda_copy_async(void* dst, const void* src, size_t bytes) {
  const auto copy = [&] {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_stream()), "cudaMemcpyAsync (a Buffer's copy)");
  };
  profiled(copy, [] { return "cudaMemcpyAsync (Buffers' copies)"; });
}

// The transfer points' copies (tensor/device.hpp), on the rank's stream, so in order with the
// queued work (a synchronous cudaMemcpy would run on the legacy stream, unordered with it): the
// host waits for a copy to the host; a copy from the host has taken the host's bytes when it
// returns (into pinned staging, or, larger than the ring, the stream's wait after the copy: rare,
// a checkpoint's large tensors).
void cuda_copy_to_host(void* host, const void* device, size_t bytes) {
  profiled(
      [&] {
        cuda_check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, cuda_stream()),
                   "cudaMemcpyAsync (to the host)");
      },
      [] { return "cudaMemcpyAsync (to the host)"; });
  cuda_check(cudaStreamSynchronize(cuda_stream()), "cudaStreamSynchronize (a copy to the host)");
}
void cuda_copy_from_host(void* device, const void* host, size_t bytes) {
  if (bytes > kStagingBytes) {
    profiled(
        [&] {
          cuda_check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, cuda_stream()),
                     "cudaMemcpyAsync (from the host, pageable)");
        },
        [] { return "cudaMemcpyAsync (from the host, pageable)"; });
    cuda_check(cudaStreamSynchronize(cuda_stream()), "cudaStreamSynchronize (a large copy from the host)");
    return;
  }
  PinnedStaging& s = staging();
  char* room = s.memory + *s.ring.take(bytes);
  std::memcpy(room, host, bytes);
  profiled(
      [&] {
        cuda_check(cudaMemcpyAsync(device, room, bytes, cudaMemcpyHostToDevice, cuda_stream()),
                   "cudaMemcpyAsync (from the host, pinned staging)");
      },
      [] { return "cudaMemcpyAsync (from the host, pinned staging)"; });
  cudaEvent_t done;
  if (s.free_events.empty()) {
    cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate (pinned staging)");
  } else {
    done = s.free_events.back();
    s.free_events.pop_back();
  }
  cuda_check(cudaEventRecord(done, cuda_stream()), "cudaEventRecord (pinned staging)");
  const uint64_t ticket = s.next_ticket++;
  s.events.emplace(ticket, done);
  s.ring.issued(ticket);
}

// The arena's chunks: GPU memory, which the host reaches only through the transfer copies.
// cudaMalloc waits for nothing queued; cudaFree waits for the whole device (rare: chunks are kept).
void* cuda_device_alloc(size_t bytes) {
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
  return p;
}
void cuda_device_free(void* p) noexcept { cudaFree(p); }
Arena* cuda_arena() {
  static Arena* arena = make_device_arena({cuda_device_alloc, cuda_device_free}, size_t(256) << 20);
  return arena;
}

// Device graphs (tensor/device_graph.hpp): stream capture of the rank's stream in thread-local
// mode (another thread's unsafe CUDA calls stay legal), instantiated once per capture and launched
// on the same stream. cuBLAS under capture may not allocate its workspace: it gets one of its own
// before the first capture, of the size cuBLAS takes by default on Hopper (its documentation's
// 32 MiB), kept for the process's lifetime. The profile's per-launch events are not for graphs.
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
void* g_cublas_workspace = nullptr;
void cuda_begin_capture() {
  if (cuda_profiling())
    throw Error("MESHMOE_DEVICE_PROFILE times every launch with its own events: not with device graphs (run.cuda_graphs)");
  if (g_cublas && !g_cublas_workspace) {
    cuda_check(cudaMalloc(&g_cublas_workspace, kCublasWorkspaceBytes), "cudaMalloc (cuBLAS workspace for graphs)");
    check_cublas(cublasSetWorkspace(g_cublas, g_cublas_workspace, kCublasWorkspaceBytes), "cublasSetWorkspace");
  }
  cuda_check(cudaStreamBeginCapture(cuda_stream(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
}
void* cuda_end_capture() {
  cudaGraph_t graph = nullptr;
  cuda_check(cudaStreamEndCapture(cuda_stream(), &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  cuda_check(e, "cudaGraphInstantiate");
  return exec;
}
void cuda_cancel_capture() {
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(cuda_stream(), &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // an invalidated capture's error is the abandoned capture's
}
void cuda_launch_graph(void* graph) {
  cuda_check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), cuda_stream()), "cudaGraphLaunch");
}
void cuda_destroy_graph(void* graph) { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph)); }

const DeviceBackend kCudaBackend = {
    .name = "cuda",
    .device = Device::Cuda,
    .buffers_on_device = true,
    .queue_host_work = nullptr,
    .arena = cuda_arena,
    .work_queued = nullptr,
    .zero = cuda_zero_async,
    .copy = cuda_copy_async,
    .copy_from_host = cuda_copy_from_host,
    .copy_to_host = cuda_copy_to_host,
    .wait = cuda_wait,
    .begin_capture = cuda_begin_capture,
    .end_capture = cuda_end_capture,
    .cancel_capture = cuda_cancel_capture,
    .launch_graph = cuda_launch_graph,
    .destroy_graph = cuda_destroy_graph,
};
}  // namespace

const DeviceBackend* cuda_backend() { return &kCudaBackend; }

// Row-major C[M,N] = alpha op(A) op(B) + beta C is column-major C^T = alpha op(B)^T op(A)^T + beta C^T:
// hand cuBLAS B first and A second, with the row-major leading dimensions.
void cuda_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
               int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  before_device_work();
  gemm_call([&] { return cublasSgemm(handle(), cublas_op(trans_b), cublas_op(trans_a), N, M, K, &alpha, B, ldb, A, lda, &beta,
                               C, ldc); },
            "sgemm", trans_a, trans_b, M, N, K);
}
void cuda_gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
               const double* B, int ldb, double beta, double* C, int ldc) {
  if (M == 0 || N == 0) return;
  before_device_work();
  gemm_call([&] { return cublasDgemm(handle(), cublas_op(trans_b), cublas_op(trans_a), N, M, K, &alpha, B, ldb, A, lda, &beta,
                               C, ldc); },
            "dgemm", trans_a, trans_b, M, N, K);
}

// As cuda_gemm, over `count` matrices per operand (B before A, as above).
void cuda_gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                               int64_t stride_a, const float* B, int ldb, int64_t stride_b, float beta, float* C,
                               int ldc, int64_t stride_c, int count) {
  if (M == 0 || N == 0 || count == 0) return;
  before_device_work();
  gemm_call(
      [&] {
        return cublasSgemmStridedBatched(handle(), cublas_op(trans_b), cublas_op(trans_a), N, M, K, &alpha, B, ldb,
                                         stride_b, A, lda, stride_a, &beta, C, ldc, stride_c, count);
      },
      "sgemm batched", trans_a, trans_b, M, N, K, count);
}
void cuda_gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A,
                               int lda, int64_t stride_a, const double* B, int ldb, int64_t stride_b, double beta,
                               double* C, int ldc, int64_t stride_c, int count) {
  if (M == 0 || N == 0 || count == 0) return;
  before_device_work();
  gemm_call(
      [&] {
        return cublasDgemmStridedBatched(handle(), cublas_op(trans_b), cublas_op(trans_a), N, M, K, &alpha, B, ldb,
                                         stride_b, A, lda, stride_a, &beta, C, ldc, stride_c, count);
      },
      "dgemm batched", trans_a, trans_b, M, N, K, count);
}

}  // namespace meshmoe
