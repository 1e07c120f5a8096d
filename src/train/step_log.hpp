// What a training run reports (docs/user-guide.md "Files a run writes", "Training"): the step line on stdout and
// its row of metrics.h5 (losses, learning rate, gradient norm, tokens/s, MFU, the measured
// pipeline bubble, /time/<phase> max over ranks, per MoE layer the expert load and dropped
// fraction), the evaluation's line and rows, and the closing line. Rank 0 alone writes; every
// rank calls (the per-phase times and the bubble are reduced over the mesh).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/timers.hpp"
#include "data/batcher.hpp"
#include "data/dataset.hpp"
#include "decode/translation_eval.hpp"
#include "deck/deck.hpp"
#include "io/metrics.hpp"
#include "mesh/mesh.hpp"
#include "model/transformer.hpp"
#include "parallel/pipeline_executor.hpp"
#include "train/evaluate.hpp"
#include "train/step_stats.hpp"

namespace meshmoe {

// "1h05m" / "3m07s"
std::string format_eta(double seconds);

struct ModelParamCounts {
  int64_t total = 0, activated = 0;
};

class StepLog {
 public:
  // Into <dir>/metrics.h5. `timers` are the step's phase timers (reset at every logged step);
  // `flops_per_token` and `peak` (the mesh's sgemm ceiling) give the MFU.
  StepLog(const Deck& deck, std::string dir, Mesh& mesh, const ModelShape& shape, PhaseTimers& timers,
          PipelineExecutor& pipeline, double flops_per_token, double peak);
  ~StepLog();

  // Rank 0: metrics.h5, a new file, or on resume (start_step > 0) the existing one with the rows
  // after the checkpoint's step dropped (MetricsFile: in a copy renamed over it). A metrics file
  // HDF5 cannot open (e.g. cut short by a kill) is kept aside as metrics.h5.broken-<step> and a new
  // one started, so the run goes on; a readable one that cannot be continued (a full disk) is left
  // as it was and throws InputError.
  // The root attributes record how many examples the sequences truncate or drop (data/batcher.hpp),
  // the `languages` (a string array: the columns of the per-language series) and `lang_p`, the
  // probability of drawing each language (Batcher::language_probabilities), as the float array
  // lang_sampling_probability.
  void open(int64_t start_step, const std::vector<std::string>& languages, const std::string& version, const TooLong& train_too_long,
            const TooLong& valid_too_long, const std::vector<double>& lang_p);

  // Rank 0: the lines before the first step (run, mesh, threads, data and its too-long examples,
  // model, FLOPs, peak). `whole`: the model's parameters (unsharded) and those a token uses;
  // `rank_params`: this rank's share.
  void header(int blas_threads, const Dataset& train, const Dataset& valid, int vocab, const ModelParamCounts& whole,
              size_t rank_params, const TooLong& train_too_long, const TooLong& valid_too_long) const;

  // Collective: the step line and row; `tokens_per_s` over the logging interval, `eta` in seconds,
  // `lang_tokens` the run's target tokens per language so far (TrainProgress::lang_tokens).
  // A failed write throws AgreedFailure on every rank.
  void step(int64_t step, const StepStats& s, double tokens_per_s, double eta, const std::vector<int64_t>& lang_tokens);

  // Collective: the evaluation of `step` (begun at wall_seconds() `start`): its line and rows.
  void eval(int64_t step, const Evaluation& e, double start);

  // Collective: `scalars` into the row of `step` (the last logged step or a later one).
  void record(int64_t step, const std::map<std::string, double>& scalars);

  // Collective: the translation scores of `step` (begun at wall_seconds() `start`), one per
  // language of the dataset's table (sentences = 0: not translated): its line and rows.
  void bleu(int64_t step, const std::vector<TranslationScore>& scores, double start);

  // Rank 0: the closing line of a finished run.
  void done(double seconds) const;

 private:
  double pipeline_bubble();
  void write_step_row(int64_t step, const StepStats& s, double tokens_per_s, double eta, double mfu, double bubble,
                      const std::vector<double>& secs, const std::vector<int64_t>& lang_tokens);
  std::string moe_name(size_t l) const;
  template <class Write>
  void on_rank0_agreed(Write&& write);

  const Deck& deck_;
  const Config& cfg_;
  std::string dir_;
  Mesh& mesh_;
  const ModelShape& shape_;
  PhaseTimers& timers_;
  PipelineExecutor& pipeline_;
  double flops_per_token_, peak_;
  bool warned_mfu_ = false;  // the MFU-over-100% warning, once a run
  std::unique_ptr<MetricsFile> metrics_;  // rank 0 only
};

}  // namespace meshmoe
