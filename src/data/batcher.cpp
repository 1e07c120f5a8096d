#include "data/batcher.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.hpp"
#include "core/philox.hpp"

namespace meshmoe {

Batch Batch::slice(int row_begin, int row_end) const {
  if (row_begin < 0 || row_end > rows || row_begin > row_end)
    throw Error("Batch::slice: rows [" + std::to_string(row_begin) + ", " + std::to_string(row_end) +
                ") outside a batch of " + std::to_string(rows));
  Batch b;
  b.rows = row_end - row_begin;
  b.seq_len = seq_len;
  const size_t lo = size_t(row_begin) * size_t(seq_len), hi = size_t(row_end) * size_t(seq_len);
  b.inputs.assign(inputs.begin() + lo, inputs.begin() + hi);
  b.targets.assign(targets.begin() + lo, targets.begin() + hi);
  b.lang.assign(lang.begin() + lo, lang.begin() + hi);
  b.mask.assign(mask.begin() + lo, mask.begin() + hi);
  b.segment.assign(segment.begin() + lo, segment.begin() + hi);
  b.position.assign(position.begin() + lo, position.begin() + hi);
  return b;
}

ExampleFit fit_example(const DataSplit& s, size_t e, int seq_len) {
  const size_t len = s.example_size(e), begin = s.example_begin(e), cap = size_t(seq_len) + 1;
  ExampleFit f;
  f.head = len;
  if (len <= cap) return f;
  // The token before the first target predicts it: from there on, everything must stay.
  size_t first_target = 1;
  while (first_target < len && s.loss_mask[begin + first_target] == 0) ++first_target;
  if (first_target == len) {  // no target at all: nothing to protect, keep the head
    f.head = cap;
    f.cut = len - cap;
    return f;
  }
  const size_t tail = len - (first_target - 1);
  if (first_target == 1 || tail + 1 > cap) {  // the target (with the tag before it) does not fit
    f.drop = true;
    return f;
  }
  f.head = cap - tail;
  f.cut = len - cap;
  return f;
}

TooLong count_too_long(const DataSplit& s, int seq_len) {
  TooLong t;
  for (size_t e = 0; e < s.num_examples(); ++e) {
    const ExampleFit f = fit_example(s, e, seq_len);
    t.dropped += f.drop;
    t.truncated += f.truncated();
  }
  return t;
}

TooLong check_examples_fit(const Dataset& data, int seq_len) {
  const TooLong t = count_too_long(data.split(), seq_len);
  if (t.dropped == data.num_examples())
    throw InputError(data.path() + " (split /" + data.split_name() + "): every example's target is longer than " +
                     "model.seq_len + 1 = " + std::to_string(seq_len + 1) + " tokens, so every one would be dropped; " +
                     "raise model.seq_len (text from `meshmoe prep text`: prepare it with --max-len <= " +
                     std::to_string(seq_len + 1) + ")");
  return t;
}

Batcher::Batcher(const Dataset& data, int seq_len, uint64_t seed, bool shuffle, double temperature)
    : data_(data), seq_len_(seq_len), seed_(seed), shuffle_(shuffle), temperature_(temperature) {
  if (seq_len < 1) throw InputError("batcher: seq_len must be >= 1 (got " + std::to_string(seq_len) + ")");
  if (!(temperature > 0)) throw InputError("batcher: the sampling temperature must be > 0");
  if (temperature != 1.0 && !shuffle) throw InputError("batcher: language sampling (temperature != 1) needs the shuffled order");
  if (data.num_tokens() == 0)
    throw InputError(data.path() + " (split /" + data.split_name() + "): holds no tokens; nothing to train or evaluate on");
  if (data.num_examples() > UINT32_MAX) throw InputError(data.path() + ": more than 2^32 examples");
  too_long_ = check_examples_fit(data, seq_len);
  // n_l: the examples of each language that a sequence can hold (dropped ones are never drawn).
  const DataSplit& s = data.split();
  std::vector<double> n_l(data.info().languages.size(), 0.0);
  double n = 0;
  for (size_t e = 0; e < s.num_examples(); ++e)
    if (!fit_example(s, e, seq_len).drop) n_l[size_t(s.lang[e])] += 1, n += 1;
  lang_p_.assign(n_l.size(), 0.0);
  double z = 0;
  for (size_t l = 0; l < n_l.size(); ++l) z += lang_p_[l] = n_l[l] > 0 ? std::pow(n_l[l] / n, 1.0 / temperature) : 0.0;
  for (double& p : lang_p_) p /= z;
  set_epoch(0);
}

std::vector<uint32_t> Batcher::epoch_order(uint64_t epoch) const {
  return temperature_ == 1.0 ? shuffled_order(epoch) : language_draws(epoch);
}

// Each draw i of the epoch: a language by inverse CDF of p_l at a 53-bit uniform from Philox
// keyed by (seed, epoch, RngPurpose::LanguageSample, i), then the language's next example in the
// epoch's shuffled order (cyclic).
std::vector<uint32_t> Batcher::language_draws(uint64_t epoch) const {
  const DataSplit& s = data_.split();
  const size_t L = lang_p_.size();
  std::vector<std::vector<uint32_t>> queue(L);
  for (uint32_t e : shuffled_order(epoch))
    if (!fit_example(s, e, seq_len_).drop) queue[size_t(s.lang[e])].push_back(e);
  std::vector<double> cdf(L);
  std::partial_sum(lang_p_.begin(), lang_p_.end(), cdf.begin());
  size_t last = L;  // the last language that can be drawn: a u beyond cdf's rounded end goes there
  while (last > 0 && queue[last - 1].empty()) --last;
  std::vector<size_t> taken(L, 0);
  const Rng rng{seed_, uint32_t(epoch), 0, RngPurpose::LanguageSample};
  std::vector<uint32_t> order(s.num_examples());
  for (size_t i = 0; i < order.size(); ++i) {
    const auto b = rng.bits(i);
    const double u = double((uint64_t(b[0]) << 32 | b[1]) >> 11) * 0x1p-53;  // [0, 1)
    size_t l = size_t(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    if (l >= last) l = last - 1;
    order[i] = queue[l][taken[l]++ % queue[l].size()];
  }
  return order;
}

std::vector<uint32_t> Batcher::shuffled_order(uint64_t epoch) const {
  const size_t n = data_.num_examples();
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  if (!shuffle_) return order;
  // A uniformly random permutation: sort by a 64-bit Philox key per example (ties by index).
  const Rng rng{seed_, uint32_t(epoch), 0, RngPurpose::DataShuffle};
  std::vector<uint64_t> key(n);
  for (size_t i = 0; i < n; ++i) {
    const auto b = rng.bits(i);
    key[i] = uint64_t(b[0]) << 32 | b[1];
  }
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return key[a] != key[b] ? key[a] < key[b] : a < b; });
  return order;
}

