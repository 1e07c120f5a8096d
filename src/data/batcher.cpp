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
  b.enc_len = enc_len;
  const size_t elo = size_t(row_begin) * size_t(enc_len), ehi = size_t(row_end) * size_t(enc_len);
  if (enc_len > 0) {
    b.enc_inputs.assign(enc_inputs.begin() + elo, enc_inputs.begin() + ehi);
    b.enc_segment.assign(enc_segment.begin() + elo, enc_segment.begin() + ehi);
    b.enc_position.assign(enc_position.begin() + elo, enc_position.begin() + ehi);
  }
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

// Index of example e's first SEP, or its size when it has none.
static size_t sep_index(const DataSplit& s, size_t e, int64_t sep_id) {
  const size_t len = s.example_size(e), begin = s.example_begin(e);
  size_t j = 0;
  while (j < len && int64_t(s.token(begin + j)) != sep_id) ++j;
  return j;
}

EncDecFit fit_encdec_example(const DataSplit& s, size_t e, int seq_len, int64_t sep_id) {
  const size_t len = s.example_size(e), cap = size_t(seq_len);
  EncDecFit f;
  f.sep = sep_index(s, e, sep_id);
  f.target = len - std::min(len, f.sep + 1);
  // No SEP, no source (the tag), no target, or a target that does not fit: nothing to train on.
  if (f.sep == len || f.sep == 0 || f.target == 0 || f.target > cap) {
    f.drop = true;
    return f;
  }
  f.source = std::min(f.sep, cap);
  f.cut = f.sep - f.source;
  return f;
}

// The first example of a split without SEP, or -1.
static int64_t first_without_sep(const DataSplit& s, int64_t sep_id) {
  for (size_t e = 0; e < s.num_examples(); ++e)
    if (sep_index(s, e, sep_id) == s.example_size(e)) return int64_t(e);
  return -1;
}

TooLong count_too_long(const DataSplit& s, int seq_len, ModelArch arch, int64_t sep_id) {
  TooLong t;
  for (size_t e = 0; e < s.num_examples(); ++e) {
    if (arch == ModelArch::EncDec) {
      const EncDecFit f = fit_encdec_example(s, e, seq_len, sep_id);
      t.dropped += f.drop;
      t.truncated += f.truncated();
      continue;
    }
    const ExampleFit f = fit_example(s, e, seq_len);
    t.dropped += f.drop;
    t.truncated += f.truncated();
  }
  return t;
}

TooLong check_examples_fit(const Dataset& data, int seq_len, ModelArch arch) {
  if (arch == ModelArch::EncDec) {
    const int64_t e = first_without_sep(data.split(), data.info().sep_id);
    if (e >= 0)
      throw InputError(data.path() + " (split /" + data.split_name() + "): example " + std::to_string(e) +
                       " has no SEP token, but model.arch = \"encdec\" splits every example at SEP into the encoder's "
                       "source and the decoder's target: prepare translation pairs with `meshmoe prep gettext`");
  }
  const TooLong t = count_too_long(data.split(), seq_len, arch, data.info().sep_id);
  if (t.dropped == data.num_examples())
    throw InputError(data.path() + " (split /" + data.split_name() + "): every example's target is longer than " +
                     "model.seq_len + 1 = " + std::to_string(seq_len + 1) + " tokens, so every one would be dropped; " +
                     "raise model.seq_len (text from `meshmoe prep text`: prepare it with --max-len <= " +
                     std::to_string(seq_len + 1) + ")");
  return t;
}

