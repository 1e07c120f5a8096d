// Memory and cost plan of one rank: what `meshmoe plan` prints and what the trainer reports and
// checks at start-up (run/startup.hpp).
//
// plan_memory() works from the deck alone (no MPI, no allocation): sums over the rank's shape table
// (model/shape_table.hpp, docs/ARCHITECTURE.md "The shape table"): parameter, gradient and optimizer
// bytes over the parameter entries the model registers, activation and backward-workspace bytes over
// the buffers each layer allocates for one micro-batch (by kind: saved for the backward, forward-only,
// backward scratch), and bytes sent per step on each mesh axis. The expert placement is the
// documented one (docs/ARCHITECTURE.md "The mesh"): Placement::expert_shape. The tests measure the
// real model of the same placement against the plan (tests/support/memory_support.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "deck/config.hpp"
#include "mesh/mesh.hpp"
#include "model/shape_table.hpp"

namespace meshmoe {

struct MemoryPlan {
  // placement
  int pipe_rank = 0, data_rank = 0, tensor_rank = 0;
  int first_block = 0, num_blocks = 0;  // this stage's blocks [first_block, first_block + num_blocks)
  bool first_stage = true, last_stage = true;
  int rows = 0, seq_len = 0;            // one micro-batch of this rank: rows sequences of seq_len tokens
  int in_flight = 1;                    // micro-batches between forward and backward at once (1F1B)

  // parameter counts (elements)
  int64_t params_total = 0;      // the whole model, unsharded, the tied embedding once
  int64_t params_rank = 0;       // this rank's ParamStore (a pipeline's tied copy included)
  int64_t params_activated = 0;  // used by one token: everything but the experts it does not visit
  double flops_per_token = 0;    // train_flops_per_token (forward + backward)

  // bytes held by this rank
  size_t param_bytes = 0, grad_bytes = 0, optim_bytes = 0;
  size_t activation_bytes = 0;   // kept by one micro-batch's forward (what the first forward allocates)
  size_t workspace_bytes = 0;    // kept by backward between steps (its scratch buffers)
  size_t pipeline_bytes = 0;     // receive buffers (model.recompute = block: the stage inputs of in-flight
                                 // micro-batches) and the send buffers of a step
  size_t stash_bytes = 0;        // recompute = none: the saved activations of the in_flight - 1
                                 // micro-batches parked while the layers hold another one
  std::vector<std::pair<std::string, size_t>> activation_parts;  // breakdown of activation_bytes
  // Beyond the model (add_process_memory): the dataset this rank holds in memory, the runtime (MPI,
  // OpenBLAS, HDF5, the executable: runtime_memory_bytes) and the decoder's caches of the
  // translation scores during training (eval.bleu_every: decode_memory_bytes of bleu_eval_shape).
  size_t dataset_bytes = 0;
  size_t runtime_bytes = 0;
  size_t decoder_bytes = 0;
  size_t model_bytes() const {
    return param_bytes + grad_bytes + optim_bytes + activation_bytes + workspace_bytes + pipeline_bytes + stash_bytes;
  }
  size_t total_bytes() const { return model_bytes() + dataset_bytes + runtime_bytes + decoder_bytes; }

