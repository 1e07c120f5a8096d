#include "train/step_stats.hpp"

#include <cmath>

#include "model/moe/moe_layer.hpp"

namespace meshmoe {

void StepSums::add(const ForwardStats& f, const std::vector<const MoeLayer<float>*>& moe, size_t first_moe_layer) {
  ce_ += f.ce_sum;
  mask_ += f.mask_sum;
  aux_ += f.aux_sum;
  z_ += f.z_sum;
  soft_ += f.soft_sum;
  for (size_t l = 0; l < moe.size(); ++l) {
    MoeLayerSums& o = layers_[first_moe_layer + l];
    const MoeStats& ms = moe[l]->stats();
    for (size_t e = 0; e < o.load.size(); ++e) o.load[e] += double(ms.load[e]);
    for (size_t e = 0; e < ms.expert_dropped.size(); ++e) {
      o.expert_dropped[e] += double(ms.expert_dropped[e]);
      o.expert_rerouted[e] += double(ms.expert_rerouted[e]);
      o.expert_declined[e] += double(ms.expert_declined[e]);
    }
    o.wanted += double(ms.wanted);
    o.dropped += double(ms.dropped);
    o.rerouted += double(ms.rerouted);
    o.declined += double(ms.declined);
    o.second_choices += double(ms.second_choices);
    o.tokens += double(ms.tokens);
    o.entropy += ms.entropy_sum;
    o.capacity += double(ms.capacity);
    o.bias_max_abs += ms.bias_max_abs;
    for (size_t j = 0; j < ms.experts_per_token.size(); ++j) o.experts_per_token[j] += double(ms.experts_per_token[j]);
    o.forwards += 1;
  }
}

void StepSums::all_reduce(Comm& pipe, Comm& data) {
  std::vector<double*> fields{&ce_, &mask_, &aux_, &z_, &soft_};
  for (MoeLayerSums& l : layers_) {
    for (std::vector<double>* v : {&l.load, &l.expert_dropped, &l.expert_rerouted, &l.expert_declined})
      for (double& x : *v) fields.push_back(&x);
    for (double& x : l.experts_per_token) fields.push_back(&x);
    for (double* x : {&l.wanted, &l.dropped, &l.rerouted, &l.declined, &l.second_choices, &l.tokens, &l.entropy,
                      &l.capacity, &l.forwards, &l.bias_max_abs})
      fields.push_back(x);
  }
  std::vector<double> buf(fields.size());
  for (size_t i = 0; i < fields.size(); ++i) buf[i] = *fields[i];
  pipe.all_reduce(buf.data(), buf.size(), Op::Sum);
  data.all_reduce(buf.data(), buf.size(), Op::Sum);
  for (size_t i = 0; i < fields.size(); ++i) *fields[i] = buf[i];
}

StepStats StepSums::stats(double tokens, double groups) const {
  StepStats s;
  s.loss = mask_ > 0 ? ce_ / mask_ : std::nan("");
  s.soft_loss = mask_ > 0 ? soft_ / mask_ : std::nan("");
  s.aux = layers_.empty() ? 0 : aux_ / groups;
  s.z = layers_.empty() ? 0 : z_ / tokens;
  for (const MoeLayerSums& o : layers_) {
    double total = 0;
    for (double x : o.load) total += x;
    std::vector<double> load(o.load.size());
    for (size_t e = 0; e < load.size(); ++e) load[e] = total > 0 ? o.load[e] / total : 0;
    s.load.push_back(std::move(load));
    s.load_count.push_back(o.load);
    MoeLayerStats m;
    m.dropped = o.wanted > 0 ? o.dropped / o.wanted : 0;
    m.rerouted = o.wanted > 0 ? o.rerouted / o.wanted : 0;
    m.declined = o.second_choices > 0 ? o.declined / o.second_choices : 0;
    m.entropy = o.tokens > 0 ? o.entropy / o.tokens : 0;
    m.capacity = o.forwards > 0 ? o.capacity / o.forwards : 0;
    m.bias_max_abs = o.forwards > 0 ? o.bias_max_abs / o.forwards : 0;
    for (const double t : o.experts_per_token) m.experts_per_token.push_back(o.tokens > 0 ? t / o.tokens : 0);
    m.wanted = o.wanted;
    m.expert_dropped = o.expert_dropped;
    m.expert_rerouted = o.expert_rerouted;
    m.expert_declined = o.expert_declined;
    s.moe.push_back(m);
  }
  return s;
}

}  // namespace meshmoe
