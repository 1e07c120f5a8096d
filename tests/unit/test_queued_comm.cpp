// QueuedComm (mesh/queued_comm.hpp), the base of NcclComm, on the deferred host device: a one-rank
// Comm whose operations are queued host copies, as NCCL's are queued on the stream. A Buffer made
// or grown on the device owes its zeroes until the next device work; a collective is device work,
// so the zeroes must be queued before it, or they land after it and wipe what it wrote (and a
// reduce would read the Buffer's old bytes). The same defect shows on a GPU in test_nccl.cpp.
#include <catch2/catch.hpp>

#include <numeric>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "../test_util.hpp"
#include "mesh/queued_comm.hpp"
#include "tensor/deferred_device.hpp"
#include "tensor/device.hpp"
#include "tensor/device_backend.hpp"
#include "tensor/elementwise.hpp"
#ifdef MESHMOE_CUDA
#include "mesh/nccl_comm.hpp"
static_assert(std::is_base_of_v<meshmoe::QueuedComm, meshmoe::NcclComm>,
              "NcclComm queues its operations through QueuedComm's entry points");
#endif

using namespace meshmoe;

namespace {

// One rank: every operation is a copy (or nothing), queued on the device as NCCL queues its
// transfers. It records whether a zeroing was still owed when an operation was queued.
class LoopbackComm final : public QueuedComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void barrier() override { device_synchronize(); }
  void synchronize() override { device_synchronize(); }
  std::string name() const override { return "loopback (1 rank)"; }
  std::vector<size_t> exchange_counts(std::span<const size_t> c) override { return {c.begin(), c.end()}; }

  int zeroes_owed_at_queue = 0;

 protected:
  void queue_all_reduce(void*, size_t, DType, Op) override { note(); }  // the sum over one rank
  void queue_broadcast(void*, size_t, DType, int) override { note(); }
  void queue_all_gather(const void* send, size_t n, void* recv, DType t) override { copy(recv, send, n, t); }
  void queue_reduce_scatter(const void* send, void* recv, size_t n, DType t, Op) override { copy(recv, send, n, t); }
  void queue_reduce_scatterv_in_place(void*, const size_t*, DType, Op) override { note(); }
  void queue_all_gatherv_in_place(void*, const size_t*, DType) override { note(); }
  void queue_all_to_all(const void* send, void* recv, size_t n, DType t) override { copy(recv, send, n, t); }
  void queue_all_to_allv(const void* send, const size_t* send_counts, void* recv, const size_t*, DType t) override {
    copy(recv, send, send_counts[0], t);
  }
  void queue_permute(const void* send, size_t n_send, int, void* recv, size_t, int, DType t) override {
    copy(recv, send, n_send, t);
  }
  void queue_send(const void*, size_t, DType, int, int) override {
    throw std::logic_error("LoopbackComm: no send to oneself (use permute)");
  }
  void queue_recv(void*, size_t, DType, int, int) override {
    throw std::logic_error("LoopbackComm: no receive from oneself (use permute)");
  }

 private:
  void note() { zeroes_owed_at_queue += g_pending_zero.begin != g_pending_zero.end; }
  void copy(void* recv, const void* send, size_t n, DType t) {
    note();
    // The backend's own queued copy, as NCCL's transfer on the stream: nothing flushed before it.
    device_backend().copy(recv, send, n * dtype_size(t));
  }
};

std::vector<float> counting(size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 1.f);
  return v;
}

}  // namespace

TEST_CASE("queued comm: a receive into a grown Buffer is not wiped by the Buffer's zeroes", "[device][deferred][comm]") {
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  LoopbackComm comm;
  const std::vector<float> sent = counting(96);
  Buffer<float> send(sent.size());
  copy_from_host(send.data(), sent.data(), sent.size() * sizeof(float));
  Buffer<float> recv(32);
  recv.resize(sent.size());  // as the all-to-all's receive buffer when the count grows: zeroes owed
  comm.all_to_all(send.data(), recv.data(), sent.size());
  CHECK(comm.zeroes_owed_at_queue == 0);
  Buffer<float> after(8);
  fill_with(after.data(), after.size(), 1.f);  // any device work after the receive
  CHECK(download(recv) == sent);
}

TEST_CASE("queued comm: a reduction over a fresh Buffer reads its zeroes, and its result stays", "[device][deferred][comm]") {
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  LoopbackComm comm;
  Buffer<float> grads(64);  // zeroes owed
  comm.all_reduce(grads.data(), grads.size());
  CHECK(comm.zeroes_owed_at_queue == 0);
  const std::vector<float> sent = counting(64);
  Buffer<float> send(sent.size()), recv(sent.size());
  copy_from_host(send.data(), sent.data(), sent.size() * sizeof(float));
  comm.permute(send.data(), recv.data(), sent.size(), 0, 0);
  CHECK(comm.zeroes_owed_at_queue == 0);
  CHECK(download(recv) == sent);
  CHECK(download(grads) == std::vector<float>(64, 0.f));
}