void Batcher::set_epoch(uint64_t epoch) {
  cursor_ = DataCursor{epoch, 0};
  order_ = epoch_order(epoch);
}

void Batcher::restore(DataCursor c) {
  if (c.position > data_.num_examples())
    throw InputError("batcher: data cursor position " + std::to_string(c.position) + " beyond the " +
                     std::to_string(data_.num_examples()) + " examples of " + data_.path() +
                     " (was the checkpoint written with another dataset?)");
  if (c.epoch != cursor_.epoch) order_ = epoch_order(c.epoch);
  cursor_ = c;
}

void Batcher::pack_row(Row& row) {
  const DataSplit& s = data_.split();
  const size_t cap = size_t(seq_len_) + 1;
  row.tok.assign(cap, Tokenizer::kPad);
  row.msk.assign(cap, uint8_t(0));
  row.lng.assign(cap, -1);
  row.seg.assign(cap, 0);
  row.pos.assign(cap, 0);
  size_t fill = 0;
  int32_t segment = 0;
  while (fill < cap) {
    if (cursor_.position == order_.size()) set_epoch(cursor_.epoch + 1);
    const uint32_t e = order_[cursor_.position];
    const ExampleFit fit = fit_example(s, e, seq_len_);
    if (fit.drop) {
      ++cursor_.position;
      continue;
    }
    const size_t take = fit.kept(s.example_size(e)), begin = s.example_begin(e);
    if (fill > 0 && fill + take > cap) break;  // does not fit: PAD the tail, start the next row with it
    for (size_t j = 0; j < take; ++j) {
      const size_t from = begin + j + (j < fit.head ? 0 : fit.cut);
      row.tok[fill + j] = int32_t(s.token(from));
      row.msk[fill + j] = s.loss_mask[from];
      row.lng[fill + j] = s.lang[e];
      row.seg[fill + j] = segment;
      row.pos[fill + j] = int32_t(j);
    }
    fill += take;
    ++segment;
    ++cursor_.position;
  }
  for (size_t j = fill; j < cap; ++j) {  // the PAD tail: a segment of its own
    row.seg[j] = segment;
    row.pos[j] = int32_t(j - fill);
  }
}

Batch Batcher::next(int batch_size) { return next(batch_size, 0, batch_size); }

Batch Batcher::next(int batch_size, int row_begin, int row_end) {
  if (batch_size < 1 || row_begin < 0 || row_end > batch_size || row_begin > row_end)
    throw Error("Batcher::next: rows [" + std::to_string(row_begin) + ", " + std::to_string(row_end) +
                ") of a batch of " + std::to_string(batch_size));
  const size_t L = size_t(seq_len_);
  Batch b;
  b.rows = row_end - row_begin;
  b.seq_len = seq_len_;
  b.inputs.resize(size_t(b.rows) * L);
  b.targets.resize(size_t(b.rows) * L);
  b.lang.resize(size_t(b.rows) * L);
  b.mask.resize(size_t(b.rows) * L);
  b.segment.resize(size_t(b.rows) * L);
  b.position.resize(size_t(b.rows) * L);
  Row row;
  // Every row of the global batch is packed (the cursor must advance the same on every rank).
  for (int r = 0; r < batch_size; ++r) {
    pack_row(row);
    if (r < row_begin || r >= row_end) continue;
    const size_t o = size_t(r - row_begin) * L;
    for (size_t j = 0; j < L; ++j) {
      const bool same_example = row.seg[j + 1] == row.seg[j];
      b.inputs[o + j] = row.tok[j];
      b.targets[o + j] = row.tok[j + 1];
      b.mask[o + j] = same_example ? float(row.msk[j + 1]) : 0.0f;
      b.lang[o + j] = row.lng[j + 1];
      b.segment[o + j] = row.seg[j];
      b.position[o + j] = row.pos[j];
    }
  }
  return b;
}

}  // namespace meshmoe
