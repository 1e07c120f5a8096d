#include "optim/optimizer.hpp"

#include <stdexcept>

#include "core/error.hpp"
#include "tensor/launch.hpp"
#include "tensor/launch_rows.hpp"
#include "optim/adafactor.hpp"
#include "optim/adamw.hpp"
#include "optim/optimizer_bodies.hpp"

namespace meshmoe {

Optimizer::Optimizer(const ParamStore<float>& store, std::vector<size_t> owned)
    : owned_(std::move(owned)), store_size_(store.size()) {
  if (!store.allocated()) throw std::logic_error("optimizer built before ParamStore::allocate()");
  for (size_t e : owned_)
    if (e >= store.infos().size()) throw std::logic_error("optimizer: owned entry out of range");
}

void Optimizer::check_layout(const ParamStore<float>& store, int64_t t) const {
  if (store.size() != store_size_) throw std::logic_error("optimizer: ParamStore layout changed after construction");
  if (t < 1) throw std::logic_error("optimizer: step number t must be >= 1 (1-based), got " + std::to_string(t));
}

template <typename T>
int64_t sum_squares_chunks(size_t n) {
  return (int64_t(n) + SumSquaresChunk<T>::kChunk - 1) / SumSquaresChunk<T>::kChunk;
}

template <typename T>
void queue_sum_squares(const T* v, size_t n, double* partials) {
  for_each_row(sum_squares_chunks<T>(n), SumSquaresChunk<T>{v, int64_t(n), partials}, SumSquaresChunk<T>::kChunk);
}

template <typename T>
double sum_squares(const T* v, size_t n, Buffer<double>& partials) {
  const int64_t chunks = sum_squares_chunks<T>(n);
  if (partials.size() < size_t(chunks)) partials.resize(size_t(chunks));
  queue_sum_squares(v, n, partials.data());
  std::vector<double> host;
  const std::span<const double> sums = host_view(partials, host);  // a transfer point: the chunk sums
  double s = 0.0;
  for (int64_t c = 0; c < chunks; ++c) s += sums[size_t(c)];
  return s;
}
template int64_t sum_squares_chunks<float>(size_t);
template int64_t sum_squares_chunks<double>(size_t);
template void queue_sum_squares(const float*, size_t, double*);
template void queue_sum_squares(const double*, size_t, double*);
template double sum_squares(const float*, size_t, Buffer<double>&);
template double sum_squares(const double*, size_t, Buffer<double>&);

std::vector<size_t> all_entries(const ParamStore<float>& store) {
  std::vector<size_t> e(store.infos().size());
  for (size_t i = 0; i < e.size(); ++i) e[i] = i;
  return e;
}

std::unique_ptr<Optimizer> make_optimizer(const Config& cfg, const ParamStore<float>& store, std::vector<size_t> owned,
                                          DimReduce reduce) {
  if (cfg.optim.name == OptimizerKind::AdamW) return std::make_unique<AdamW>(store, std::move(owned), AdamWOptions::from_config(cfg));
  if (cfg.optim.name == OptimizerKind::Adafactor)
    return std::make_unique<Adafactor>(store, std::move(owned), AdafactorOptions::from_config(cfg), std::move(reduce));
  throw std::logic_error("make_optimizer: an optim.name without an optimizer");
}

}  // namespace meshmoe
