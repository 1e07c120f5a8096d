#include "train/step_stats.hpp"

#include <cmath>

#include "model/moe/moe_layer.hpp"

namespace meshmoe {

void StepSums::add(const ForwardStats& f, const std::vector<const MoeLayer<float>*>& moe, size_t first_moe_layer) {
  v_[0] += f.ce_sum;
  v_[1] += f.mask_sum;
  v_[2] += f.aux_sum;
  v_[3] += f.z_sum;
  for (size_t l = 0; l < moe.size(); ++l) {
    double* o = layer(first_moe_layer + l);
    const MoeStats& ms = moe[l]->stats();
    for (size_t e = 0; e < experts_; ++e) o[e] += double(ms.load[e]);
    o[experts_] += double(ms.wanted);
    o[experts_ + 1] += double(ms.dropped);
  }
}

StepStats StepSums::stats(double tokens, double groups) const {
  StepStats s;
  s.loss = v_[1] > 0 ? v_[0] / v_[1] : std::nan("");
  s.aux = layers_ == 0 ? 0 : v_[2] / groups;
  s.z = layers_ == 0 ? 0 : v_[3] / tokens;
  for (size_t l = 0; l < layers_; ++l) {
    const double* o = layer(l);
    double total = 0;
    for (size_t e = 0; e < experts_; ++e) total += o[e];
    std::vector<double> load(experts_);
    for (size_t e = 0; e < experts_; ++e) load[e] = total > 0 ? o[e] / total : 0;
    s.load.push_back(std::move(load));
    s.dropped.push_back(o[experts_] > 0 ? o[experts_ + 1] / o[experts_] : 0);
  }
  return s;
}

}  // namespace meshmoe
