#include "parallel/gradient_sync.hpp"

#include "tensor/step_scalars.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string_view>

#include "core/hash.hpp"
#include "parallel/state_shards.hpp"

#include "optim/grad_clip.hpp"

namespace meshmoe {

namespace {

// Appends parameter p to a list of contiguous runs of the flat buffer.
void append_run(std::vector<std::pair<size_t, size_t>>& runs, const ParamInfo& p) {
  if (!runs.empty() && runs.back().first + runs.back().second == p.flat_offset)
    runs.back().second += p.size;
  else
    runs.emplace_back(p.flat_offset, p.size);
}

}  // namespace

GradientSync::GradientSync(Transformer<float>& model, Mesh& mesh, size_t bucket_elems, bool tied_embeddings,
                           PhaseTimers* timers, bool shard_state)
    : model_(model), mesh_(mesh), bucket_elems_(bucket_elems), timers_(timers) {
  const auto& infos = model_.params().infos();
  sharded_ = shard_state && mesh_.extent(Axis::Data) > 1;
  if (sharded_ && bucket_elems > 0)  // the deck refuses the combination (optim.shard_state)
    throw std::logic_error("GradientSync: sharded optimizer state does not combine with gradient buckets");
  if (model_.params().one_weight_copy() && !sharded_)  // every rank would update every weight
    throw std::logic_error("GradientSync: one copy of the weights per node needs sharded optimizer state");
  overlap_ = bucket_elems > 0 && mesh_.extent(Axis::Data) > 1;
  const bool tied_over_pipe = tied_embeddings && mesh_.extent(Axis::Pipe) > 1;
  std::vector<Range> bucketed;
  for (const ParamInfo& p : infos) {
    if (p.sharded_over & kShardReplicas) append_run(replicated_experts_, p);
    if (p.sharded_over & kShardData) continue;
    append_run(data_replicated_ranges_, p);
    if (!overlap_) continue;
    if (p.name == "embed.wte" && tied_over_pipe)
      append_run(after_backward_, p);
    else if (p.name == "embed.wte" && model_.first_stage())
      token_embedding_ = {p.flat_offset, size_t(p.local_shape[0]), size_t(p.local_shape[1])};
    else
      append_run(bucketed, p);
  }
  // Each run cut from its end, so that the buckets come in the order the backward finishes them.
  for (auto run = bucketed.rbegin(); run != bucketed.rend(); ++run) add_buckets(planned_, *run, false);
  if (overlap_) model_.grads_final_from = [this](size_t from) { on_grads_final(from); };
  begin_step(0);

  if (!replicated_experts_.empty() && !model_.placement().replica_group)
    throw std::logic_error("GradientSync: expert replicas without their replica group's Comm");
  const bool data0 = mesh_.coord(Axis::Data) == 0, tensor0 = mesh_.coord(Axis::Tensor) == 0;
  const bool replica0 = replicated_experts_.empty() || model_.placement().replica_group->rank() == 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    if (infos[i].name == "embed.wte" && !model_.first_stage()) continue;  // tied copy: counted on stage 0
    const uint8_t s = infos[i].sharded_over;
    // an expert with replicas: counted by the first replica only
    const bool data_share = (s & kShardData) && (!(s & kShardReplicas) || replica0);
    if ((data_share || data0) && ((s & kShardTensor) || tensor0)) norm_entries_.push_back(i);
    if (!(s & kShardData) && ((s & kShardTensor) || tensor0)) norm_replicated_.push_back(i);
  }
  if (!sharded_) {
    owned_.resize(infos.size());
    std::iota(owned_.begin(), owned_.end(), size_t(0));
  }
  if (mesh_.extent(Axis::Data) == 1) return;
  // The data ranks share the norm of the data-replicated entries by the optimizer-state owners'
  // partition, sharded or not: without it the first data rank alone read every such gradient
  // while the others waited at the norm's all-reduce.
  const std::vector<int> owners = state_owners(model_.params(), mesh_.extent(Axis::Data));
  norm_owned_ = meshmoe::owned_entries(owners, mesh_.coord(Axis::Data));
  if (!sharded_) return;
  owned_ = norm_owned_;
  plan_sharded(owners, tied_over_pipe);
}

