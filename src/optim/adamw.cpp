#include "optim/adamw.hpp"

#include <algorithm>
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
  const float decay = float(1.0 - lr * opt_.weight_decay);
  const float b1 = float(opt_.beta1), one_m_b1 = float(1.0 - opt_.beta1);
  const float b2 = float(opt_.beta2), one_m_b2 = float(1.0 - opt_.beta2);
  const float bc2s = float(bc2_sqrt), eps = float(opt_.eps), neg_step = float(-(lr / bc1));
  const AdamWUpdateElement scalars{.x = nullptr,
                                   .m = nullptr,
                                   .v = nullptr,
                                   .g = nullptr,
                                   .grad_scale = float(grad_scale),
                                   .decay = decay,
                                   .b1 = b1,
                                   .one_m_b1 = one_m_b1,
                                   .b2 = b2,
                                   .one_m_b2 = one_m_b2,
                                   .bc2s = bc2s,
                                   .eps = eps,
                                   .neg_step = neg_step};
  for_each_row(int64_t(pieces_.size()),
               AdamWUpdatePieces{
                   .pieces = pieces_.data(),
                   .x = store.weights(),
                   .g = store.grads(),
                   .scalars = scalars,
                   .x16 = store.weights16()},
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
