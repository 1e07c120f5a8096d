#include "mesh/routed_comm.hpp"

#include "tensor/device.hpp"

namespace meshmoe {

RoutedComm::RoutedComm(Comm& host, Comm& device) : host_(host), device_(device) {
  if (host.size() != device.size() || host.rank() != device.rank())
    throw std::logic_error("RoutedComm: " + host.name() + " and " + device.name() + " are not one group");
}

// A buffer in host memory takes the call to the host backend. A missing buffer (null: a permute's
// end, an empty Buffer) does not count, so that a rank with nothing to move picks the backend its
// group's others pick for their device buffers.
Comm& RoutedComm::to(const void* a, const void* b) {
  const bool host = (a && !meshmoe::device_memory(a)) || (b && !meshmoe::device_memory(b));
  return host ? host_ : device_;
}

void RoutedComm::barrier() {
  device_.synchronize();
  host_.barrier();
}

void RoutedComm::all_reduce_raw(void* buf, size_t n, DType t, Op op) { to(buf).all_reduce_raw(buf, n, t, op); }
void RoutedComm::iall_reduce_raw(void* buf, size_t n, DType t, Op op) { to(buf).iall_reduce_raw(buf, n, t, op); }
void RoutedComm::broadcast_raw(void* buf, size_t n, DType t, int root) { to(buf).broadcast_raw(buf, n, t, root); }
void RoutedComm::all_gather_raw(const void* send, size_t n, void* recv, DType t) {
  to(send, recv).all_gather_raw(send, n, recv, t);
}
void RoutedComm::reduce_scatter_raw(const void* send, void* recv, size_t n, DType t, Op op) {
  to(send, recv).reduce_scatter_raw(send, recv, n, t, op);
}
void RoutedComm::reduce_scatterv_in_place_raw(void* buf, const size_t* counts, DType t, Op op) {
  to(buf).reduce_scatterv_in_place_raw(buf, counts, t, op);
}
void RoutedComm::all_gatherv_in_place_raw(void* buf, const size_t* counts, DType t) {
  to(buf).all_gatherv_in_place_raw(buf, counts, t);
}
void RoutedComm::all_to_all_raw(const void* send, void* recv, size_t n, DType t) {
  to(send, recv).all_to_all_raw(send, recv, n, t);
}
void RoutedComm::all_to_allv_raw(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                                 DType t) {
  to(send, recv).all_to_allv_raw(send, send_counts, recv, recv_counts, t);
}
// Every rank of the group calls a permute; its ends (kNoRank) pass no buffer on that side.
void RoutedComm::permute_raw(const void* send, size_t n_send, int dest, void* recv, size_t n_recv, int source,
                             DType t) {
  to(dest == kNoRank ? nullptr : send, source == kNoRank ? nullptr : recv)
      .permute_raw(send, n_send, dest, recv, n_recv, source, t);
}
void RoutedComm::send_raw(const void* buf, size_t n, DType t, int dest, int tag) {
  to(buf).send_raw(buf, n, t, dest, tag);
}
void RoutedComm::recv_raw(void* buf, size_t n, DType t, int source, int tag) {
  to(buf).recv_raw(buf, n, t, source, tag);
}
void RoutedComm::isend_raw(const void* buf, size_t n, DType t, int dest, int tag) {
  to(buf).isend_raw(buf, n, t, dest, tag);
}

}  // namespace meshmoe
