// Validation (docs/user-guide.md "Training": every eval.every steps): forward only, through the pipeline
// stages in turn; the last stage scores the loss overall and per language.
#pragma once
#include <functional>
#include <vector>

#include "data/dataset.hpp"
#include "deck/config.hpp"
#include "mesh/mesh.hpp"
#include "parallel/pipeline_executor.hpp"

namespace meshmoe {

struct Evaluation {
  int stopped = 0;  // the stop request that interrupted it (stop_requested's reason), else 0
  int64_t batches = 0;
  int64_t empty_batches = 0;  // of them, without a target token: skipped (no forward)
  // Summed over the mesh: cross-entropy and target tokens, then per language (languages of the
  // dataset's table) the same two.
  double loss_sum = 0, tokens = 0;
  std::vector<double> lang_loss_sum, lang_tokens;

  double loss() const;                    // per target token; NaN without any
  std::vector<double> lang_loss() const;  // per language; NaN where a language has no token
};

// Collective over the mesh. The same sample each time: eval.batches seeded batches of `set`, or,
// with eval.examples_per_language, the subset once through (its last batch may repeat a few
// examples from the start). Before every batch the ranks agree on `stop_requested()` (collective,
// 0 = go on); a stop ends the evaluation at once. `batch_rows` > optim.batch_size: each batch of
// optim.batch_size sequences is followed by rows without a target up to batch_rows (a decoding mesh
// whose data ranks do not divide the batch: the same examples, their routing groups whole, as long
// as optim.batch_size x model.seq_len is a multiple of moe.group_size).
Evaluation evaluate(const Dataset& set, size_t languages, const Config& cfg, int64_t step, const Transformer<float>& model,
                    PipelineExecutor& pipeline, Mesh& mesh, const std::function<int()>& stop_requested,
                    int batch_rows = 0);

}  // namespace meshmoe
