// The device mesh: pipe x data x tensor, outermost to innermost (DESIGN "The mesh").
// World rank = (p * data + d) * tensor + t, so tensor groups are neighbouring ranks (same node).
// Each axis group has its own communicator; Mesh::axis(a) is the Comm every layer uses to talk
// along that axis.
#pragma once
#include <mpi.h>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mesh/comm.hpp"
#include "mesh/mpi_comm.hpp"

namespace meshmoe {

enum class Axis { Pipe = 0, Data = 1, Tensor = 2 };
inline constexpr std::array<Axis, 3> kAxes{Axis::Pipe, Axis::Data, Axis::Tensor};
const char* axis_name(Axis a);  // "pipe", "data", "tensor"

// The shape and the rank <-> coordinate arithmetic; no MPI.
struct MeshShape {
  int pipe = 1, data = 1, tensor = 1;

  int size() const { return pipe * data * tensor; }
  int extent(Axis a) const;
  // coords[int(Axis)] of a world rank.
  std::array<int, 3> coords(int world_rank) const;
  int rank_of(const std::array<int, 3>& coords) const;
  // World ranks of every group along `a`: groups in increasing order of their smallest rank,
  // members in order of their coordinate along `a` (= their rank in the axis communicator).
  std::vector<std::vector<int>> groups(Axis a) const;
  // World ranks of the group along `a` that contains `world_rank`.
  std::vector<int> group_of(Axis a, int world_rank) const;
  // Expert replicas (docs/ARCHITECTURE.md "Expert replicas"): each data group splits into data / P
  // expert groups of P consecutive data ranks; a replica group holds the data ranks d, d + P,
  // d + 2P, ... (the same experts). World ranks of every such group, ordered as groups() orders them.
  std::vector<std::vector<int>> expert_groups(int P) const;
  std::vector<std::vector<int>> replica_groups(int P) const;
  std::string str() const;  // "pipe=1 x data=2 x tensor=2 = 4 ranks"
  bool operator==(const MeshShape&) const = default;
};

// Ranks separated by spaces, all of them up to 16, else the first 6, "...", the last 2 and the
// count ("0 1 2 3 4 5 ... 2046 2047 (2048 ranks)"), so that a plan of thousands of ranks stays
// readable.
std::string format_ranks(const std::vector<int>& ranks);

// The text Mesh::describe() prints, for a mesh planned in one process (`meshmoe plan` without its
// ranks): the coordinates and groups MPI_Comm_split gives, `hosts[r]` the host of world rank r.
std::string describe_planned_mesh(const MeshShape& shape, const std::vector<std::string>& hosts);

class Mesh {
 public:
  // Collective over `world`. Throws InputError (on every rank alike) unless every extent is >= 1
  // and pipe * data * tensor equals the size of `world`. The mesh works on its own duplicate of
  // `world`, so its traffic never matches messages of other code.
  Mesh(MPI_Comm world, int pipe, int data, int tensor);
  Mesh(Mesh&&) noexcept = default;
  Mesh& operator=(Mesh&&) noexcept = default;
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;
  ~Mesh();

  const MeshShape& shape() const { return shape_; }
  // After enable_device(), the data and tensor axes' Comms route device buffers to NCCL.
  Comm& axis(Axis a) { return routed_[size_t(a)] ? *routed_[size_t(a)] : *axes_[size_t(a)]; }
  int coord(Axis a) const { return coords_[size_t(a)]; }
  int extent(Axis a) const { return shape_.extent(a); }
  int rank() const { return rank_; }
  MPI_Comm world() const { return world_->mpi(); }
  // Comm over all ranks of the mesh (rank = world rank), e.g. for run-wide metrics.
  Comm& world_comm() { return *world_; }

  // The communicators of this rank's expert group (rank: data coordinate mod P) and replica group
  // (rank: data coordinate / P) for expert groups of P data ranks (MeshShape::expert_groups). Made
  // on the first call for a given P, which is collective over the data axis; later calls return them.
  struct ExpertComms {
    Comm* group;
    Comm* replicas;
  };
  ExpertComms expert_comms(int P);

  // The shared-memory path of every host Comm of this mesh, those made later included
  // (run.shm_collectives; mesh/mpi_comm.hpp). The same on every rank.
  void set_shm(const ShmSettings& s);

  // Collective over the world. Rank 0 gets the text `meshmoe plan` prints (shape, every rank's
  // coordinates and host, the world ranks of every axis group as the communicators report them);
  // other ranks get "".
  std::string describe() const;

#ifdef MESHMOE_CUDA
  // Collective over the world: selects this rank's GPU (node-local rank modulo the device count)
  // and creates one NCCL communicator per axis group. From then on axis(Data) and axis(Tensor) are
  // RoutedComms (mesh/routed_comm.hpp): collectives of device buffers go to NCCL, in place on the
  // rank's stream, the rest to MPI. The pipe axis stays MPI: 1F1B's sends and receives between two
  // stages cross, which one stream of NCCL sends and receives would deadlock without grouping them.
  void enable_device();
  bool device_enabled() const { return dev_axes_[0] != nullptr; }
  // The NCCL Comm of an axis (device buffers); Error before enable_device().
  Comm& device_axis(Axis a);
#endif

 private:
  MeshShape shape_;
  int rank_ = 0;
  std::array<int, 3> coords_{};
  std::unique_ptr<MpiComm> world_;
  std::array<std::unique_ptr<MpiComm>, 3> axes_;
  std::map<int, std::array<std::unique_ptr<MpiComm>, 2>> expert_comms_;  // P -> (expert group, replica group)
  ShmSettings shm_;
  std::array<std::unique_ptr<Comm>, 3> routed_;  // enable_device(): data and tensor
#ifdef MESHMOE_CUDA
  std::array<std::unique_ptr<Comm>, 3> dev_axes_;
#endif
};

}  // namespace meshmoe
