// NcclComm against MpiComm: every collective on every axis of every mesh shape of this world,
// same inputs, results compared exactly (integer-valued data). Skips (with a WARN) where there is
// no GPU, or fewer GPUs on a node than ranks (NCCL cannot put two ranks of one communicator on
// one GPU).
#ifdef MESHMOE_CUDA
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "../test_util.hpp"
#include "../support/mesh_support.hpp"
#include "mesh/mesh.hpp"
#include "tensor/device.hpp"
#include "tensor/elementwise.hpp"

using namespace meshmoe;

namespace {

// Whether every rank has a GPU of its own; the same verdict on every rank.
bool gpus_for_every_rank(std::string& why) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local_size = 1;
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  int lacking = devices < local_size ? 1 : 0, any = 0;
  MPI_Allreduce(&lacking, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  why = devices == 0 ? "skipped: no GPU" : "skipped: " + std::to_string(local_size) + " ranks on a node with " +
                                               std::to_string(devices) + " GPU(s)";
  return any == 0;
}

template <class T>
struct DeviceBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuf(const std::vector<T>& h) : n(h.size()) {
    void* raw = nullptr;
    REQUIRE(cudaMalloc(&raw, (n ? n : 1) * sizeof(T)) == cudaSuccess);
    p = static_cast<T*>(raw);
    if (n) REQUIRE(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    // The legacy stream's copy may still be on its way to p when cudaMemcpy returns, and the NCCL
    // stream (non-blocking) is not ordered after it.
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  ~DeviceBuf() { cudaFree(p); }
  std::vector<T> get(Comm& c) const {
    c.synchronize();
    std::vector<T> h(n);
    if (n) REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
};

template <class T>
std::vector<T> input(int r, size_t n, int salt) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = T(int64_t((r * 7919 + i * 31 + size_t(salt) * 131) % 61) - 30);
  return v;
}

template <class T>
void compare_all(Comm& m, Comm& g, int me) {
  const size_t p = size_t(m.size());
  const int r = m.rank();
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(1000)}) {
    INFO("n=" << n);
    for (Op op : {Op::Sum, Op::Max, Op::Min}) {
      auto h = input<T>(me, n, 0);
      DeviceBuf<T> d(h);
      m.all_reduce(h.data(), n, op);
      g.all_reduce(d.p, n, op);
      CHECK(d.get(g) == h);
    }
    for (int root = 0; root < int(p); ++root) {
      auto h = input<T>(me, n, 1);
      DeviceBuf<T> d(h);
      m.broadcast(h.data(), n, root);
      g.broadcast(d.p, n, root);
      CHECK(d.get(g) == h);
    }
    {
      auto s = input<T>(me, n, 2);
      std::vector<T> h(p * n);
      DeviceBuf<T> ds(s), dr(h);
      m.all_gather(s.data(), n, h.data());
      g.all_gather(ds.p, n, dr.p);
      CHECK(dr.get(g) == h);
    }
    for (Op op : {Op::Sum, Op::Max}) {
      auto s = input<T>(me, p * n, 3);
      std::vector<T> h(n);
      DeviceBuf<T> ds(s), dr(h);
      test::reduce_scatter(m, s.data(), h.data(), n, op);
      test::reduce_scatter(g, ds.p, dr.p, n, op);
      CHECK(dr.get(g) == h);
    }
    {
      auto s = input<T>(me, p * n, 4);
      std::vector<T> h(p * n);
      DeviceBuf<T> ds(s), dr(h);
      m.all_to_all(s.data(), h.data(), n);
      g.all_to_all(ds.p, dr.p, n);
      CHECK(dr.get(g) == h);
    }
    {  // uneven counts, zeros included; the device buffer has room to spare
      std::vector<size_t> counts(p);
      size_t total = 0;
      for (size_t j = 0; j < p; ++j) total += counts[j] = (size_t(me) * 5 + j * 3 + n) % (n + 1) * (j % 2);
      auto s = input<T>(me, total, 5);
      std::vector<T> h;
      const auto hc = m.all_to_allv(s.data(), std::span<const size_t>(counts), h);
      DeviceBuf<T> ds(s), dr(std::vector<T>(h.size() + 4, T(0)));
      const auto gc = g.all_to_allv(ds.p, std::span<const size_t>(counts), dr.p, dr.n);
      CHECK(gc == hc);
      auto got = dr.get(g);
      got.resize(h.size());
      CHECK(got == h);
    }
    {  // ring permute and a pipeline chain with empty ends
      const int dest = (r + 1) % int(p), source = (r - 1 + int(p)) % int(p);
      auto s = input<T>(me, n, 6);
      std::vector<T> h(n, T(9));
      DeviceBuf<T> ds(s), dr(h);
      m.permute(s.data(), h.data(), n, dest, source);
      g.permute(ds.p, dr.p, n, dest, source);
      CHECK(dr.get(g) == h);
      const int cd = r + 1 < int(p) ? r + 1 : kNoRank, cs = r > 0 ? r - 1 : kNoRank;
      std::vector<T> h2(n, T(9));
      DeviceBuf<T> dr2(h2);
      m.permute(s.data(), h2.data(), n, cd, cs);
      g.permute(ds.p, dr2.p, n, cd, cs);
      CHECK(dr2.get(g) == h2);
    }
    if (p >= 2) {  // send/recv from axis rank 0 to axis rank 1 (others idle)
      int64_t first = me;  // world rank of axis rank 0, whose input rank 1 expects
      m.broadcast(&first, 1, 0);
      if (r == 0) {
        DeviceBuf<T> ds(input<T>(me, n, 7));
        g.send(ds.p, n, 1);
        g.synchronize();
      } else if (r == 1) {
        DeviceBuf<T> dr(std::vector<T>(n, T(9)));
        g.recv(dr.p, n, 0);
        CHECK(dr.get(g) == input<T>(int(first), n, 7));
      }
    }
    g.barrier();
  }
}

}  // namespace

