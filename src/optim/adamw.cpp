#include "optim/adamw.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

#include "tensor/launch_rows.hpp"

namespace meshmoe {

AdamWOptions AdamWOptions::from_config(const Config& cfg) {
  return AdamWOptions{.beta1 = cfg.optim.beta1,
                      .beta2 = cfg.optim.beta2,
                      .eps = cfg.optim.eps,
                      .weight_decay = cfg.optim.weight_decay};
}

AdamW::AdamW(const ParamStore<float>& store, std::vector<size_t> owned, AdamWOptions opt)
    : Optimizer(store, std::move(owned)), opt_(opt) {
  for (size_t e : owned_) {
    infos_.push_back(store.infos()[e]);
    m_.emplace_back(infos_.back().size);  // zero (on the device: zeroed there)
    v_.emplace_back(infos_.back().size);
  }
  std::vector<AdamWPiece> pieces;
  for (size_t k = 0; k < infos_.size(); ++k) {
    const ParamInfo& p = infos_[k];
    const int32_t decayed = !p.no_weight_decay && opt_.weight_decay != 0.0;
    for (size_t i = 0; i < p.size; i += AdamWUpdatePieces::kPiece)
      pieces.push_back({.flat_offset = int64_t(p.flat_offset + i),
                        .length = int64_t(std::min<size_t>(AdamWUpdatePieces::kPiece, p.size - i)),
                        .m = m_[k].data() + i,
                        .v = v_[k].data() + i,
                        .decayed = decayed});
  }
  pieces_.assign(pieces.begin(), pieces.end());  // uploaded once (the moments' Buffers never move)
}

void AdamW::step(ParamStore<float>& store, double lr, int64_t t, double grad_scale) {
  check_layout(store, t);
  // Scalars in double, as torch computes them in Python; element-wise work in float, in torch's
  // operation order, each scalar rounded to float once.
  const double bc1 = 1.0 - std::pow(opt_.beta1, double(t));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(opt_.beta2, double(t)));
  const AdamWStepValues now{.grad_scale = float(grad_scale),
                            .decay = float(1.0 - lr * opt_.weight_decay),
                            .bc2s = float(bc2_sqrt),
                            .neg_step = float(-(lr / bc1))};
  if (!graphs_) return launch_update(store, now, nullptr);
  // run.cuda_graphs: the step's values uploaded (in order with the queued work) for the update to
  // read; the update captured at its first step, launched as a graph at every step.
  upload(step_values_, &now, 1);
  const std::array<const void*, 3> store_now{store.weights(), store.grads(), store.weights16()};
  if (!graph_) {
    begin_capture();
    launch_update(store, AdamWStepValues{}, step_values_.data());
    graph_ = end_capture();
    graph_store_ = store_now;
    graph_.uses(store.weights(), store.size() * sizeof(float));
    graph_.uses(store.grads(), store.size() * sizeof(float));
    if (store.weights16()) graph_.uses(store.weights16(), store.size() * sizeof(uint16_t));
    graph_.uses(pieces_.data(), pieces_.size() * sizeof(AdamWPiece));
    graph_.uses(step_values_.data(), sizeof(AdamWStepValues));
    for (size_t k = 0; k < m_.size(); ++k) {
      graph_.uses(m_[k].data(), m_[k].size() * sizeof(float));
      graph_.uses(v_[k].data(), v_[k].size() * sizeof(float));
    }
  }
  if (store_now != graph_store_) throw std::logic_error("AdamW: the update's graph was captured for another ParamStore");
  launch(graph_);
}

bool AdamW::set_update_graph(bool on) {
  graphs_ = on;
  graph_ = DeviceGraph();  // captured again at the next step
  step_values_.resize(on ? 1 : 0);
  return true;
}

// The update of every owned parameter, one launch (AdamWUpdatePieces), with the step's values
// `now`, or those at `step` (device memory) when the launch reads them there.
void AdamW::launch_update(ParamStore<float>& store, const AdamWStepValues& now, const AdamWStepValues* step) {
  const AdamWUpdateElement scalars{.x = nullptr,
                                   .m = nullptr,
                                   .v = nullptr,
                                   .g = nullptr,
                                   .grad_scale = now.grad_scale,
                                   .decay = now.decay,
                                   .b1 = float(opt_.beta1),
                                   .one_m_b1 = float(1.0 - opt_.beta1),
                                   .b2 = float(opt_.beta2),
                                   .one_m_b2 = float(1.0 - opt_.beta2),
                                   .bc2s = now.bc2s,
                                   .eps = float(opt_.eps),
                                   .neg_step = now.neg_step};
  for_each_row(int64_t(pieces_.size()),
               AdamWUpdatePieces{
                   .pieces = pieces_.data(),
                   .x = store.weights(),
                   .g = store.grads(),
                   .scalars = scalars,
                   .x16 = store.weights16(),
                   .step = step},
               AdamWUpdatePieces::kPiece);
}

std::vector<StateTensor> AdamW::state() {
  std::vector<StateTensor> s;
  for (size_t k = 0; k < infos_.size(); ++k) {
    const ParamInfo& p = infos_[k];
    s.push_back({.name = p.name + "/exp_avg",
                 .logical_shape = p.logical_shape,
                 .local_shape = p.local_shape,
                 .offset = p.offset,
                 .data = &m_[k]});
    s.push_back({.name = p.name + "/exp_avg_sq",
                 .logical_shape = p.logical_shape,
                 .local_shape = p.local_shape,
                 .offset = p.offset,
                 .data = &v_[k]});
  }
  return s;
}

}  // namespace meshmoe
