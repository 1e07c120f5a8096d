// What a step's gradients need between the backward and the update (docs/ARCHITECTURE.md "The mesh"): the
// gradients of parameters replicated over the data axis are summed over it, and the global norm
// counts every unique parameter element once, whatever the mesh.
//
// The sum over data can overlap the backward (PyTorch DDP's gradient buckets): the data-replicated
// gradients are cut into buckets of contiguous ranges of the flat buffer, in the order the backward
// finishes them (the head, then the last block first), and each bucket's non-blocking all-reduce
// starts as soon as the model reports its gradients final in the last micro-batch's backward
// (docs/ARCHITECTURE.md "One training step"); the token embedding's rows that the last micro-batch
// does not embed go first. Each element is summed over the same ranks as in the blocking path.
//
// With sharded optimizer state (optim.shard_state, parallel/state_shards.hpp) each data rank owns
// whole data-replicated parameters: their gradients are reduce-scattered instead of all-reduced (the
// owner alone gets the sum; elsewhere those gradients are left undefined), the norm is taken from
// the owners' sums, the optimizer updates only the owned entries, and gather_params() all-gathers
// the updated parameters over data (docs/ARCHITECTURE.md "Sharded optimizer state").
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/timers.hpp"
#include "mesh/mesh.hpp"
#include "model/transformer.hpp"
#include "optim/grad_clip.hpp"

namespace meshmoe {

class GradientSync {
 public:
  // Plans the all-reduces and the norm's entries from the model's parameter table. bucket_elems > 0
  // (run.grad_bucket_mb) overlaps the sum over data with the backward in buckets of about that many
  // elements; 0 sums everything after the backward. With tied embeddings on a pipeline, the token
  // embedding and its copy are summed over pipe first (PipelineExecutor::sync_tied_embedding), so
  // they stay out of the buckets and are reduced after the backward.
  // `timers` (optional) gets "grad_overlap": the time the backward spends starting and testing buckets.
  // shard_state (optim.shard_state, no buckets): the owners of state_owners(); a no-op with one data rank.
  GradientSync(Transformer<float>& model, Mesh& mesh, size_t bucket_elems = 0, bool tied_embeddings = false,
               PhaseTimers* timers = nullptr, bool shard_state = false);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Arms the overlap for a step of `micro_batches` backward passes on this rank: buckets start
  // during the last one, when the gradients have summed every micro-batch. The tokens of the last
  // micro-batch's global rows (all data ranks) let the token embedding's rows they do not name
  // start first; without them its rows wait for the end of the backward.
  void begin_step(int micro_batches, std::span<const int32_t> last_micro_batch_tokens = {});

  // Sums the gradients of data-replicated parameters over the data axis (all but experts split
  // over data), and those of experts with replicas over their replica group. Without overlap: contiguous runs of them in the flat buffer, one all-reduce per run.
  // With overlap: waits for the buckets (starting any the backward did not), then reduces the
  // parameters kept out of them. Call after sync_tied_embedding.
  void reduce_over_data();

  // The entries this rank updates and keeps optimizer state for (every entry unless sharded), and
  // after the update (sharded only) the all-gather of the owned parameters over data.
  const std::vector<size_t>& owned_entries() const { return owned_; }
  void gather_params();

  // Tests only: the last step's buckets whose all-reduce started before its backward ended, and all.
  int buckets_started_in_backward() const { return started_in_backward_; }
  size_t num_buckets() const { return buckets_.size(); }

  // The global gradient norm: each rank sums the squares of the elements it is responsible for
  // (a replicated parameter on one rank of its replicas: over data its state owner
  // (parallel/state_shards.hpp), over the other axes coordinate 0, an expert with replicas on the
  // first of its replica group; the tied copy on the last stage not at all), then one world
  // all-reduce.
  double global_norm();

 private:
  using Range = std::pair<size_t, size_t>;  // (flat offset, size)
  // A contiguous run of the flat buffer cut into one block per data rank, in rank order.
  struct ShardedRun {
    size_t begin;
    std::vector<size_t> counts;  // [data ranks]
  };
  void plan_sharded(const std::vector<int>& owners, bool tied_over_pipe);
  double owned_norm_squares();
  struct Bucket {
    size_t begin, size;
    size_t ready_from;  // starts when the backward reports gradients final from here: begin, or
                        // SIZE_MAX for the first report
  };
  // Appends `range` cut from its end into buckets, ready from their begin or at the first report.
  void add_buckets(std::vector<Bucket>& out, Range range, bool at_first_report) const;
  void on_grads_final(size_t from);  // the model's grads_final_from hook
  void start_ready(size_t from);

  Transformer<float>& model_;
  Mesh& mesh_;
  size_t bucket_elems_;
  PhaseTimers* timers_;
  bool overlap_ = false;
  std::vector<Range> data_replicated_ranges_;  // blocking path: every run
  std::vector<Range> replicated_experts_;      // experts with replicas: summed over the replica group
  std::vector<Bucket> planned_;                // overlap: all but the token embedding, last first
  std::vector<Bucket> buckets_;                // this step's, in start order (ready_from descending)
  std::vector<Range> after_backward_;          // overlap: the tied embedding (pipe > 1)
  struct {
    size_t offset = 0, rows = 0, width = 0;
  } token_embedding_;                          // overlap on the first stage, unless tied over pipe
  size_t next_bucket_ = 0;                     // buckets_[0, next_bucket_) have started
  int backwards_left_ = 0;                     // of this step; the buckets start in the last one
  int started_in_backward_ = 0;
  std::vector<size_t> norm_entries_;
  bool sharded_ = false;
  std::vector<size_t> owned_;
  std::vector<size_t> norm_owned_;  // data > 1: the entries whose norm this rank takes (= owned_ when sharded)
  std::vector<ShardedRun> scatter_runs_, gather_runs_;  // sharded: the gradients' and the parameters'
  std::vector<Range> tied_all_reduce_;                  // sharded: the tied embedding over pipe
  std::vector<size_t> norm_replicated_;                 // data > 1: norm entries replicated over data
  // The norm's sums of squares, one launch each, listed at the first global_norm (plan_norm):
  // data = 1: norm_entries_; data > 1: this rank's share of norm_replicated_ (share_: their
  // indices there) and its own blocks of the entries split over data.
  void plan_norm();
  bool norm_planned_ = false;
  EntrySumSquares norm_sums_, share_sums_, split_sums_;
  std::vector<size_t> share_;
};

}  // namespace meshmoe
