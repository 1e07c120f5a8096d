#include "parallel/gradient_sync.hpp"

#include <cmath>

#include "train/grad_clip.hpp"

namespace meshmoe {

GradientSync::GradientSync(Transformer<float>& model, Mesh& mesh) : model_(model), mesh_(mesh) {
  const auto& infos = model_.params().infos();
  for (const ParamInfo& p : infos) {
    if (p.sharded_over & kShardData) continue;
    if (!data_replicated_ranges_.empty() &&
        data_replicated_ranges_.back().first + data_replicated_ranges_.back().second == p.flat_offset)
      data_replicated_ranges_.back().second += p.size;
    else
      data_replicated_ranges_.emplace_back(p.flat_offset, p.size);
  }
  const bool data0 = mesh_.coord(Axis::Data) == 0, tensor0 = mesh_.coord(Axis::Tensor) == 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    if (infos[i].name == "embed.wte" && !model_.first_stage()) continue;  // tied copy: counted on stage 0
    const uint8_t s = infos[i].sharded_over;
    if (((s & kShardData) || data0) && ((s & kShardTensor) || tensor0)) norm_entries_.push_back(i);
  }
}

void GradientSync::reduce_over_data() {
  if (mesh_.extent(Axis::Data) == 1) return;
  Comm& data = mesh_.axis(Axis::Data);
  float* grads = model_.params().grads();
  for (const auto& [begin, size] : data_replicated_ranges_) data.all_reduce(grads + begin, size, Op::Sum);
}

double GradientSync::global_norm() {
  double sq = grad_sum_squares(model_.params(), norm_entries_);
  mesh_.world_comm().all_reduce(&sq, 1, Op::Sum);
  return std::sqrt(sq);
}

}  // namespace meshmoe
