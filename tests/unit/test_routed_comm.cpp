// RoutedComm (mesh/routed_comm.hpp), the data and tensor axes of a GPU run: a call whose buffers
// are all device memory goes to the device backend (NCCL there), any with a host buffer to the
// host backend (MPI), and every rank picks the same one, also a rank with nothing to move (null)
// and a permute's ends. Here the device memory is the deferred host device's (device memory's
// rule, DeviceAccess::Copies) and the device backend a second MpiComm of the same group behind a
// probe that counts its calls: NCCL itself needs a GPU (the [nccl] cases).
#include <catch2/catch.hpp>
#include <mpi.h>

#include <vector>

#include "../test_util.hpp"
#include "mesh/mpi_comm.hpp"
#include "mesh/routed_comm.hpp"
#include "tensor/device.hpp"

using namespace meshmoe;

namespace {

// Forwards every call to `inner`, counting them.
class CountingComm final : public Comm {
 public:
  explicit CountingComm(Comm& inner) : inner_(inner) {}
  int calls = 0;
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void barrier() override { inner_.barrier(); }
  bool device_memory() const override { return true; }
  std::string name() const override { return "counting " + inner_.name(); }
  void all_reduce_raw(void* buf, size_t n, DType t, Op op) override { ++calls, inner_.all_reduce_raw(buf, n, t, op); }
  void broadcast_raw(void* buf, size_t n, DType t, int root) override { ++calls, inner_.broadcast_raw(buf, n, t, root); }
  void all_gather_raw(const void* send, size_t n, void* recv, DType t) override {
    ++calls, inner_.all_gather_raw(send, n, recv, t);
  }
  void reduce_scatter_raw(const void* send, void* recv, size_t n, DType t, Op op) override {
    ++calls, inner_.reduce_scatter_raw(send, recv, n, t, op);
  }
  void all_to_all_raw(const void* send, void* recv, size_t n, DType t) override {
    ++calls, inner_.all_to_all_raw(send, recv, n, t);
  }
  void all_to_allv_raw(const void* send, const size_t* sc, void* recv, const size_t* rc, DType t) override {
    ++calls, inner_.all_to_allv_raw(send, sc, recv, rc, t);
  }
  void permute_raw(const void* send, size_t ns, int dest, void* recv, size_t nr, int source, DType t) override {
    ++calls, inner_.permute_raw(send, ns, dest, recv, nr, source, t);
  }
  void send_raw(const void* buf, size_t n, DType t, int dest, int tag) override { ++calls, inner_.send_raw(buf, n, t, dest, tag); }
  void recv_raw(void* buf, size_t n, DType t, int source, int tag) override { ++calls, inner_.recv_raw(buf, n, t, source, tag); }
  std::vector<size_t> exchange_counts(std::span<const size_t> send_counts) override {
    ++calls;
    return inner_.exchange_counts(send_counts);
  }

 private:
  Comm& inner_;
};

MPI_Comm dup_world() {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return c;
}

}  // namespace

TEST_CASE("routed comm: device buffers to the device backend, host buffers to the host's", "[mpi][comm][deferred]") {
  MpiComm host(dup_world(), "host"), device_group(dup_world(), "device");
  CountingComm device(device_group);
  RoutedComm routed(host, device);
  const int me = routed.rank(), n = routed.size();
  test::DeferredHostDevice guard(DeviceAccess::Copies);

  // An all-reduce of a device Buffer: the device backend (which here stages it for MPI).
  const std::vector<float> mine{float(me), 1.f, 2.f * float(me)};
  Buffer<float> on_device(mine.begin(), mine.end());
  routed.all_reduce(on_device.data(), on_device.size());
  CHECK(device.calls == 1);
  const float ranks_sum = float(n * (n - 1) / 2);
  CHECK(download(on_device) == std::vector<float>{ranks_sum, float(n), 2.f * ranks_sum});

  // Host memory, alone or with a device buffer: the host backend.
  std::vector<double> on_host{double(me)};
  routed.all_reduce(on_host.data(), 1, Op::Max);
  CHECK(on_host[0] == double(n - 1));
  std::vector<int32_t> gathered(static_cast<size_t>(n));
  Buffer<int32_t> one{int32_t(10 + me)};
  routed.all_gather(one.data(), 1, gathered.data());
  for (int r = 0; r < n; ++r) CHECK(gathered[size_t(r)] == 10 + r);
  CHECK(device.calls == 1);

  // A variable all-to-all of device Buffers in which this rank may have nothing to send or receive
  // (null: an empty Buffer): every rank takes the device backend, for the data and for nothing.
  std::vector<size_t> send_counts(size_t(n), 0), recv_counts(size_t(n), 0);
  if (me == 0) std::fill(send_counts.begin(), send_counts.end(), 1);  // rank 0 sends one to each
  recv_counts[0] = 1;
  std::vector<float> send_values(me == 0 ? size_t(n) : 0);
  for (int r = 0; r < int(send_values.size()); ++r) send_values[size_t(r)] = float(100 + r);
  Buffer<float> send(send_values.begin(), send_values.end()), recv(1);
  routed.all_to_allv(send.data(), std::span<const size_t>(send_counts), recv.data(), std::span<const size_t>(recv_counts));
  CHECK(device.calls == 2);
  CHECK(download_one(recv, 0) == float(100 + me));

  // A shift along the ranks: the ends pass no buffer on one side, and still go with the others.
  Buffer<float> out{float(me)}, in(1);
  routed.permute(out.data(), in.data(), 1, me + 1 < n ? me + 1 : kNoRank, me > 0 ? me - 1 : kNoRank);
  CHECK(device.calls == 3);
  if (me > 0) CHECK(download_one(in, 0) == float(me - 1));

  // Counts are host work.
  const std::vector<size_t> got = routed.exchange_counts(send_counts);
  for (int r = 0; r < n; ++r) CHECK(got[size_t(r)] == (r == 0 ? 1u : 0u));  // rank 0 sends one to each
  CHECK(device.calls == 3);
}