Batcher::Batcher(const Dataset& data, int seq_len, uint64_t seed, bool shuffle, double temperature, ModelArch arch)
    : data_(data), seq_len_(seq_len), arch_(arch), seed_(seed), shuffle_(shuffle), temperature_(temperature) {
  if (seq_len < 1) throw InputError("batcher: seq_len must be >= 1 (got " + std::to_string(seq_len) + ")");
  if (!(temperature > 0)) throw InputError("batcher: the sampling temperature must be > 0");
  if (temperature != 1.0 && !shuffle) throw InputError("batcher: language sampling (temperature != 1) needs the shuffled order");
  if (data.num_tokens() == 0)
    throw InputError(data.path() + " (split /" + data.split_name() + "): holds no tokens; nothing to train or evaluate on");
  if (data.num_examples() > UINT32_MAX) throw InputError(data.path() + ": more than 2^32 examples");
  too_long_ = check_examples_fit(data, seq_len, arch);
  // n_l: the examples of each language that a sequence can hold (dropped ones are never drawn).
  const DataSplit& s = data.split();
  std::vector<double> n_l(data.info().languages.size(), 0.0);
  double n = 0;
  for (size_t e = 0; e < s.num_examples(); ++e)
    if (!drops(e)) n_l[size_t(s.lang[e])] += 1, n += 1;
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
    if (!drops(e)) queue[size_t(s.lang[e])].push_back(e);
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
    const uint32_t e = example_at_cursor();
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

bool Batcher::drops(size_t e) const {
  const DataSplit& s = data_.split();
  return arch_ == ModelArch::EncDec ? fit_encdec_example(s, e, seq_len_, data_.info().sep_id).drop
                                    : fit_example(s, e, seq_len_).drop;
}

uint32_t Batcher::example_at_cursor() {
  if (cursor_.position == order_.size()) set_epoch(cursor_.epoch + 1);
  return order_[cursor_.position];
}

void Batcher::pack_encdec_row(Row& enc, Row& dec, std::vector<int32_t>& dec_inputs) {
  const DataSplit& s = data_.split();
  const size_t cap = size_t(seq_len_);
  enc.tok.assign(cap, Tokenizer::kPad);
  enc.seg.assign(cap, 0);
  enc.pos.assign(cap, 0);
  dec_inputs.assign(cap, Tokenizer::kPad);
  dec.tok.assign(cap, Tokenizer::kPad);
  dec.msk.assign(cap, uint8_t(0));
  dec.lng.assign(cap, -1);
  dec.seg.assign(cap, 0);
  dec.pos.assign(cap, 0);
  size_t enc_fill = 0, dec_fill = 0;
  int32_t segment = 0;
  while (enc_fill < cap && dec_fill < cap) {
    const uint32_t e = example_at_cursor();
    const EncDecFit fit = fit_encdec_example(s, e, seq_len_, data_.info().sep_id);
    if (fit.drop) {
      ++cursor_.position;
      continue;
    }
    if (segment > 0 && (enc_fill + fit.source > cap || dec_fill + fit.target > cap)) break;
    const size_t begin = s.example_begin(e);
    for (size_t j = 0; j < fit.source; ++j) {  // <lang> source, its end cut when too long
      enc.tok[enc_fill + j] = int32_t(s.token(begin + j));
      enc.seg[enc_fill + j] = segment;
      enc.pos[enc_fill + j] = int32_t(j);
    }
    const size_t target = begin + fit.sep + 1;
    for (size_t j = 0; j < fit.target; ++j) {  // inputs BOS target, targets target EOS
      dec_inputs[dec_fill + j] = j == 0 ? int32_t(data_.info().bos_id) : int32_t(s.token(target + j - 1));
      dec.tok[dec_fill + j] = int32_t(s.token(target + j));
      dec.msk[dec_fill + j] = s.loss_mask[target + j];
      dec.lng[dec_fill + j] = s.lang[e];
      dec.seg[dec_fill + j] = segment;
      dec.pos[dec_fill + j] = int32_t(j);
    }
    enc_fill += fit.source;
    dec_fill += fit.target;
    ++segment;
    ++cursor_.position;
  }
  for (size_t j = enc_fill; j < cap; ++j) enc.seg[j] = segment, enc.pos[j] = int32_t(j - enc_fill);
  for (size_t j = dec_fill; j < cap; ++j) dec.seg[j] = segment, dec.pos[j] = int32_t(j - dec_fill);
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
  if (arch_ == ModelArch::EncDec) {
    b.enc_len = seq_len_;
    b.enc_inputs.resize(size_t(b.rows) * L);
    b.enc_segment.resize(size_t(b.rows) * L);
    b.enc_position.resize(size_t(b.rows) * L);
    Row enc;
    std::vector<int32_t> dec_inputs;
    for (int r = 0; r < batch_size; ++r) {  // every row, as below
      pack_encdec_row(enc, row, dec_inputs);
      if (r < row_begin || r >= row_end) continue;
      const size_t o = size_t(r - row_begin) * L;
      std::copy(enc.tok.begin(), enc.tok.end(), b.enc_inputs.begin() + long(o));
      std::copy(enc.seg.begin(), enc.seg.end(), b.enc_segment.begin() + long(o));
      std::copy(enc.pos.begin(), enc.pos.end(), b.enc_position.begin() + long(o));
      std::copy(dec_inputs.begin(), dec_inputs.end(), b.inputs.begin() + long(o));
      std::copy(row.tok.begin(), row.tok.end(), b.targets.begin() + long(o));
      std::copy(row.lng.begin(), row.lng.end(), b.lang.begin() + long(o));
      std::copy(row.seg.begin(), row.seg.end(), b.segment.begin() + long(o));
      std::copy(row.pos.begin(), row.pos.end(), b.position.begin() + long(o));
      for (size_t j = 0; j < L; ++j) b.mask[o + j] = float(row.msk[j]);
    }
    return b;
  }
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
