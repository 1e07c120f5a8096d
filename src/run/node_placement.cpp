#include "run/node_placement.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "core/error.hpp"

namespace meshmoe {

namespace {
void require(bool ok, const std::string& msg) {
  if (!ok) throw InputError(msg);
}
}  // namespace

std::vector<int> NodeMap::ranks_of(int node) const {
  std::vector<int> r;
  for (int i = 0; i < int(node_of.size()); ++i)
    if (node_of[size_t(i)] == node) r.push_back(i);
  return r;
}

NodeMap nodes_in_blocks(int world_size, int ranks_per_node, const std::string& source) {
  require(ranks_per_node >= 1, "ranks per node: must be at least 1, not " + std::to_string(ranks_per_node));
  NodeMap m;
  m.source = source;
  for (int r = 0; r < world_size; ++r) m.node_of.push_back(r / ranks_per_node);
  for (int n = 0; n * ranks_per_node < world_size; ++n) m.names.push_back("node " + std::to_string(n));
  return m;
}

NodeMap nodes_seen_by_mpi(MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  MPI_Comm shared;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared);
  int leader = rank;  // the world rank of this node's first rank
  MPI_Bcast(&leader, 1, MPI_INT, 0, shared);
  MPI_Comm_free(&shared);
  std::vector<int> leaders(size_t(size), 0);
  MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, world);
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  std::vector<char> hosts(size_t(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, world);

  NodeMap m;
  m.source = "the shared-memory split";
  std::vector<int> index_of_leader(size_t(size), -1);
  for (int r = 0; r < size; ++r) {
    const int l = leaders[size_t(r)];
    if (index_of_leader[size_t(l)] < 0) {
      index_of_leader[size_t(l)] = m.nodes();
      const char* h = hosts.data() + size_t(l) * MPI_MAX_PROCESSOR_NAME;
      m.names.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
    }
    m.node_of.push_back(index_of_leader[size_t(l)]);
  }
  return m;
}

std::string describe_nodes(const NodeMap& nodes, const std::string& title) {
  std::ostringstream os;
  os << title << ": " << nodes.nodes() << " (";
  for (int n = 0; n < nodes.nodes(); ++n) {
    os << (n ? "; " : "") << nodes.names[size_t(n)] << ": ranks " << format_ranks(nodes.ranks_of(n));
  }
  os << ")\n";
  return os.str();
}

namespace {

bool spans_nodes(const std::vector<int>& group, const NodeMap& nodes) {
  for (int r : group)
    if (nodes.node_of[size_t(r)] != nodes.node_of[size_t(group[0])]) return true;
  return false;
}

// A ring all-reduce in the group's order: each rank sends `per_rank` bytes to the next member.
double ring_crossing(const std::vector<int>& group, const NodeMap& nodes, double per_rank) {
  double b = 0;
  const size_t n = group.size();
  for (size_t i = 0; i < n && n > 1; ++i)
    if (nodes.node_of[size_t(group[i])] != nodes.node_of[size_t(group[(i + 1) % n])]) b += per_rank;
  return b;
}

// An all-to-all: each rank sends per_rank / (n - 1) bytes to each other member.
double all_to_all_crossing(const std::vector<int>& group, const NodeMap& nodes, double per_rank) {
  double b = 0;
  const size_t n = group.size();
  if (n < 2) return 0;
  for (int from : group)
    for (int to : group)
      if (nodes.node_of[size_t(from)] != nodes.node_of[size_t(to)]) b += per_rank / double(n - 1);
  return b;
}

}  // namespace

int groups_spanning_nodes(const MeshShape& mesh, const NodeMap& nodes, Axis axis) {
  int n = 0;
  for (const auto& g : mesh.groups(axis)) n += spans_nodes(g, nodes);
  return n;
}

