// The memory a process may use, and the collective check that refuses a run whose plan does not fit
// before anything large is allocated (docs/user-guide.md "Memory check").
//
// Available memory of this process: the smallest of its cgroup's memory limit (cgroup v2 memory.max,
// cgroup v1 memory.limit_in_bytes, the process's own cgroup and every ancestor, from
// /proc/self/cgroup; "max" and the near-2^63 "unlimited" values count as none) and /proc/meminfo's
// MemAvailable (MemTotal when the kernel has no MemAvailable), read once per process (the check
// before allocating and the report after it judge the same figure). run.max_memory (or bench-comm's
// --max-memory) replaces that figure.
//
// The ranks of one node (MPI_COMM_TYPE_SHARED) share its memory: the check sums their planned
// bytes and compares the sum with the node's available memory. Every rank reaches the same verdict
// and throws the same InputError (exit 2); rank 0's message names the tightest node.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>

#include "deck/config.hpp"
#include "mesh/mesh.hpp"

namespace meshmoe {

struct MemoryPlan;  // run/memory.hpp

struct MemoryLimit {
  double bytes = 0;    // 0: unknown (nothing readable)
  std::string source;  // "cgroup limit /sys/fs/cgroup/.../memory.max", "MemAvailable of /proc/meminfo", ...
};

// The cgroup memory limit of the process whose /proc/<pid>/cgroup text is `proc_cgroup`, with the
// cgroup file systems mounted under `cgroup_root` (normally /sys/fs/cgroup): the smallest limit of
// its cgroup and its ancestors, the file it came from in `file`. Empty when there is no limit.
std::optional<double> cgroup_memory_limit(const std::string& proc_cgroup, const std::string& cgroup_root,
                                          std::string* file);

// The memory available to this process (see above); `max_memory` is the run.max_memory text (""
// = detect). An unparsable max_memory raises InputError (the deck validates it earlier).
// `key` names the setting in messages.
MemoryLimit available_memory(const std::string& max_memory = "", const std::string& key = "run.max_memory");

// Collective over `world`: `bytes_here` is what this rank will allocate; the sum over the ranks of
// each node is compared with that node's available memory (the smallest reported by its ranks).
// Throws InputError on every rank when some node does not have enough; rank 0's message reads
// "<what> needs X per node (N ranks: ...), more than the Y available (<source>); <hint>".
void check_node_memory(double bytes_here, const std::string& what, const std::string& max_memory,
                       const std::string& hint, MPI_Comm world, const std::string& key = "run.max_memory");

// Collective over the mesh's ranks, before the trainer opens data or builds the model (the start-up's
// last step, run/startup.hpp): `stage_plan`, the memory plan of this rank's pipeline stage (at data
// and tensor rank 0), summed per node against the available memory. Skipped for run.device =
// "cuda", whose tensors live in GPU memory.
void check_memory_plan(const Config& cfg, const MemoryPlan& stage_plan, MPI_Comm world);

// Collective over `world`: the line the trainer logs at the end of a run on rank 0 ("" elsewhere),
// each rank's measured peak Pss (`peak_pss`, pss_bytes() sampled where memory peaks, Trainer) against
// its plan (`planned`, MemoryPlan::total_bytes), in MiB, and the plan's error as a percentage of
// the measured: "memory measured (peak Pss per rank): rank 0 512.3 MiB (plan 498.2 MiB, -2.8%); rank 1 ...".
std::string measured_memory_line(double peak_pss, double planned, MPI_Comm world);

// Collective over `world`: the memory available to each rank of the tightest node (the smallest
// available_memory(max_memory) of a node's ranks, shared by them; 0 when unknown), how many ranks
// that node holds and where its figure came from. An unparsable max_memory counts as unknown (the
// deck refuses one before).
struct NodeShare {
  double per_rank = 0;
  int ranks = 1;
  std::string source;
};
NodeShare node_share(const std::string& max_memory, MPI_Comm world);

}  // namespace meshmoe
