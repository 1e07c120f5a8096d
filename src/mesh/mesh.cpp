// Mesh: axis communicators by MPI_Comm_split, and the plan text.
#include "mesh/mesh.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <sstream>

#include "mesh/routed_comm.hpp"

#ifdef MESHMOE_CUDA
#include "mesh/nccl_comm.hpp"
#endif

namespace meshmoe {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::Pipe: return "pipe";
    case Axis::Data: return "data";
    case Axis::Tensor: return "tensor";
  }
  return "?";
}

int MeshShape::extent(Axis a) const {
  switch (a) {
    case Axis::Pipe: return pipe;
    case Axis::Data: return data;
    case Axis::Tensor: return tensor;
  }
  return 0;
}

std::array<int, 3> MeshShape::coords(int world_rank) const {
  // world = (p * data + d) * tensor + t
  return {world_rank / (data * tensor), (world_rank / tensor) % data, world_rank % tensor};
}

int MeshShape::rank_of(const std::array<int, 3>& c) const { return (c[0] * data + c[1]) * tensor + c[2]; }

std::vector<int> MeshShape::group_of(Axis a, int world_rank) const {
  std::array<int, 3> c = coords(world_rank);
  std::vector<int> g;
  for (int i = 0; i < extent(a); ++i) {
    c[size_t(a)] = i;
    g.push_back(rank_of(c));
  }
  return g;
}

std::vector<std::vector<int>> MeshShape::groups(Axis a) const {
  std::vector<std::vector<int>> gs;
  for (int r = 0; r < size(); ++r)
    if (coords(r)[size_t(a)] == 0) gs.push_back(group_of(a, r));  // r is its group's smallest rank
  return gs;
}

namespace {
// The data groups cut into pieces: member d of a data group joins piece `piece(d)`.
template <typename Piece>
std::vector<std::vector<int>> data_pieces(const MeshShape& m, Piece piece) {
  std::vector<std::vector<int>> out;
  for (const std::vector<int>& g : m.groups(Axis::Data)) {
    std::map<int, std::vector<int>> pieces;
    for (int d = 0; d < int(g.size()); ++d) pieces[piece(d)].push_back(g[size_t(d)]);
    for (auto& [k, members] : pieces) out.push_back(std::move(members));
  }
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

std::vector<std::vector<int>> MeshShape::expert_groups(int P) const {
  return data_pieces(*this, [P](int d) { return d / P; });
}

std::vector<std::vector<int>> MeshShape::replica_groups(int P) const {
  return data_pieces(*this, [P](int d) { return d % P; });
}

std::string MeshShape::str() const {
  return "pipe=" + std::to_string(pipe) + " x data=" + std::to_string(data) + " x tensor=" + std::to_string(tensor) +
         " = " + std::to_string(size()) + " ranks";
}

Mesh::Mesh(MPI_Comm world, int pipe, int data, int tensor) : shape_{pipe, data, tensor} {
  int world_size = 0;
  MPI_Comm_size(world, &world_size);
  MPI_Comm_rank(world, &rank_);
  // Every rank sees the same arguments and world size, so every rank throws alike (no hang).
  if (pipe < 1 || data < 1 || tensor < 1)
    throw InputError("mesh: every extent must be >= 1, got pipe=" + std::to_string(pipe) + " data=" +
                     std::to_string(data) + " tensor=" + std::to_string(tensor));
  const int64_t product = int64_t(pipe) * data * tensor;
  if (product != world_size)
    throw InputError("mesh: pipe=" + std::to_string(pipe) + " x data=" + std::to_string(data) + " x tensor=" +
                     std::to_string(tensor) + " = " + std::to_string(product) + " ranks, but the job has " +
                     std::to_string(world_size) + "; launch " + std::to_string(product) +
                     " ranks or change [mesh]");

  MPI_Comm dup = MPI_COMM_NULL;
  if (MPI_Comm_dup(world, &dup) != MPI_SUCCESS) throw Error("mesh: MPI_Comm_dup failed");
  world_ = std::make_unique<MpiComm>(dup, "world");
  coords_ = shape_.coords(rank_);
  for (Axis a : kAxes) {
    // Same group <=> same coordinates on the other two axes: colour by the group's first rank;
    // key by the coordinate along the axis, so the axis rank is the coordinate.
    std::array<int, 3> first = coords_;
    first[size_t(a)] = 0;
    MPI_Comm sub = MPI_COMM_NULL;
    if (MPI_Comm_split(dup, shape_.rank_of(first), coords_[size_t(a)], &sub) != MPI_SUCCESS)
      throw Error(std::string("mesh: MPI_Comm_split for the ") + axis_name(a) + " axis failed");
    axes_[size_t(a)] = std::make_unique<MpiComm>(sub, std::string(axis_name(a)) + " axis");
  }
}

Mesh::~Mesh() = default;

Mesh::ExpertComms Mesh::expert_comms(int P) {
  const int data = shape_.data, d = coords_[size_t(Axis::Data)];
  if (P < 1 || data % P != 0)
    throw std::logic_error("Mesh::expert_comms: " + std::to_string(P) + " does not divide the data axis");
  auto& comms = expert_comms_[P];
  if (!comms[0]) {
    const MPI_Comm axis = axes_[size_t(Axis::Data)]->mpi();
    MPI_Comm group = MPI_COMM_NULL, replicas = MPI_COMM_NULL;
    if (MPI_Comm_split(axis, d / P, d % P, &group) != MPI_SUCCESS ||
        MPI_Comm_split(axis, d % P, d / P, &replicas) != MPI_SUCCESS)
      throw Error("mesh: MPI_Comm_split for the expert groups failed");
    comms[0] = std::make_unique<MpiComm>(group, "expert group");
    comms[1] = std::make_unique<MpiComm>(replicas, "expert replica group");
    for (auto& c : comms) c->set_shm(shm_);
  }
  return {comms[0].get(), comms[1].get()};
}

void Mesh::set_shm(const ShmSettings& s) {
  shm_ = s;
  world_->set_shm(s);
  for (auto& a : axes_) a->set_shm(s);
  for (auto& [P, comms] : expert_comms_)
    for (auto& c : comms) c->set_shm(s);
}

namespace {

// The text of describe(): the shape, each rank's host and coordinates, the world ranks of every
// axis group (each axis' groups sorted).
std::string format_mesh(const MeshShape& shape, const std::vector<std::string>& hosts,
                        const std::vector<std::array<int, 3>>& coords,
                        const std::array<std::vector<std::vector<int>>, 3>& groups) {
  std::ostringstream os;
  os << "mesh: " << shape.str() << "\n";
  for (int r = 0; r < shape.size(); ++r) {
    const auto& c = coords[size_t(r)];
    os << "rank " << r << "  host " << hosts[size_t(r)] << "  pipe " << c[0] << " data " << c[1] << " tensor " << c[2]
       << "\n";
  }
  for (Axis a : kAxes) {
    // At most 16 groups, each through format_ranks: a plan of thousands of ranks stays readable.
    const auto& axis_groups = groups[size_t(a)];
    os << axis_name(a) << " groups:";
    for (size_t i = 0; i < axis_groups.size() && i < 16; ++i) os << " [" << format_ranks(axis_groups[i]) << "]";
    if (axis_groups.size() > 16) os << " ... (" << axis_groups.size() << " groups)";
    os << "\n";
  }
  return os.str();
}

}  // namespace

std::string format_ranks(const std::vector<int>& ranks) {
  constexpr size_t kAll = 16, kHead = 6, kTail = 2;
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks.size() > kAll && i == kHead) {
      out += " ...";
      i = ranks.size() - kTail;
    }
    out += (out.empty() ? "" : " ") + std::to_string(ranks[i]);
  }
  if (ranks.size() > kAll) out += " (" + std::to_string(ranks.size()) + " ranks)";
  return out;
}

