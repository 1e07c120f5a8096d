#include "train/evaluate.hpp"

#include <algorithm>
#include <cmath>

#include "data/batcher.hpp"
#include "data/tokenizer.hpp"

namespace meshmoe {

double Evaluation::loss() const { return tokens > 0 ? loss_sum / tokens : std::nan(""); }

std::vector<double> Evaluation::lang_loss() const {
  std::vector<double> out(lang_tokens.size());
  for (size_t l = 0; l < out.size(); ++l) out[l] = lang_tokens[l] > 0 ? lang_loss_sum[l] / lang_tokens[l] : std::nan("");
  return out;
}

namespace {

// `b` followed by rows without a target (PAD tokens, mask 0, no language) up to `rows` rows.
Batch with_padding_rows(Batch b, int rows) {
  const size_t n = size_t(rows) * size_t(b.seq_len), ne = size_t(rows) * size_t(b.enc_len);
  b.inputs.resize(n, Tokenizer::kPad);
  b.targets.resize(n, Tokenizer::kPad);
  b.lang.resize(n, -1);
  b.mask.resize(n, 0.0f);
  b.segment.resize(n, 0);
  b.position.resize(n, 0);
  if (b.enc_len > 0) {
    b.enc_inputs.resize(ne, Tokenizer::kPad);
    b.enc_segment.resize(ne, 0);
    b.enc_position.resize(ne, 0);
  }
  b.rows = rows;
  return b;
}

}  // namespace

Evaluation evaluate(const Dataset& set, size_t languages, const Config& cfg, int64_t step, const Transformer<float>& model,
                    PipelineExecutor& pipeline, Mesh& mesh, const std::function<int()>& stop_requested, int batch_rows) {
  const int B = int(cfg.optim.batch_size), T = int(cfg.model.seq_len);
  const size_t L = languages;
  const bool whole_subset = cfg.eval.examples_per_language > 0;
  Batcher batcher(set, T, uint64_t(cfg.run.seed), !whole_subset, 1.0, cfg.model.arch);
  Evaluation e;
  std::vector<double> sums(2 + 2 * L, 0.0);  // loss, tokens, per-language loss, per-language tokens
  for (int64_t b = 0; whole_subset ? batcher.cursor().epoch == 0 : b < cfg.eval.batches; ++b) {
    if ((e.stopped = stop_requested())) return e;
    ++e.batches;
    const Batch batch = batch_rows > B ? with_padding_rows(batcher.next(B), batch_rows) : batcher.next(B);
    // Nothing to score (the batch is global: every rank skips it alike).
    if (std::find(batch.mask.begin(), batch.mask.end(), 1.0f) == batch.mask.end()) {
      ++e.empty_batches;
      continue;
    }
    const std::vector<Micro> micros = split_micro_batches(batch, int(cfg.optim.micro_batches), mesh.extent(Axis::Data),
                                                          mesh.coord(Axis::Data), uint64_t(cfg.run.seed), step, false, nullptr);
    for (size_t m = 0; m < micros.size(); ++m) {
      const Micro& mb = micros[m];
      const ForwardStats f = pipeline.forward_only(mb, int(m));
      if (!model.last_stage()) continue;
      sums[0] += f.ce_sum;
      sums[1] += f.mask_sum;
      const auto& per_token = model.loss().per_token_loss();
      for (size_t n = 0; n < per_token.size(); ++n) {
        const int lang = mb.rows.lang[n];
        if (lang < 0 || size_t(lang) >= L || mb.rows.mask[n] == 0) continue;
        sums[2 + size_t(lang)] += per_token[n];
        sums[2 + L + size_t(lang)] += 1;
      }
    }
  }
  mesh.axis(Axis::Pipe).all_reduce(sums.data(), sums.size(), Op::Sum);
  mesh.axis(Axis::Data).all_reduce(sums.data(), sums.size(), Op::Sum);
  e.loss_sum = sums[0];
  e.tokens = sums[1];
  e.lang_loss_sum.assign(sums.begin() + 2, sums.begin() + 2 + long(L));
  e.lang_tokens.assign(sums.begin() + 2 + long(L), sums.end());
  return e;
}

}  // namespace meshmoe