  // bytes this rank sends per optimizer step on each axis (ring all-reduce: 2 (n-1)/n x the buffer;
  // all-to-all: (n-1)/n x the buffer)
  double sent_data = 0, sent_tensor = 0, sent_pipe = 0;
  // their parts, by the group each goes to (the placement on nodes, run/node_placement.hpp):
  // sent_data = all-reduce over the data axis + over the replica groups + all-to-all in the expert
  // groups; sent_pipe = to the next stage + to the previous stage + the tied embedding's gradient
  // (between the first and the last stage)
  double sent_data_allreduce = 0, sent_data_replicas = 0, sent_data_all_to_all = 0;
  double sent_pipe_next = 0, sent_pipe_prev = 0, sent_pipe_tied = 0;
};

// The whole model's counts, the same on every rank (the table of a one-rank mesh): parameters, those
// a token visits, training FLOPs per token. `table`: any rank's table with the micro-batch's buffers
// (expert choice's visits read its C and S). Throws InputError when a count overflows.
struct ModelCounts {
  int64_t params_total = 0, params_activated = 0;
  double flops_per_token = 0;
};
ModelCounts model_counts(const Config& cfg, const ShapeTable& table);

// The plan of the rank of `table` (a table with the micro-batch's buffers: CheckedShapes with the
// batch), `whole` the model's counts. Throws InputError when a byte count overflows.
MemoryPlan plan_memory(const Config& cfg, const ShapeTable& table, const ModelCounts& whole);

// The same from the deck in one call (the start-up's steps for one rank): the plan of the rank at
// (pipe_rank, data_rank, tensor_rank) of `mesh` for the model of `cfg` with vocabulary `vocab`.
// Throws InputError when the deck does not split over the mesh.
MemoryPlan plan_memory(const Config& cfg, int vocab, const MeshShape& mesh, int pipe_rank, int data_rank,
                       int tensor_rank);

// The memory of a rank beyond its model's tensors (docs/user-guide.md "Memory check"): the runtime,
// a baseline measured once as the proportional set size (Pss) of a rank that has initialised MPI,
// OpenBLAS and HDF5 and holds no model or data, plus OpenBLAS's per-thread GEMM buffers for
// `blas_threads`; see the derivation at kRuntimeBaseline in memory.cpp.
size_t runtime_memory_bytes(int blas_threads);

// Fills plan.dataset_bytes (`dataset_bytes`: what the loader holds for the run, Dataset::open's splits
// and the batcher's order; data/dataset.hpp DatasetInfo::train_bytes), plan.runtime_bytes
// (runtime_memory_bytes of the run's BLAS threads, run.threads or OPENBLAS_NUM_THREADS) and, with
// eval.bleu_every > 0, plan.decoder_bytes (decode/decode_memory.hpp, vocabulary `vocab`). Nothing
// with run.device = "cuda": that plan counts the GPU's memory, and these live in the host's.
void add_process_memory(const Config& cfg, int vocab, size_t dataset_bytes, MemoryPlan& plan);

// This process's proportional set size (Pss of /proc/self/smaps_rollup, bytes): its private pages
// plus its share of each page mapped by n processes (shared libraries, node-shared windows, MPI's
// shared-memory segments) counted 1/n, so that the ranks of a node sum to the node's memory. 0 when
// the kernel has no smaps_rollup (Linux before 4.14) or it cannot be read.
double pss_bytes();

// Human-readable byte count: "1.50 MiB".
std::string format_bytes(double bytes);

// Human-readable count in powers of 1000, as model cards write parameter counts: "46.70B", "1.28M".
std::string format_count(double n);

// The report `meshmoe plan` prints and the trainer logs: one column per pipeline stage (its ranks
// hold equal shards), then a warning line for each stage whose total exceeds `node_bytes_per_rank`
// (0: no check): the available memory of the node (node_share, memory_limit.hpp) divided by its
// ranks. `stages[s]`: the plans of stage s's tensor rank 0, data rank 0 first; with
// optim.shard_state (the data ranks' optimizer state differs) every data rank's: the column is the
// largest, and a line lists them all.
std::string memory_report(const Config& cfg, const MeshShape& mesh, const std::vector<std::vector<MemoryPlan>>& stages,
                          double node_bytes_per_rank);

// Where the experts of a deck with experts over data live (`meshmoe plan`, the trainer's log): the
// expert groups of mesh.expert_parallel data ranks (the all-to-all) and the replica groups (the
// experts' gradient all-reduce), as world ranks; at most `max_groups` of each listed. "" without
// MoE layers or with experts over tensor.
std::string expert_layout(const Config& cfg, const MeshShape& mesh, size_t max_groups = 16);

}  // namespace meshmoe