void GradientSync::plan_sharded(const std::vector<int>& owners, bool tied_over_pipe) {
  // Adafactor's sums over tensor (its DimReduce) pair the tensor ranks' updates of one parameter:
  // the tensor ranks of a data rank must own the same entries (they do: equal local shapes).
  uint64_t h[2] = {fnv1a64(std::string_view(reinterpret_cast<const char*>(owners.data()), owners.size() * sizeof(int))), 0};
  h[1] = ~h[0];
  mesh_.axis(Axis::Tensor).all_reduce(h, 2, Op::Max);
  if (h[0] != ~h[1]) throw std::logic_error("GradientSync: the tensor ranks disagree on the optimizer-state owners");

  const auto& infos = model_.params().infos();
  const size_t D = size_t(mesh_.extent(Axis::Data));
  auto append = [D](std::vector<ShardedRun>& runs, const ParamInfo& p, int owner) {
    if (runs.empty() ||
        runs.back().begin + std::accumulate(runs.back().counts.begin(), runs.back().counts.end(), size_t(0)) != p.flat_offset)
      runs.push_back({p.flat_offset, std::vector<size_t>(D, 0)});
    runs.back().counts[size_t(owner)] += p.size;
  };
  for (size_t e = 0; e < infos.size(); ++e) {
    if (owners[e] == kEveryDataRank) continue;
    append(gather_runs_, infos[e], owners[e]);
    // The tied embedding over pipe: all-reduced, so that the owners on the first and the last stage
    // update their copies from bitwise the same gradient.
    if (tied_over_pipe && infos[e].name == "embed.wte") append_run(tied_all_reduce_, infos[e]);
    else append(scatter_runs_, infos[e], owners[e]);
  }
}

GradientSync::~GradientSync() {
  if (overlap_) model_.grads_final_from = nullptr;
}

void GradientSync::add_buckets(std::vector<Bucket>& out, Range range, bool at_first_report) const {
  for (size_t end = range.first + range.second; end > range.first;) {
    const size_t begin = end - std::min(bucket_elems_, end - range.first);
    out.push_back({begin, end - begin, at_first_report ? std::numeric_limits<size_t>::max() : begin});
    end = begin;
  }
}

void GradientSync::begin_step(int micro_batches, std::span<const int32_t> last_micro_batch_tokens) {
  backwards_left_ = micro_batches;
  next_bucket_ = 0;
  started_in_backward_ = 0;
  if (!overlap_) return;
  buckets_.clear();
  const auto [wte, rows, width] = token_embedding_;
  if (rows == 0) {
    buckets_ = planned_;
    return;
  }
  // Embedding::backward adds only into the rows of the tokens it embeds, so a row that no token of
  // the last micro-batch names (on any data rank: the global rows) already holds its final gradient
  // when the last backward begins: it goes first. The other rows wait for the embedding's backward.
  std::vector<char> named(rows, 0);
  for (int32_t t : last_micro_batch_tokens)
    if (t >= 0 && size_t(t) < rows) named[size_t(t)] = 1;
  std::vector<Range> runs[2];  // [named]: row runs of the token embedding
  for (size_t r = rows; r-- > 0;) {
    auto& list = runs[size_t(named[r])];
    if (!list.empty() && list.back().first == wte + (r + 1) * width)
      list.back() = {wte + r * width, list.back().second + width};
    else
      list.emplace_back(wte + r * width, width);
  }
  for (const Range& r : runs[0]) add_buckets(buckets_, r, true);
  buckets_.insert(buckets_.end(), planned_.begin(), planned_.end());
  for (const Range& r : runs[1]) add_buckets(buckets_, r, false);
}

void GradientSync::on_grads_final(size_t from) {
  if (backwards_left_ <= 0) return;  // not in a step (evaluation; a test driving the model alone)
  if (backwards_left_ == 1) {
    ScopedPhase t(timers_, "grad_overlap");
    start_ready(from);
    mesh_.axis(Axis::Data).test_all_reduces();
  }
  if (from == 0) --backwards_left_;
}

void GradientSync::start_ready(size_t from) {
  Comm& data = mesh_.axis(Axis::Data);
  float* grads = model_.params().grads();
  for (; next_bucket_ < buckets_.size() && buckets_[next_bucket_].ready_from >= from; ++next_bucket_) {
    data.iall_reduce(grads + buckets_[next_bucket_].begin, buckets_[next_bucket_].size, Op::Sum);
    if (from > 0) ++started_in_backward_;
  }
}

