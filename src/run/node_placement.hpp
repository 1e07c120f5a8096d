// The mesh's ranks on nodes (docs/cluster.md "Placing the mesh on nodes"): which node holds each
// world rank, which mesh axes have groups spanning nodes, and the bytes each axis sends across node
// boundaries per optimizer step, derived from the memory plan's per-axis volumes (run/memory.hpp).
// `meshmoe plan` prints it; a job checks its placement with it before a long run.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "mesh/mesh.hpp"
#include "run/memory.hpp"

namespace meshmoe {

struct NodeMap {
  std::vector<int> node_of;        // world rank -> node index (nodes numbered by their first rank)
  std::vector<std::string> names;  // node index -> name (the processor name, or "node N")
  std::string source;              // where the placement comes from, for the report

  int nodes() const { return int(names.size()); }
  std::vector<int> ranks_of(int node) const;
};

// Blocks of `ranks_per_node` consecutive world ranks per node (Slurm's block distribution, mpirun's
// --map-by slot or core): the placement a job of that many ranks per node gets. ranks_per_node >= 1.
NodeMap nodes_in_blocks(int world_size, int ranks_per_node, const std::string& source);

// The nodes as MPI sees them, collective over `world`: the MPI_COMM_TYPE_SHARED split (the ranks
// that share memory) named by the processor name of its first rank.
NodeMap nodes_seen_by_mpi(MPI_Comm world);

// "nodes seen by MPI: 2 (fakenode1: ranks 0 1; fakenode2: ranks 2 3)", one line.
std::string describe_nodes(const NodeMap& nodes, const std::string& title);

// The groups of `axis` whose ranks are on more than one node.
int groups_spanning_nodes(const MeshShape& mesh, const NodeMap& nodes, Axis axis);

// What one mesh axis sends across node boundaries per optimizer step, summed over all ranks.
struct AxisCrossing {
  Axis axis = Axis::Data;
  int groups = 0, groups_spanning = 0;  // the axis' communication groups, and those on more than one node
  double bytes = 0;                     // sent from one node to another per step, all ranks together
};

// The crossings of each axis, from `stage_plans[p]`: the plan of a rank of stage p (its per-axis
// volumes are every data and tensor rank's) and `expert_parallel` (P of the expert and replica
// groups). The model of each collective (as the plan's volumes assume): a ring all-reduce in the
// group's rank order, each rank sending its share to the next, so a ring over k > 1 nodes crosses
// k of its edges; an all-to-all sends 1/(n-1) of a rank's volume to each other member; a pipeline
// stage sends its activations to the next stage's rank and their gradients to the previous one's;
// the tied embedding's gradient goes between the first and the last stage.
std::vector<AxisCrossing> node_crossings(const MeshShape& mesh, const NodeMap& nodes,
                                         const std::vector<MemoryPlan>& stage_plans, int expert_parallel);

// The report: the placement's nodes, one line per axis (within nodes, or the groups spanning nodes
// and their bytes), and a warning when a tensor group spans nodes (Megatron's all-reduces, two per
// layer forward and backward, then go over the network).
std::string placement_report(const MeshShape& mesh, const NodeMap& nodes, const std::vector<AxisCrossing>& crossings);

// Ranks per node from the environment: SLURM_NTASKS_PER_NODE when Slurm sets it (0 otherwise).
// Throws InputError when it is set but not a positive number.
int slurm_ranks_per_node();

}  // namespace meshmoe
