// QueuedComm: a Comm whose operations are queued in order with the device's work and return at
// once (NcclComm: on the rank's stream). Each operation first calls before_device_work(), as every
// launch and GEMM does (tensor/device.hpp): that queues the zeroing still owed to freshly made or
// grown Buffers ahead of the operation, so a collective neither reads a Buffer before its zeroes
// nor has its result wiped by them afterwards (a receive into the all-to-all's grown buffer), and
// marks work as queued, so that device_synchronize() waits for the operation. The backends write
// the queue_* operations; the entry points are final, so no backend can skip that call.
#pragma once
#include "mesh/comm.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

class QueuedComm : public Comm {
 public:
  bool device_memory() const override { return true; }

  void all_reduce_raw(void* buf, size_t n, DType t, Op op) final {
    before_device_work();
    queue_all_reduce(buf, n, t, op);
  }
  void broadcast_raw(void* buf, size_t n, DType t, int root) final {
    before_device_work();
    queue_broadcast(buf, n, t, root);
  }
  void all_gather_raw(const void* send, size_t n, void* recv, DType t) final {
    before_device_work();
    queue_all_gather(send, n, recv, t);
  }
  void reduce_scatter_raw(const void* send, void* recv, size_t n, DType t, Op op) final {
    before_device_work();
    queue_reduce_scatter(send, recv, n, t, op);
  }
  void reduce_scatterv_in_place_raw(void* buf, const size_t* counts, DType t, Op op) final {
    before_device_work();
    queue_reduce_scatterv_in_place(buf, counts, t, op);
  }
  void all_gatherv_in_place_raw(void* buf, const size_t* counts, DType t) final {
    before_device_work();
    queue_all_gatherv_in_place(buf, counts, t);
  }
  void all_to_all_raw(const void* send, void* recv, size_t n, DType t) final {
    before_device_work();
    queue_all_to_all(send, recv, n, t);
  }
  void all_to_allv_raw(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                       DType t) final {
    before_device_work();
    queue_all_to_allv(send, send_counts, recv, recv_counts, t);
  }
  void permute_raw(const void* send, size_t n_send, int dest, void* recv, size_t n_recv, int source,
                   DType t) final {
    before_device_work();
    queue_permute(send, n_send, dest, recv, n_recv, source, t);
  }
  void send_raw(const void* buf, size_t n, DType t, int dest, int tag) final {
    before_device_work();
    queue_send(buf, n, t, dest, tag);
  }
  void recv_raw(void* buf, size_t n, DType t, int source, int tag) final {
    before_device_work();
    queue_recv(buf, n, t, source, tag);
  }

 protected:
  // The operations of Comm (mesh/comm.hpp), queued on the device; the work before them is queued.
  virtual void queue_all_reduce(void* buf, size_t n, DType t, Op op) = 0;
  virtual void queue_broadcast(void* buf, size_t n, DType t, int root) = 0;
  virtual void queue_all_gather(const void* send, size_t n, void* recv, DType t) = 0;
  virtual void queue_reduce_scatter(const void* send, void* recv, size_t n, DType t, Op op) = 0;
  virtual void queue_reduce_scatterv_in_place(void* buf, const size_t* counts, DType t, Op op) = 0;
  virtual void queue_all_gatherv_in_place(void* buf, const size_t* counts, DType t) = 0;
  virtual void queue_all_to_all(const void* send, void* recv, size_t n, DType t) = 0;
  virtual void queue_all_to_allv(const void* send, const size_t* send_counts, void* recv,
                                 const size_t* recv_counts, DType t) = 0;
  virtual void queue_permute(const void* send, size_t n_send, int dest, void* recv, size_t n_recv, int source,
                             DType t) = 0;
  virtual void queue_send(const void* buf, size_t n, DType t, int dest, int tag) = 0;
  virtual void queue_recv(void* buf, size_t n, DType t, int source, int tag) = 0;
};

}  // namespace meshmoe