TEST_CASE("NcclComm matches MpiComm on every collective", "[nccl][mpi]") {
  std::string why;
  if (!gpus_for_every_rank(why)) {
    WARN(why);
    SUCCEED(why);
    return;
  }
  const int me = test::world_rank();
  for (const MeshShape& s : test::all_mesh_shapes(test::world_size())) {
    Mesh mesh(MPI_COMM_WORLD, s.pipe, s.data, s.tensor);
    mesh.enable_device();
    for (Axis a : kAxes) {
      INFO(s.str() << ", " << axis_name(a) << " axis");
      compare_all<float>(mesh.axis(a), mesh.device_axis(a), me);
      compare_all<int64_t>(mesh.axis(a), mesh.device_axis(a), me);
    }
  }
}
// The defect QueuedComm closes (mesh/queued_comm.hpp), on a GPU: a receive into a Buffer that grew
// on the device (its tail's zeroes still owed), then any kernel, then a download.
TEST_CASE("NcclComm: a receive into a grown Buffer is not wiped by the Buffer's zeroes", "[nccl]") {
  if (!cuda_compiled() || cuda_device_count() == 0) {
    WARN("skipped: no GPU");
    SUCCEED("no GPU");
    return;
  }
  struct OnGpu {
    OnGpu() {
      cuda_bind(0);
      set_device(Device::Cuda);
    }
    ~OnGpu() { set_device(Device::Cpu); }
  } on_gpu;
  Mesh mesh(MPI_COMM_SELF, 1, 1, 1);
  mesh.enable_device();
  Comm& comm = mesh.device_axis(Axis::Data);
  std::vector<float> sent(1 << 16);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = float(i % 1000) + 1.f;
  Buffer<float> send(sent.begin(), sent.end());
  Buffer<float> recv(1024);
  recv.resize(sent.size());
  comm.permute(send.data(), recv.data(), sent.size(), 0, 0);
  Buffer<float> after(8);
  fill_with(after.data(), after.size(), 1.f);
  CHECK(download(recv) == sent);
}
#endif  // MESHMOE_CUDA
