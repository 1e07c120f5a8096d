// MpiComm: Comm over an MPI communicator, for host buffers.
#pragma once
#include <mpi.h>

#include "mesh/comm.hpp"

namespace meshmoe {

MPI_Datatype mpi_type(DType t);
MPI_Op mpi_op(Op op);

class MpiComm final : public Comm {
 public:
  // Takes ownership of `comm` (freed in the destructor) and sets MPI_ERRORS_RETURN on it, so MPI
  // failures become meshmoe::Error. `label` names the group in messages ("data axis").
  MpiComm(MPI_Comm comm, std::string label);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  MpiComm(MpiComm&& o) noexcept;
  MpiComm& operator=(MpiComm&& o) noexcept;

  MPI_Comm mpi() const { return comm_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override;
  std::string name() const override;

  void all_reduce_raw(void* buf, size_t n, DType t, Op op) override;
  void broadcast_raw(void* buf, size_t n, DType t, int root) override;
  void all_gather_raw(const void* send, size_t n, void* recv, DType t) override;
  void reduce_scatter_raw(const void* send, void* recv, size_t n, DType t, Op op) override;
  void reduce_scatterv_in_place_raw(void* buf, const size_t* counts, DType t, Op op) override;
  void all_gatherv_in_place_raw(void* buf, const size_t* counts, DType t) override;
  void all_to_all_raw(const void* send, void* recv, size_t n, DType t) override;
  void all_to_allv_raw(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                       DType t) override;
  void permute_raw(const void* send, size_t n_send, int dest, void* recv, size_t n_recv, int source,
                   DType t) override;
  void send_raw(const void* buf, size_t n, DType t, int dest, int tag) override;
  void recv_raw(void* buf, size_t n, DType t, int source, int tag) override;
  void isend_raw(const void* buf, size_t n, DType t, int dest, int tag) override;
  void wait_sends() override;
  void iall_reduce_raw(void* buf, size_t n, DType t, Op op) override;
  bool test_all_reduces() override;
  void wait_all_reduces() override;
  std::vector<size_t> exchange_counts(std::span<const size_t> send_counts) override;

 private:
  void check(int rc, const char* call) const;
  int count(size_t n, const char* what) const;  // size_t -> MPI int count, Error above INT_MAX
  // counts [size] -> MPI int counts and their prefix sums (displacements), checked like count().
  void counts_and_displs(const size_t* counts, const char* what, std::vector<int>& c, std::vector<int>& d) const;
  void release() noexcept;

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<MPI_Request> pending_sends_;
  std::vector<MPI_Request> pending_reduces_;
  std::string label_;
  int rank_ = 0, size_ = 0;
};

}  // namespace meshmoe