std::vector<AxisCrossing> node_crossings(const MeshShape& mesh, const NodeMap& nodes,
                                         const std::vector<MemoryPlan>& stage_plans, int expert_parallel) {
  require(int(nodes.node_of.size()) == mesh.size(), "placement: " + std::to_string(nodes.node_of.size()) +
                                                     " ranks on the nodes, the mesh has " + mesh.str());
  require(int(stage_plans.size()) == mesh.pipe, "placement: one plan per pipeline stage needed");
  const auto stage = [&](int world_rank) -> const MemoryPlan& { return stage_plans[size_t(mesh.coords(world_rank)[0])]; };
  std::vector<AxisCrossing> out;
  for (Axis a : kAxes) {
    AxisCrossing c;
    c.axis = a;
    c.groups_spanning = groups_spanning_nodes(mesh, nodes, a);
    for (const auto& g : mesh.groups(a)) {
      ++c.groups;
      const MemoryPlan& p = stage(g[0]);
      if (a == Axis::Data) c.bytes += ring_crossing(g, nodes, p.sent_data_allreduce);
      if (a == Axis::Tensor) c.bytes += ring_crossing(g, nodes, p.sent_tensor);
      if (a == Axis::Pipe) {
        for (size_t s = 0; s < g.size(); ++s) {
          const MemoryPlan& q = stage_plans[s];
          if (s + 1 < g.size() && nodes.node_of[size_t(g[s])] != nodes.node_of[size_t(g[s + 1])]) c.bytes += q.sent_pipe_next;
          if (s > 0 && nodes.node_of[size_t(g[s])] != nodes.node_of[size_t(g[s - 1])]) c.bytes += q.sent_pipe_prev;
          const int other = s == 0 ? g.back() : g.front();  // the tied embedding: first <-> last stage
          if (nodes.node_of[size_t(g[s])] != nodes.node_of[size_t(other)]) c.bytes += q.sent_pipe_tied;
        }
      }
    }
    if (a == Axis::Data && expert_parallel >= 1 && mesh.data % expert_parallel == 0) {
      for (const auto& g : mesh.expert_groups(expert_parallel)) {
        c.bytes += all_to_all_crossing(g, nodes, stage(g[0]).sent_data_all_to_all);
      }
      for (const auto& g : mesh.replica_groups(expert_parallel)) c.bytes += ring_crossing(g, nodes, stage(g[0]).sent_data_replicas);
    }
    out.push_back(c);
  }
  return out;
}

std::string placement_report(const MeshShape& mesh, const NodeMap& nodes, const std::vector<AxisCrossing>& crossings) {
  std::ostringstream os;
  os << describe_nodes(nodes, "placement (" + nodes.source + "): nodes");
  os << "bytes across node boundaries per step (all ranks; rings in rank order):\n";
  bool tensor_spans = false;
  for (const AxisCrossing& c : crossings) {
    char line[160];
    if (c.groups_spanning == 0)
      std::snprintf(line, sizeof line, "  %-7s within nodes%*s %16.0f\n", axis_name(c.axis), 22, "", c.bytes);
    else
      std::snprintf(line, sizeof line, "  %-7s crosses nodes: %3d of %3d groups %16.0f\n", axis_name(c.axis),
                    c.groups_spanning, c.groups, c.bytes);
    os << line;
    tensor_spans |= c.axis == Axis::Tensor && c.groups_spanning > 0;
  }
  if (tensor_spans)
    os << "warning: the tensor axis spans nodes (mesh.tensor = " << mesh.tensor
       << "): its all-reduces, two per layer forward and backward, go over the network; keep each tensor group on "
          "one node (ranks per node a multiple of mesh.tensor)\n";
  return os.str();
}

int slurm_ranks_per_node() {
  const char* v = std::getenv("SLURM_NTASKS_PER_NODE");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  require(end && *end == '\0' && n >= 1 && n < (1L << 30),
       std::string("SLURM_NTASKS_PER_NODE = '") + v + "': not a positive number (give --ranks-per-node)");
  return int(n);
}

}  // namespace meshmoe