std::string describe_planned_mesh(const MeshShape& shape, const std::vector<std::string>& hosts) {
  std::vector<std::array<int, 3>> coords;
  for (int r = 0; r < shape.size(); ++r) coords.push_back(shape.coords(r));
  std::array<std::vector<std::vector<int>>, 3> groups;
  for (Axis a : kAxes) {
    groups[size_t(a)] = shape.groups(a);
    std::sort(groups[size_t(a)].begin(), groups[size_t(a)].end());
  }
  return format_mesh(shape, hosts, coords, groups);
}

std::string Mesh::describe() const {
  Comm& world = *world_;
  const int n = shape_.size();

  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  std::vector<char> hosts(size_t(n) * MPI_MAX_PROCESSOR_NAME);
  world.all_gather(host, MPI_MAX_PROCESSOR_NAME, hosts.data());

  std::vector<int32_t> coords(size_t(n) * 3);
  const int32_t mine[3] = {coords_[0], coords_[1], coords_[2]};
  world.all_gather(mine, 3, coords.data());

  // The groups as the communicators have them: each rank learns its group's world ranks from
  // its axis communicator, then rank 0 collects every rank's view.
  std::array<std::vector<std::vector<int>>, 3> groups;
  for (Axis a : kAxes) {
    const size_t e = size_t(shape_.extent(a));
    std::vector<int32_t> members(e), all(e * size_t(n));
    const int32_t me = rank_;
    axes_[size_t(a)]->all_gather(&me, 1, members.data());
    world.all_gather(members.data(), e, all.data());
    for (int r = 0; r < n; ++r) {
      std::vector<int> g(all.begin() + long(r * e), all.begin() + long((r + 1) * e));
      if (std::find(groups[size_t(a)].begin(), groups[size_t(a)].end(), g) == groups[size_t(a)].end())
        groups[size_t(a)].push_back(g);
    }
    std::sort(groups[size_t(a)].begin(), groups[size_t(a)].end());
  }
  if (rank_ != 0) return "";
  std::vector<std::string> names;
  std::vector<std::array<int, 3>> at;
  for (int r = 0; r < n; ++r) {
    const char* h = hosts.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME;
    names.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
    at.push_back({coords[size_t(r) * 3], coords[size_t(r) * 3 + 1], coords[size_t(r) * 3 + 2]});
  }
  return format_mesh(shape_, names, at, groups);
}

#ifdef MESHMOE_CUDA
void Mesh::enable_device() {
  if (device_enabled()) return;
  select_local_device(world_->mpi());
  for (Axis a : kAxes)
    dev_axes_[size_t(a)] = std::make_unique<NcclComm>(*axes_[size_t(a)], std::string(axis_name(a)) + " axis (nccl)");
  for (Axis a : {Axis::Data, Axis::Tensor})
    routed_[size_t(a)] = std::make_unique<RoutedComm>(*axes_[size_t(a)], *dev_axes_[size_t(a)]);
}

Comm& Mesh::device_axis(Axis a) {
  if (!dev_axes_[size_t(a)]) throw Error("mesh: device_axis() before enable_device()");
  return *dev_axes_[size_t(a)];
}
#endif

}  // namespace meshmoe
