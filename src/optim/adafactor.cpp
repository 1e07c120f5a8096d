#include "optim/adafactor.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "tensor/launch.hpp"
#include "tensor/launch_rows.hpp"
#include "optim/grad_clip.hpp"
#include "optim/optimizer_bodies.hpp"

namespace meshmoe {

AdafactorOptions AdafactorOptions::from_config(const Config& cfg) {
  return AdafactorOptions{cfg.optim.adafactor_decay, cfg.optim.adafactor_eps, cfg.optim.adafactor_clip};
}

namespace {
bool split(const ParamInfo& p, size_t dim) { return p.local_shape[dim] < p.logical_shape[dim]; }

std::vector<int64_t> drop_dim(std::vector<int64_t> s, size_t dim) {
  s.erase(s.begin() + ptrdiff_t(dim));
  return s;
}
}  // namespace

Adafactor::Adafactor(const ParamStore<float>& store, std::vector<size_t> owned, AdafactorOptions opt, DimReduce reduce)
    : Optimizer(store, std::move(owned)), opt_(opt), reduce_(std::move(reduce)) {
  for (size_t e : owned_) {
    Entry en;
    en.info = store.infos()[e];
    const auto& s = en.info.local_shape;
    if (factored(en.info)) {
      en.rows = size_t(s[s.size() - 2]);
      en.cols = size_t(s[s.size() - 1]);
      en.batch = en.rows * en.cols == 0 ? 0 : en.info.size / (en.rows * en.cols);
      en.v_row.resize(en.batch * en.rows);  // zero (on the device: zeroed there)
      en.v_col.resize(en.batch * en.cols);
    } else {
      en.v.resize(en.info.size);
    }
    row_sums_.resize(std::max(row_sums_.size(), en.batch * en.rows));
    col_sums_.resize(std::max(col_sums_.size(), en.batch * en.cols));
    row_moment_sums_.resize(std::max(row_moment_sums_.size(), en.batch));
    u_.resize(std::max(u_.size(), en.info.size));
    partials_.resize(std::max(partials_.size(), size_t(sum_squares_chunks<double>(en.info.size))));
    entries_.push_back(std::move(en));
  }
  sum_u2_.resize(entries_.size());
  rms_over_d_.resize(entries_.size());
  step_.resize(entries_.size());
}

void Adafactor::reduce(const ParamInfo& p, int dim, double* buf, size_t n) const {
  if (!reduce_)
    throw std::logic_error("Adafactor: parameter " + p.name + " is split along dim " + std::to_string(dim) +
                           " but no DimReduce was given");
  reduce_(p, dim, buf, n);
}

void Adafactor::step(ParamStore<float>& store, double lr, int64_t t, double grad_scale) {
  check_layout(store, t);
  scale_grads(store, owned_, grad_scale);
  const double beta = 1.0 - std::pow(double(t), -opt_.decay);
  const double eps1 = opt_.eps1;
  for (size_t k = 0; k < entries_.size(); ++k) {
    Entry& en = entries_[k];
    const ParamInfo& p = en.info;
    float* x = store.weights() + p.flat_offset;  // x [local_shape]
    const float* g = store.grads() + p.flat_offset;
    double* u = u_.data();  // U [local_shape]
    if (factored(p)) {
      const size_t nd = p.local_shape.size(), B = en.batch, n = en.rows, m = en.cols;
      const double n_logical = double(p.logical_shape[nd - 2]), m_logical = double(p.logical_shape[nd - 1]);
      // g [B, n, m]; row sums [B, n] over m, column sums [B, m] over n
      double *row = row_sums_.data(), *col = col_sums_.data(), *rsum = row_moment_sums_.data();
      for_each_index(int64_t(B * n), AdafactorRowSumSquares{g, row, int64_t(m)}, int64_t(m));
      for_each_row(int64_t(B) * AdafactorColumnSumSquares::blocks(int64_t(m)),
                   AdafactorColumnSumSquares{.g = g, .col = col, .n = int64_t(n), .m = int64_t(m)},
                   int64_t(n) * AdafactorColumnSumSquares::kColumns);
      if (split(p, nd - 1)) reduce(p, int(nd - 1), row, B * n);
      if (split(p, nd - 2)) reduce(p, int(nd - 2), col, B * m);
      for_each_index(int64_t(B * n), AdafactorFactorMoment{.acc = en.v_row.data(), .sum = row, .beta = beta,
                                                           .count = m_logical, .eps1 = eps1});
      for_each_index(int64_t(B * m), AdafactorFactorMoment{.acc = en.v_col.data(), .sum = col, .beta = beta,
                                                           .count = n_logical, .eps1 = eps1});
      for_each_index(int64_t(B), AdafactorRowMomentSum{en.v_row.data(), rsum, int64_t(n)}, int64_t(n));
      if (split(p, nd - 2)) reduce(p, int(nd - 2), rsum, B);
      for_each_row(int64_t(B * n),
                   AdafactorFactoredUpdateRow{.g = g,
                                              .v_row = en.v_row.data(),
                                              .v_col = en.v_col.data(),
                                              .rsum = rsum,
                                              .u = u,
                                              .n = int64_t(n),
                                              .m = int64_t(m),
                                              .n_logical = n_logical},
                   int64_t(m));
    } else {
      for_each_index(int64_t(p.size),
                     AdafactorUnfactoredUpdateElement{.g = g, .v = en.v.data(), .u = u, .beta = beta, .eps1 = eps1});
    }
    // Update clipping (S&S section 6): RMS over the whole logical parameter, on the device (no
    // wait for the sum: the host never reads it; a split block adds it over its group by DimReduce).
    double* sum_u2 = sum_u2_.data() + k;
    queue_sum_squares(u, p.size, partials_.data());
    for_each_index(1, AddChunkSums{partials_.data(), sum_squares_chunks<double>(p.size), sum_u2});
    double count = 1.0;
    for (size_t d = 0; d < p.local_shape.size(); ++d) {
      if (split(p, d)) reduce(p, int(d), sum_u2, 1);
      count *= double(p.logical_shape[d]);
    }
    for_each_index(1, AdafactorClipFactor{.sum_u2 = sum_u2,
                                          .count = count,
                                          .clip = opt_.clip,
                                          .lr = lr,
                                          .rms_over_d = rms_over_d_.data() + k,
                                          .step = step_.data() + k});
    uint16_t* x16 = store.weights16() ? store.weights16() + p.flat_offset : nullptr;
    for_each_index(int64_t(p.size), AdafactorApplyElement{x, u, step_.data() + k, x16});
  }
}

std::vector<double> Adafactor::last_rms_over_d() const { return download(rms_over_d_); }

std::vector<StateTensor> Adafactor::state() {
  std::vector<StateTensor> s;
  for (Entry& en : entries_) {
    const ParamInfo& p = en.info;
    if (factored(p)) {
      const size_t nd = p.local_shape.size();
      s.push_back({.name = p.name + "/v_row",
                   .logical_shape = drop_dim(p.logical_shape, nd - 1),
                   .local_shape = drop_dim(p.local_shape, nd - 1),
                   .offset = drop_dim(p.offset, nd - 1),
                   .data = &en.v_row});
      s.push_back({.name = p.name + "/v_col",
                   .logical_shape = drop_dim(p.logical_shape, nd - 2),
                   .local_shape = drop_dim(p.local_shape, nd - 2),
                   .offset = drop_dim(p.offset, nd - 2),
                   .data = &en.v_col});
    } else {
      s.push_back({.name = p.name + "/v",
                   .logical_shape = p.logical_shape,
                   .local_shape = p.local_shape,
                   .offset = p.offset,
                   .data = &en.v});
    }
  }
  return s;
}

}  // namespace meshmoe
