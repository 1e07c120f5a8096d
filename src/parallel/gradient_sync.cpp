#include "parallel/gradient_sync.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "train/grad_clip.hpp"

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
                           PhaseTimers* timers)
    : model_(model), mesh_(mesh), bucket_elems_(bucket_elems), timers_(timers) {
  const auto& infos = model_.params().infos();
  overlap_ = bucket_elems > 0 && mesh_.extent(Axis::Data) > 1;
  const bool tied_over_pipe = tied_embeddings && mesh_.extent(Axis::Pipe) > 1;
  std::vector<Range> bucketed;
  for (const ParamInfo& p : infos) {
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

  const bool data0 = mesh_.coord(Axis::Data) == 0, tensor0 = mesh_.coord(Axis::Tensor) == 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    if (infos[i].name == "embed.wte" && !model_.first_stage()) continue;  // tied copy: counted on stage 0
    const uint8_t s = infos[i].sharded_over;
    if (((s & kShardData) || data0) && ((s & kShardTensor) || tensor0)) norm_entries_.push_back(i);
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
  if (!overlap_) {
    for (const auto& [begin, size] : data_replicated_ranges_) data.all_reduce(grads + begin, size, Op::Sum);
    return;
  }
  start_ready(0);  // what the backward did not start (none when begin_step armed it)
  backwards_left_ = 0;
  data.wait_all_reduces();
  for (const auto& [begin, size] : after_backward_) data.all_reduce(grads + begin, size, Op::Sum);
}

double GradientSync::global_norm() {
  double sq = grad_sum_squares(model_.params(), norm_entries_);
  mesh_.world_comm().all_reduce(&sq, 1, Op::Sum);
  return std::sqrt(sq);
}

}  // namespace meshmoe