void GradientSync::reduce_over_data() {
  if (mesh_.extent(Axis::Data) == 1) return;
  Comm& data = mesh_.axis(Axis::Data);
  float* grads = model_.params().grads();
  // Experts with replicas: each replica holds the gradient of its expert group's tokens; the sum
  // over the replica group is the whole batch's (docs/ARCHITECTURE.md "Expert replicas").
  for (const auto& [begin, size] : replicated_experts_)
    model_.placement().replica_group->all_reduce(grads + begin, size, Op::Sum);
  if (sharded_ && data.size() == 2) {
    for (const ShardedRun& r : scatter_runs_) data.reduce_scatterv_in_place(grads + r.begin, r.counts, Op::Sum);
    for (const auto& [begin, size] : tied_all_reduce_) data.all_reduce(grads + begin, size, Op::Sum);
    return;
  }
  // Exactness first: two data ranks sum each element as a + b whatever the collective, so the
  // reduce-scatter above gives bitwise the all-reduce's gradients. With more ranks MPI's
  // reduce-scatter adds in another order than its all-reduce, and Adam's normalisation turns that
  // into up to ~1e-5 of a parameter's scale within four steps (measured); the sharded run then
  // reduces as the unsharded one does, bitwise equal to it, at 1.5x its communication (the
  // all-gather after the update comes on top). docs/ARCHITECTURE.md "Sharded optimizer state".
  if (!overlap_) {
    for (const auto& [begin, size] : data_replicated_ranges_) data.all_reduce(grads + begin, size, Op::Sum);
    return;
  }
  start_ready(0);  // what the backward did not start (none when begin_step armed it)
  backwards_left_ = 0;
  data.wait_all_reduces();
  for (const auto& [begin, size] : after_backward_) data.all_reduce(grads + begin, size, Op::Sum);
}

void GradientSync::gather_params() {
  if (!sharded_) return;
  Comm& data = mesh_.axis(Axis::Data);
  float* weights = model_.params().weights();
  if (model_.params().one_weight_copy()) {
    // The owners wrote their node's one copy; the blocks of the owners on other nodes come in
    // between the nodes (nothing on one node), then every rank of the node sees them (and the bf16
    // copy is rounded from them).
    for (const ShardedRun& r : gather_runs_) data.node_copy_all_gather(weights + r.begin, r.counts);
    return model_.params().publish_weights();
  }
  for (const ShardedRun& r : gather_runs_) {
    data.all_gatherv_in_place(weights + r.begin, r.counts);
    // the other owners' updates into the bf16 copy (its owned part rounds to the same bits again)
    model_.params().round_weights16(r.begin, std::accumulate(r.counts.begin(), r.counts.end(), size_t(0)));
  }
}

void GradientSync::plan_norm() {
  const ParamStore<float>& store = model_.params();
  norm_planned_ = true;
  if (mesh_.extent(Axis::Data) == 1) {
    norm_sums_ = EntrySumSquares(store, norm_entries_);
    return;
  }
  std::vector<size_t> share_entries;  // this rank's replicated entries
  for (size_t i = 0; i < norm_replicated_.size(); ++i)
    if (std::binary_search(norm_owned_.begin(), norm_owned_.end(), norm_replicated_[i]))
      share_.push_back(i), share_entries.push_back(norm_replicated_[i]);
  share_sums_ = EntrySumSquares(store, share_entries);
  std::vector<size_t> split;  // this rank's own blocks of entries split over data
  for (size_t e : norm_entries_)
    if (store.infos()[e].sharded_over & kShardData) split.push_back(e);
  split_sums_ = EntrySumSquares(store, split);
}

// The data-replicated entries' sums of squares come from their owners (each element of the
// all-reduced vector has one non-zero term: exact), then every rank adds its norm entries in the
// order of one data rank's sum, so the norm is bitwise that sum given the same gradients.
double GradientSync::owned_norm_squares() {
  const ParamStore<float>& store = model_.params();
  const auto& infos = store.infos();
  std::vector<double> share_sums, split_sums;
  share_sums_.queue(store, share_sums);
  split_sums_.queue(store, split_sums);
  step_scalars().read();  // both with the step's other scalars, in one copy
  std::vector<double> replicated(norm_replicated_.size(), 0.0);
  for (size_t j = 0; j < share_.size(); ++j) replicated[share_[j]] = share_sums[j];
  mesh_.axis(Axis::Data).all_reduce(replicated.data(), replicated.size(), Op::Sum);
  double sq = 0.0;
  size_t r = 0, b = 0;
  for (size_t e : norm_entries_) {
    if (infos[e].sharded_over & kShardData) sq += split_sums[b++];
    else {
      while (norm_replicated_[r] != e) ++r;
      sq += replicated[r];
    }
  }
  return sq;
}

double GradientSync::global_norm() {
  if (!norm_planned_) plan_norm();
  // Every data rank takes the shared path (it has a collective), even one that owns no entry.
  double sq = 0.0;
  if (mesh_.extent(Axis::Data) > 1)
    sq = owned_norm_squares();
  else
    for (double entry : norm_sums_(model_.params())) sq += entry;  // in the entries' order
  mesh_.world_comm().all_reduce(&sq, 1, Op::Sum);
  return std::sqrt(sq);
}

}  // namespace meshmoe
