#include "train/step_log.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>

#include "core/error.hpp"
#include "mesh/agree.hpp"
#include "mesh/comm.hpp"
#include "parallel/pipeline_schedule.hpp"

namespace meshmoe {

namespace {

// The phases timed in a step, written to metrics.h5 as /time/<phase> (max over ranks). Nested:
// tensor_allreduce happens inside attention and dense_ffn; gate, dispatch, expert and combine are
// the MoE layer's stages, moe_alltoall (expert_axis = data) is inside dispatch and combine,
// moe_allreduce (experts over tensor, Switch 5.5 expert hidden split) inside expert or combine.
// grad_overlap is the backward's part of the overlapped gradient sum, grad_allreduce the wait after it.
constexpr const char* kPhases[] = {"attention", "dense_ffn", "gate", "dispatch", "expert", "combine",
                                   "moe_alltoall", "moe_allreduce",
                                   "head_loss", "tensor_allreduce", "pipeline_wait", "pipeline_recompute",
                                   "grad_overlap", "grad_allreduce", "optimizer", "teacher_forward"};

}  // namespace

std::string format_eta(double seconds) {
  char buf[32];
  const long s = long(std::max(0.0, seconds));
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  return buf;
}

StepLog::StepLog(const Deck& deck, std::string dir, Mesh& mesh, const ModelShape& shape, PhaseTimers& timers,
                 PipelineExecutor& pipeline, double flops_per_token, double peak)
    : deck_(deck),
      cfg_(deck.cfg),
      dir_(std::move(dir)),
      mesh_(mesh),
      shape_(shape),
      timers_(timers),
      pipeline_(pipeline),
      flops_per_token_(flops_per_token),
      peak_(peak) {}

StepLog::~StepLog() = default;

namespace {
// An HDF5 file with a /step dataset that opens for reading.
bool readable_metrics(const std::string& path) {
  try {
    return h5::File::open(path).is_dataset("step");
  } catch (const std::exception&) {
    return false;
  }
}
}  // namespace

void StepLog::open(int64_t start_step, const std::vector<std::string>& languages, const std::string& version,
                   const TooLong& train_too_long, const TooLong& valid_too_long, const std::vector<double>& lang_p) {
  const std::map<std::string, std::string> attrs{{"run_name", cfg_.run.name},
                                                 {"mesh", mesh_.shape().str()},
                                                 {"data_path", cfg_.data.path},
                                                 {"version", version},
                                                 {"train_flops_per_token", std::to_string(flops_per_token_)},
                                                 {"sgemm_peak_flops", std::to_string(peak_)},
                                                 {"train_examples_truncated", std::to_string(train_too_long.truncated)},
                                                 {"train_examples_dropped", std::to_string(train_too_long.dropped)},
                                                 {"valid_examples_truncated", std::to_string(valid_too_long.truncated)},
                                                 {"valid_examples_dropped", std::to_string(valid_too_long.dropped)}};
  const MetricsArrayAttrs arrays{.strings = {{"languages", languages}}, .numbers = {{"lang_sampling_probability", lang_p}}};
  const std::string path = dir_ + "/metrics.h5";
  std::optional<int64_t> after;
  if (start_step > 0) after = start_step;
  try {
    metrics_ = std::make_unique<MetricsFile>(path, deck_.effective_toml, attrs, after, arrays);
  } catch (const std::exception& e) {
    // A readable history is never renamed or replaced (a disk still full must not cost it): the
    // run stops, the file as it was. Only a file HDF5 cannot open is kept aside for a new one.
    if (!after || readable_metrics(path))
      throw InputError("cannot continue " + path + " (" + e.what() + "); it is left as it was: free space on its file "
                       "system, or move it away to start a new one");
    const std::string aside = path + ".broken-" + std::to_string(start_step);
    std::fprintf(stderr, "meshmoe: warning: cannot read %s (%s); keeping it as %s and starting a new one\n",
                 path.c_str(), e.what(), aside.c_str());
    if (std::rename(path.c_str(), aside.c_str()) != 0)
      throw InputError("cannot move the unreadable " + path + " aside to " + aside + ": " + std::strerror(errno));
    metrics_ = std::make_unique<MetricsFile>(path, deck_.effective_toml, attrs, std::nullopt, arrays);
  }
  metrics_->describe("skipped", "1", "1 when the update was skipped for a non-finite loss or gradient norm");
  metrics_->describe("empty", "1",
                     "1 when the step's batch held no target token: no forward and no update (loss NaN); every "
                     "such step is logged, so the sum counts them");
  metrics_->describe("mfu", "1", "model FLOPs utilisation against the sgemm peak measured at start-up (or run.peak_gflops)");
  metrics_->describe("eval/time", "s", "wall time of the evaluation");
  metrics_->describe("eval/tokens", "tokens", "masked target tokens in the validation batches");
  metrics_->describe("eval/empty_batches", "batches", "validation batches without a target token (skipped: no forward)");
  metrics_->describe("eval/lang_tokens", "tokens", "masked target tokens per language (root attribute languages)");
  metrics_->describe("data/lang_tokens", "tokens",
                     "target tokens (loss mask 1) trained per language (root attribute languages) from step 1 to this "
                     "row's step, counting the steps whose update was applied");
  metrics_->describe("eval/lang_loss", "nats/token", "validation cross-entropy per language (root attribute languages)");
  metrics_->describe("eval/bleu", "BLEU (0-100)",
                     "corpus BLEU (SacreBLEU 13a) per language (root attribute languages) of the greedy translations "
                     "of eval.bleu_examples of its validation pairs (eval.bleu_every); NaN: no pair");
  metrics_->describe("eval/chrf", "chrF (0-100)", "corpus chrF2 per language of the same translations");
  metrics_->describe("eval/bleu_sentences", "sentences", "validation pairs translated per language");
  metrics_->describe("eval/bleu_all", "BLEU (0-100)", "corpus BLEU of every language's translations together");
  metrics_->describe("eval/chrf_all", "chrF (0-100)", "corpus chrF2 of every language's translations together");
  metrics_->describe("eval/bleu_time", "s", "wall time of the translations and their scores");
  for (size_t l = 0; l < size_t(shape_.num_moe_layers()); ++l) {
    const std::string g = moe_name(l);
    metrics_->describe(g + "/wanted_choices", "choices",
                       "token-to-expert choices meant to be dispatched in the step (the denominator of "
                       "dropped_fraction and rerouted_fraction)");
    metrics_->describe(g + "/expert_dropped", "choices",
                       "choices dropped for capacity per expert chosen; row per step, column per expert; the row "
                       "sums to dropped_fraction x wanted_choices");
    metrics_->describe(g + "/expert_rerouted", "choices",
                       "choices placed by No-Token-Left-Behind per expert that took them; the row sums to "
                       "rerouted_fraction x wanted_choices");
    metrics_->describe(g + "/expert_declined", "choices",
                       "second (and later) choices random or threshold routing did not dispatch, per expert chosen; "
                       "the row sums to declined_fraction x the step's tokens x (k - 1)");
  }
}

void StepLog::header(int blas_threads, const Dataset& train, const Dataset& valid, int vocab, const ModelParamCounts& whole,
                     size_t rank_params, const TooLong& train_too_long, const TooLong& valid_too_long) const {
  std::printf("meshmoe train: run %s -> %s\n", cfg_.run.name.c_str(), dir_.c_str());
  std::printf("  mesh %s, %d BLAS thread%s per rank; data %s: %zu train / %zu valid examples, vocab %d\n",
              mesh_.shape().str().c_str(), blas_threads, blas_threads == 1 ? "" : "s", cfg_.data.path.c_str(),
              train.num_examples(), valid.num_examples(), vocab);
  if (!train.info().direction.empty()) std::printf("  direction %s\n", direction_text(train.info().direction).c_str());
  // docs/user-guide.md "Datasets": what sequences of seq_len + 1 tokens cannot hold whole
  std::printf("  examples longer than model.seq_len + 1 = %lld: train %zu truncated at the source, %zu dropped "
              "(target too long); evaluated %zu truncated, %zu dropped\n",
              (long long)cfg_.model.seq_len + 1, train_too_long.truncated, train_too_long.dropped,
              valid_too_long.truncated, valid_too_long.dropped);
  std::printf("  model: %d layers (%d MoE), d_model %lld, %lld parameters (%lld used per token), rank 0 holds %zu; "
              "%.3g train FLOPs/token; peak %.1f GFLOP/s%s\n",
              shape_.num_layers, shape_.num_moe_layers(), (long long)cfg_.model.d_model, (long long)whole.total,
              (long long)whole.activated, rank_params, flops_per_token_, peak_ / 1e9,
              cfg_.run.peak_gflops > 0 ? " (run.peak_gflops)" : "");
  std::fflush(stdout);
}

void StepLog::step(int64_t step, const StepStats& s, double tokens_per_s, double eta,
                   const std::vector<int64_t>& lang_tokens) {
  // Per-phase times: max over ranks (the slowest rank sets the pace).
  // Every rank reduces the same list, whatever phases it ran (a stage may have no MoE layer).
  std::vector<double> secs(std::size(kPhases), 0.0);
  for (size_t i = 0; i < secs.size(); ++i) {
    const auto it = timers_.totals().find(kPhases[i]);
    if (it != timers_.totals().end()) secs[i] = it->second;
  }
  mesh_.world_comm().all_reduce(secs.data(), secs.size(), Op::Max);
  timers_.reset();
  const double mfu = tokens_per_s * flops_per_token_ / peak_;
  const double bubble = pipeline_bubble();
  on_rank0_agreed([&] { write_step_row(step, s, tokens_per_s, eta, mfu, bubble, secs, lang_tokens); });
}

// The measured pipeline bubble of the logging interval: the fraction of its time in the 1F1B
// schedule that a rank waited on the pipe axis, mean over the ranks; -1 without a pipeline.
double StepLog::pipeline_bubble() {
  const PipelineExecutor::Bubble b = pipeline_.take_bubble();
  if (mesh_.extent(Axis::Pipe) == 1) return -1;
  double fraction = b.train_s > 0 ? b.wait_s / b.train_s : 0;
  mesh_.world_comm().all_reduce(&fraction, 1, Op::Sum);
  return fraction / mesh_.world_comm().size();
}

void StepLog::write_step_row(int64_t step, const StepStats& s, double tokens_per_s, double eta, double mfu,
                             double bubble, const std::vector<double>& secs, const std::vector<int64_t>& lang_tokens) {
  const double ideal = ideal_bubble(mesh_.extent(Axis::Pipe), int(cfg_.optim.micro_batches));
  char bubble_text[64] = "";
  if (bubble >= 0) std::snprintf(bubble_text, sizeof bubble_text, " | bubble %.0f%% (ideal %.0f%%)", 100 * bubble, 100 * ideal);
  std::printf("step %6lld/%lld | loss %.4f | aux %.4f | lr %.2e | gnorm %.3f | %8.0f tok/s | MFU %5.1f%%%s | ETA %s%s\n",
              (long long)step, (long long)cfg_.run.steps, s.loss, s.aux, s.lr, s.grad_norm, tokens_per_s,
              100 * mfu, bubble_text, format_eta(eta).c_str(), s.skipped ? " | SKIPPED" : s.empty ? " | EMPTY" : "");
  std::fflush(stdout);
  if (mfu > 1 && !warned_mfu_) {
    warned_mfu_ = true;
    std::fprintf(stderr,
                 "meshmoe: warning: MFU %.0f%% is over 100%%: the ceiling measured at start-up (%.1f GFLOP/s) is too "
                 "low, the node was busy then; set run.peak_gflops (e.g. from meshmoe bench-gemm) for a true MFU\n",
                 100 * mfu, peak_ / 1e9);
  }
  std::map<std::string, double> row{{"loss", s.loss},       {"aux_loss", s.aux},          {"z_loss", s.z},
                                    {"lr", s.lr},           {"grad_norm", s.grad_norm},   {"tokens_per_s", tokens_per_s},
                                    {"mfu", mfu},           {"skipped", s.skipped ? 1.0 : 0.0},
                                    {"empty", s.empty ? 1.0 : 0.0}};
  if (s.distill) row["distill/soft_loss"] = s.soft_loss;
  if (bubble >= 0) {
    row["pipeline_bubble"] = bubble;
    row["pipeline_bubble_ideal"] = ideal;
  }
  for (size_t i = 0; i < secs.size(); ++i) row[std::string("time/") + kPhases[i]] = secs[i];
  for (size_t l = 0; l < s.moe.size(); ++l) {
    const MoeLayerStats& m = s.moe[l];
    const std::string g = moe_name(l);
    row[g + "/dropped_fraction"] = m.dropped;
    row[g + "/rerouted_fraction"] = m.rerouted;
    row[g + "/declined_fraction"] = m.declined;
    row[g + "/router_entropy"] = m.entropy;
    row[g + "/capacity"] = m.capacity;
    row[g + "/wanted_choices"] = m.wanted;
    if (cfg_.moe.balance == BalanceKind::Bias) row[g + "/bias_max_abs"] = m.bias_max_abs;
  }
  metrics_->append(step, row);
  for (size_t l = 0; l < s.load.size(); ++l) metrics_->append_row(moe_name(l) + "/expert_load", s.load[l]);
  for (size_t l = 0; l < s.moe.size(); ++l) {
    const std::string g = moe_name(l);
    metrics_->append_row(g + "/experts_per_token", s.moe[l].experts_per_token);
    metrics_->append_row(g + "/expert_dropped", s.moe[l].expert_dropped);
    metrics_->append_row(g + "/expert_rerouted", s.moe[l].expert_rerouted);
    metrics_->append_row(g + "/expert_declined", s.moe[l].expert_declined);
  }
  metrics_->append_row("data/lang_tokens", std::vector<double>(lang_tokens.begin(), lang_tokens.end()));
}

// metrics.h5 group of the l-th MoE layer: moe/layer<block index>.
std::string StepLog::moe_name(size_t l) const {
  size_t seen = 0;
  for (int i = 0; i < shape_.num_layers; ++i)
    if (shape_.is_moe_block(i) && seen++ == l) return "moe/layer" + std::to_string(i);
  return "moe/unknown";
}

void StepLog::record(int64_t step, const std::map<std::string, double>& scalars) {
  on_rank0_agreed([&] { metrics_->append(step, scalars); });
}

void StepLog::eval(int64_t step, const Evaluation& e, double start) {
  on_rank0_agreed([&] {
    std::printf("eval step %lld | valid loss %.4f over %.0f tokens", (long long)step, e.loss(), e.tokens);
    if (e.empty_batches > 0)
      std::printf(" (%lld of %lld batches without a target token, skipped)", (long long)e.empty_batches, (long long)e.batches);
    std::printf("\n");
    std::fflush(stdout);
    metrics_->append(step, {{"eval/loss", e.loss()},
                            {"eval/tokens", e.tokens},
                            {"eval/empty_batches", double(e.empty_batches)},
                            {"eval/time", wall_seconds() - start}});
    metrics_->append_row("eval/lang_loss", e.lang_loss());
    metrics_->append_row("eval/lang_tokens", e.lang_tokens);
  });
}

void StepLog::bleu(int64_t step, const std::vector<TranslationScore>& scores, double start) {
  on_rank0_agreed([&] {
    TranslationScore all;
    std::vector<double> bleu, chrf, sentences;
    for (const TranslationScore& s : scores) {
      all += s;
      bleu.push_back(s.bleu_score());
      chrf.push_back(s.chrf_score());
      sentences.push_back(double(s.sentences));
    }
    const double seconds = wall_seconds() - start;
    std::printf("bleu step %lld | BLEU %.2f | chrF %.2f | %lld sentences, greedy | %.1f s\n", (long long)step,
                all.bleu_score(), all.chrf_score(), (long long)all.sentences, seconds);
    std::fflush(stdout);
    metrics_->append(step, {{"eval/bleu_all", all.bleu_score()}, {"eval/chrf_all", all.chrf_score()}, {"eval/bleu_time", seconds}});
    metrics_->append_row("eval/bleu", bleu);
    metrics_->append_row("eval/chrf", chrf);
    metrics_->append_row("eval/bleu_sentences", sentences);
  });
}

void StepLog::done(double seconds) const {
  if (mesh_.rank() == 0)
    std::printf("done: %lld steps in %s; run directory %s\n", (long long)cfg_.run.steps, format_eta(seconds).c_str(),
                dir_.c_str());
}

// Rank 0 alone writes metrics.h5; the ranks agree on whether that worked, so that a failure (a
// full disk, a series that no longer fits) stops them all together, after a checkpoint
// (Trainer::run).
template <class Write>
void StepLog::on_rank0_agreed(Write&& write) {
  std::string error;
  if (mesh_.rank() == 0) {
    try {
      write();
      metrics_->publish_rows();  // the step's datasets are all written: readers may read its rows
    } catch (const std::exception& e) {
      error = "cannot write " + dir_ + "/metrics.h5: " + e.what();
    }
  }
  if (const std::string e = first_error(error, mesh_.world()); !e.empty()) throw AgreedFailure(e);
}

}  // namespace meshmoe
