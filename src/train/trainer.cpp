#include "train/trainer.hpp"

#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include "core/error.hpp"
#include "core/timers.hpp"
#include "data/batcher.hpp"
#include "data/dataset.hpp"
#include "data/dataset_identity.hpp"
#include "train/checkpoint.hpp"
#include "io/metrics.hpp"
#include "mesh/agree.hpp"
#include "mesh/comm.hpp"
#include "model/transformer.hpp"
#include "parallel/gradient_sync.hpp"
#include "parallel/pipeline_executor.hpp"
#include "tensor/blas.hpp"
#include "tensor/gemm_rate.hpp"
#include "tensor/host_threads.hpp"
#include "train/evaluate.hpp"
#include "train/grad_clip.hpp"
#include "train/memory.hpp"
#include "train/optimizer.hpp"
#include "train/schedule.hpp"
#include "train/select_device.hpp"
#include "train/run_directory.hpp"
#include "train/signals.hpp"
#include "train/step_stats.hpp"

namespace meshmoe {

std::string run_directory(const Config& cfg) {
  return cfg.run.out_dir.empty() ? "runs/" + cfg.run.name : cfg.run.out_dir;
}

namespace {

std::string format_eta(double seconds) {
  char buf[32];
  const long s = long(std::max(0.0, seconds));
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  return buf;
}

// Rank 0 writes deck.toml into the run directory (which RunDirectory made and locked).
void write_deck_file(const Deck& deck, const std::string& dir, MPI_Comm world) {
  std::string error;
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  if (rank == 0) {
    std::ofstream out(dir + "/deck.toml");
    // run.name is checked to be one printable line (deck.cpp); the deck's path may be anything.
    std::string from = deck.path;
    for (char& ch : from)
      if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
    out << "# effective deck of run " << deck.cfg.run.name << " (from " << from << ")\n" << deck.effective_toml;
    out.flush();
    if (!out) error = "cannot write the run directory " + dir + ": cannot write deck.toml (set run.out_dir to a writable place)";
  }
  if (const std::string e = first_error(error, world); !e.empty()) throw InputError(e);
}

// Dataset::open with the mistakes of data.path named first. Collective: every rank reads the file
// itself, and a rank that cannot (the file missing on its node only) stops every rank, named.
Dataset open_split(const std::string& path, const std::string& split, MPI_Comm world) {
  Dataset d;
  agree_on_input(world, [&] {
    if (path.empty()) throw InputError("data.path is empty: set it to a dataset file written by `meshmoe prep gettext|text`");
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
      throw InputError("data.path: " + path + ": is a directory, not a dataset file (write one with `meshmoe prep`)");
    d = Dataset::open(path, split);
  });
  return d;
}

// The first `per_language` examples of every language of a split (all of it when 0), so that an
// evaluation scores every language, the small ones too.
Dataset eval_subset(const Dataset& valid, int64_t per_language) {
  if (per_language <= 0) return valid;
  const DataSplit& in = valid.split();
  DataSplit out;
  std::vector<int64_t> taken(valid.info().languages.size() + 1, 0);
  for (size_t e = 0; e < in.num_examples(); ++e) {
    const int32_t lang = in.lang[e];
    int64_t& n = taken[size_t(std::clamp<int32_t>(lang, 0, int32_t(taken.size()) - 1))];
    if (n >= per_language) continue;
    ++n;
    const size_t b = in.example_begin(e), len = in.example_size(e);
    std::vector<int32_t> tokens(len);
    for (size_t i = 0; i < len; ++i) tokens[i] = int32_t(in.token(b + i));
    out.add_example(tokens, std::vector<uint8_t>(in.loss_mask.begin() + long(b), in.loss_mask.begin() + long(b + len)), lang);
  }
  return Dataset::from_memory(valid.info(), std::move(out), valid.path() + " (valid, " + std::to_string(per_language) + " per language)");
}

// Cores this process may run on (its CPU affinity: mpirun binds each rank to one core by default,
// srun to its --cpus-per-task).
int allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

// More threads than allowed cores share them: the run is as slow as with fewer threads, and the
// sgemm peak MFU is measured against is too (every rank checks; rank 0 says it once).
void warn_threads_over_cores(int threads, MPI_Comm world) {
  int cores = allowed_cores(), rank = 0;
  if (cores <= 0) cores = threads;
  MPI_Allreduce(MPI_IN_PLACE, &cores, 1, MPI_INT, MPI_MIN, world);
  MPI_Comm_rank(world, &rank);
  if (rank == 0 && threads > cores)
    std::fprintf(stderr,
                 "meshmoe: warning: %d threads per rank (run.threads) but a rank may run on only %d core%s (its CPU "
                 "affinity): the threads share %s. Launch with `mpirun --map-by slot:PE=%d` (or --bind-to none), or "
                 "`srun --cpus-per-task=%d`\n",
                 threads, cores, cores == 1 ? "" : "s", cores == 1 ? "it" : "them", threads, threads);
}

// The phases timed in a step, written to metrics.h5 as /time/<phase> (max over ranks). Nested:
// tensor_allreduce happens inside attention and dense_ffn; gate, dispatch, expert and combine are
// the MoE layer's stages, moe_alltoall (expert_axis = data) is inside dispatch and combine,
// moe_allreduce (experts over tensor, Switch 5.5 expert hidden split) inside expert or combine.
// grad_overlap is the backward's part of the overlapped gradient sum, grad_allreduce the wait after it.
constexpr const char* kPhases[] = {"attention", "dense_ffn", "gate", "dispatch", "expert", "combine",
                                   "moe_alltoall", "moe_allreduce",
                                   "head_loss", "tensor_allreduce", "pipeline_wait", "pipeline_recompute",
                                   "grad_overlap", "grad_allreduce", "optimizer"};

}  // namespace

namespace {

class Trainer {
 public:
  Trainer(const Deck& deck, Mesh& mesh, std::string version)
      : deck_(deck),
        version_(std::move(version)),
        cfg_(deck.cfg),
        mesh_(mesh),
        data_comm_(mesh.axis(Axis::Data)),
        dir_(run_directory(cfg_)),
        run_dir_(dir_, mesh.world()),
        train_(open_split(cfg_.data.path, "train", mesh.world())),
        valid_(open_split(cfg_.data.path, "valid", mesh.world())),
        eval_set_(eval_subset(valid_, cfg_.eval.examples_per_language)) {
    blas_threads_ = apply_run_threads(cfg_.run.threads);  // before the sgemm peak is measured
    warn_threads_over_cores(blas_threads_, mesh.world());
    // Before anything the model allocates: its Buffers live where run.device says.
    const std::string device_line = select_device(cfg_.run.device, mesh.world());
    if (mesh.rank() == 0) std::printf("%s\n", device_line.c_str());
    vocab_ = cfg_.model.vocab_size > 0 ? int(cfg_.model.vocab_size) : train_.vocab_size();
    if (vocab_ < train_.vocab_size())
      throw InputError("model.vocab_size = " + std::to_string(vocab_) + " is smaller than the vocabulary of " +
                       cfg_.data.path + " (" + std::to_string(train_.vocab_size()) + "); set it to 0 to use the dataset's");
    check_splits_in_use();
    if (mesh.rank() == 0) data_identity_ = dataset_identity(cfg_.data.path, train_, valid_);
    install_stop_signal_handlers();
    model_ = std::make_unique<Transformer<float>>(cfg_, vocab_, model_sharding(mesh));
    for (int i = 0; i < model_->first_block(); ++i) first_moe_layer_ += model_->shape().is_moe_block(i);
    model_->init(uint64_t(cfg_.run.seed), cfg_.model.init_scale);
    pipeline_ = std::make_unique<PipelineExecutor>(*model_, mesh, timers_, parse_recompute(cfg_.model.recompute));
    const size_t bucket_elems = size_t(cfg_.run.grad_bucket_mb * (1 << 20)) / sizeof(float);
    grad_sync_ = std::make_unique<GradientSync>(
        *model_, mesh, cfg_.run.grad_bucket_mb > 0 ? std::max<size_t>(bucket_elems, 1) : 0, cfg_.model.tied_embeddings,
        &timers_);
    optimizer_ = make_optimizer(cfg_, model_->params(), all_entries(model_->params()),
                                [this](const ParamInfo& p, int dim, double* buf, size_t n) {
                                  // A block split along `dim`: the expert dimension of [E, ...] expert
                                  // weights is split over data, every other split dimension over tensor.
                                  const bool expert_dim = (p.sharded_over & kShardData) && dim == 0;
                                  mesh_.axis(expert_dim ? Axis::Data : Axis::Tensor).all_reduce(buf, n, Op::Sum);
                                });
    schedule_ = Schedule::from_config(cfg_);
    batcher_ = std::make_unique<Batcher>(train_, int(cfg_.model.seq_len), uint64_t(cfg_.run.seed), cfg_.data.shuffle);
    train_too_long_ = count_too_long(train_.split(), int(cfg_.model.seq_len));
    valid_too_long_ = count_too_long(eval_set_.split(), int(cfg_.model.seq_len));
    flops_per_token_ = train_flops_per_token(cfg_, model_->shape());
    // The sgemm ceiling with the run's BLAS threads (applied above), measured by every rank at once so
    // that the ranks of a node share its cores as they do in a step; the mesh's ceiling is the sum.
    mesh.world_comm().barrier();
    peak_ = measure_peak_flops();
    mesh.world_comm().all_reduce(&peak_, 1, Op::Sum);
    const std::string memory = memory_report_collective(cfg_, mesh.shape(), mesh.world());
    if (mesh.rank() == 0) std::fputs(memory.c_str(), stdout);
    resume();
    write_deck_file(deck, dir_, mesh.world());
    if (mesh.rank() == 0) {
      const std::string languages = join_languages(train_.info().languages);
      open_metrics(std::map<std::string, std::string>{{"run_name", cfg_.run.name},
                                                      {"mesh", mesh.shape().str()},
                                                      {"languages", languages},
                                                      {"data_path", cfg_.data.path},
                                                      {"version", version_},
                                                      {"train_flops_per_token", std::to_string(flops_per_token_)},
                                                      {"sgemm_peak_flops", std::to_string(peak_)},
                                                      {"train_examples_truncated", std::to_string(train_too_long_.truncated)},
                                                      {"train_examples_dropped", std::to_string(train_too_long_.dropped)},
                                                      {"valid_examples_truncated", std::to_string(valid_too_long_.truncated)},
                                                      {"valid_examples_dropped", std::to_string(valid_too_long_.dropped)}});
      metrics_->describe("skipped", "1", "1 when the update was skipped for a non-finite loss or gradient norm");
      metrics_->describe("empty", "1",
                         "1 when the step's batch held no target token: no forward and no update (loss NaN); every "
                         "such step is logged, so the sum counts them");
      metrics_->describe("mfu", "1", "model FLOPs utilisation against the fp32 sgemm peak measured at start-up");
      metrics_->describe("eval/time", "s", "wall time of the evaluation");
      metrics_->describe("eval/tokens", "tokens", "masked target tokens in the validation batches");
      metrics_->describe("eval/empty_batches", "batches", "validation batches without a target token (skipped: no forward)");
      metrics_->describe("eval/lang_tokens", "tokens", "masked target tokens per language (root attribute languages)");
      metrics_->describe("eval/lang_loss", "nats/token", "validation cross-entropy per language (root attribute languages)");
    }
  }

  int run() {
    const int64_t steps = cfg_.run.steps;
    if (mesh_.rank() == 0) print_header();
    double interval_start = wall_seconds();
    run_start_ = interval_start;
    int64_t interval_tokens = 0;
    const int64_t first = start_step_ + 1;
    int64_t done = start_step_;  // the last step whose update (or skip) is complete
    try {
      // An evaluation a stop request interrupted is done first, so that metrics.h5 holds what an
      // uninterrupted run's does.
      if (eval_pending_) {
        if (const int why = evaluate(start_step_)) return stop(start_step_, why);
        eval_pending_ = false;
      }
      for (int64_t step = first; step <= steps; ++step) {
        if (const int why = stop_requested()) return stop(step - 1, why);
        const StepStats s = train_step(step);
        done = step;
        interval_tokens += int64_t(cfg_.optim.batch_size) * cfg_.model.seq_len;
        if (step % cfg_.run.log_every == 0 || step == steps || s.skipped || s.empty) {
          const double now = wall_seconds();
          const double tokens_per_s = double(interval_tokens) / (now - interval_start);
          log_step(step, s, tokens_per_s, (now - run_start_) / double(step - first + 1) * double(steps - step));
          interval_start = wall_seconds();
          interval_tokens = 0;
        }
        if (bad_steps_ >= cfg_.run.max_bad_steps) {
          if (mesh_.rank() == 0)
            std::fprintf(stderr,
                         "meshmoe: error: %lld consecutive non-finite steps (run.max_bad_steps) up to step %lld; "
                         "stopping with the parameters of the last good step%s\n",
                         (long long)bad_steps_, (long long)step, pipeline_->first_nonfinite().empty() ? "" : " (see the warnings for the first non-finite layer)");
          save_checkpoint(step - bad_steps_, &good_cursor_);
          return kExitFailure;
        }
        if (cfg_.eval.every > 0 && (step % cfg_.eval.every == 0 || step == steps))
          if (const int why = evaluate(step)) {
            eval_pending_ = true;  // recorded in the checkpoint: the resumed run evaluates this step first
            return stop(step, why);
          }
        if (((cfg_.checkpoint.every > 0 && step % cfg_.checkpoint.every == 0) || step == steps) && !save_checkpoint(step))
          return kExitFailure;
      }
    } catch (const InputError&) {
      save_checkpoint_before_failure(done);
      throw;
    } catch (const AgreedFailure&) {
      save_checkpoint_before_failure(done);
      throw;
    }
    if (mesh_.rank() == 0)
      std::printf("done: %lld steps in %s; run directory %s\n", (long long)steps,
                  format_eta(wall_seconds() - run_start_).c_str(), dir_.c_str());
    return kExitOk;
  }

  // A failure that every rank reached together after some steps (it was agreed): the steps done
  // are not lost; the caller then reports the failure.
  void save_checkpoint_before_failure(int64_t done) {
    if (done <= last_checkpoint_) return;
    if (mesh_.rank() == 0)
      std::fprintf(stderr, "meshmoe: writing a checkpoint of step %lld before stopping on the error below\n", (long long)done);
    save_checkpoint(done);
  }

  // At a step boundary all ranks agree whether to stop: a signal on any rank (1) or the wall-time
  // limit run.max_walltime (2).
  int stop_requested() {
    int why = stop_signal_received() ? 1 : 0;
    if (cfg_.run.max_walltime > 0 && wall_seconds() - run_start_ >= cfg_.run.max_walltime) why = std::max(why, 2);
    mesh_.world_comm().all_reduce(&why, 1, Op::Max);
    return why;
  }

  int stop(int64_t last_step, int why) {
    if (mesh_.rank() == 0)
      std::fprintf(stderr, "meshmoe: %s after step %lld: writing a checkpoint and exiting with code %d (resume to continue)\n",
                   why == 1 ? "stop signal received" : "run.max_walltime reached", (long long)last_step, int(kExitCheckpointed));
    if (!save_checkpoint(last_step)) return kExitFailure;
    return kExitCheckpointed;
  }

  // Writes ckpt/step_N.h5 (collective; atomic, then LATEST, then pruning by checkpoint.keep_*).
  // `cursor`: the data cursor to record (default: where the batcher stands); a checkpoint of the
  // last good step (after non-finite steps) records that step's cursor and no bad steps.
  // Returns false (rank 0 has said why) when the state is not finite and nothing was written: the
  // caller exits with kExitFailure.
  bool save_checkpoint(int64_t step, const DataCursor* cursor = nullptr) {
    if (step <= 0 || step == last_checkpoint_) return true;
    const double t0 = wall_seconds();
    CheckpointMeta m;
    m.step = step;
    m.update_count = updates_;
    m.seed = uint64_t(cfg_.run.seed);
    m.data_cursor = cursor ? *cursor : batcher_->cursor();
    m.optimizer = cfg_.optim.name;
    m.deck = deck_.effective_toml;
    m.version = version_;
    m.counters = {{"bad_steps", cursor ? 0 : bad_steps_}, {"eval_pending", eval_pending_ ? 1 : 0},
                  {"empty_steps", empty_steps_}};
    m.lineage = lineage_;
    m.forked_from = forked_from_;
    m.data_path = data_identity_.path;  // rank 0's meta is the one written
    m.data_summary = data_identity_.summary;
    m.data_fingerprint = data_identity_.fingerprint;
    m.data_languages = join_languages(data_identity_.languages);
    std::string path;
    try {
      path = write_checkpoint(dir_ + "/ckpt", model_->params(), optimizer_->state(), m, mesh_,
                              RetentionPolicy{int(cfg_.checkpoint.keep_last), int(cfg_.checkpoint.keep_every), lineage_});
    } catch (const NonFiniteState& e) {  // every rank alike
      if (mesh_.rank() == 0) {
        std::fprintf(stderr, "meshmoe: error: %s\n", e.what());
        std::fflush(stderr);
      }
      return false;
    }
    last_checkpoint_ = step;
    if (mesh_.rank() == 0) {
      std::printf("checkpoint step %lld: %s (%.2f s)\n", (long long)step, path.c_str(), wall_seconds() - t0);
      std::fflush(stdout);
    }
    return true;
  }

  // run.resume: auto (the newest complete checkpoint of the run directory, if any), never, or a
  // checkpoint path. Parameters, optimizer state, data cursor, update and bad-step counts come back;
  // the mesh may differ from the one that wrote the checkpoint. Resuming the run directory's newest
  // checkpoint continues its lineage; anything else is a fresh start (or a fork of the given file)
  // and first moves an earlier run's files aside, so that a later `auto` resume and the pruning
  // only ever see this run's own checkpoints (src/train/run_directory.hpp).
  void resume() {
    const std::string ckpt_dir = dir_ + "/ckpt";
    std::string path;
    int continues = 0;
    if (cfg_.run.resume == "auto") {
      const ResumeChoice c = find_resume_checkpoint(ckpt_dir, mesh_.world());
      if (mesh_.rank() == 0)
        for (const auto& w : c.warnings) std::fprintf(stderr, "meshmoe: warning: %s\n", w.c_str());
      path = c.path;
      continues = !path.empty();
    } else if (cfg_.run.resume != "never") {
      path = cfg_.run.resume;
      if (mesh_.rank() == 0) {
        const auto mine = list_checkpoints(ckpt_dir);
        std::error_code ec;
        continues = !mine.empty() && std::filesystem::equivalent(path, mine.back().second, ec);
      }
      mesh_.world_comm().broadcast(&continues, 1, 0);
    }
    lineage_ = run_dir_.nonce();
    if (!path.empty()) {
      // What the file says about itself first: a clear message before any tensor is read.
      CheckpointMeta head;
      agree_on_input(mesh_.world(), [&] { head = read_checkpoint_meta(path); });
      if (head.optimizer != cfg_.optim.name)
        throw InputError("checkpoint " + path + " holds " + head.optimizer + " state but optim.name = " + cfg_.optim.name +
                         " (set run.resume = never to start afresh)");
      if (head.step > cfg_.run.steps)
        throw InputError("checkpoint " + path + " is at step " + std::to_string(head.step) + ", beyond run.steps = " +
                         std::to_string(cfg_.run.steps));
      check_same_data(path, head);
      std::vector<StateTensor> state = optimizer_->state();
      const CheckpointMeta m = read_checkpoint(path, model_->params(), state, mesh_.world());
      batcher_->restore(m.data_cursor);
      good_cursor_ = m.data_cursor;
      start_step_ = m.step;
      last_checkpoint_ = continues ? m.step : 0;
      updates_ = m.update_count;
      if (auto it = m.counters.find("bad_steps"); it != m.counters.end()) bad_steps_ = it->second;
      if (auto it = m.counters.find("empty_steps"); it != m.counters.end()) empty_steps_ = it->second;
      if (auto it = m.counters.find("eval_pending"); it != m.counters.end()) eval_pending_ = it->second != 0 && cfg_.eval.every > 0;
      if (continues) lineage_ = m.lineage;
      else forked_from_ = path + " (step " + std::to_string(m.step) + ")";
      if (mesh_.rank() == 0) {
        std::printf("resuming from %s: step %lld (written on mesh %s)%s\n", path.c_str(), (long long)m.step,
                    m.mesh.str().c_str(), continues ? "" : "; a new lineage of checkpoints starts here");
        std::fflush(stdout);
      }
    }
    if (!continues) {
      const std::string note = run_dir_.move_aside(mesh_.world());
      if (mesh_.rank() == 0 && !note.empty()) std::fprintf(stderr, "meshmoe: note: %s\n", note.c_str());
    }
  }

  // A checkpoint records the dataset it was trained on; resuming it on other data would continue a
  // data cursor and per-language metrics that belong to that data (README "Checkpoints and restart").
  void check_same_data(const std::string& path, const CheckpointMeta& head) {
    std::string error;
    if (mesh_.rank() == 0 && !head.data_fingerprint.empty()) {
      const DatasetIdentity then{head.data_path, head.data_summary, head.data_fingerprint, split_languages(head.data_languages)};
      const std::vector<std::string> diffs = data_identity_.differences_from(then);
      if (!diffs.empty()) {
        error = "checkpoint " + path + " was trained on other data:";
        for (const auto& d : diffs) error += "\n  " + d;
        error += "\n  its data cursor and per-language metrics belong to that data: set data.path back to " +
                 head.data_path + ", or start afresh (run.resume = \"never\" moves the earlier run aside)";
      } else if (head.data_path != cfg_.data.path) {
        std::printf("data.path changed from %s to %s: the same data (fingerprint %s)\n", head.data_path.c_str(),
                    cfg_.data.path.c_str(), head.data_fingerprint.c_str());
      }
    }
    if (const std::string e = first_error(error, mesh_.world()); !e.empty()) throw InputError(e);
  }

  // metrics.h5: a new file, or on resume the existing one with the rows after the checkpoint's
  // step dropped. A metrics file the resume cannot open (e.g. cut short by a kill) is kept aside
  // as metrics.h5.broken-<step> and a new one started, so the run goes on.
  void open_metrics(const std::map<std::string, std::string>& attrs) {
    const std::string path = dir_ + "/metrics.h5";
    std::optional<int64_t> after;
    if (start_step_ > 0) after = start_step_;
    try {
      metrics_ = std::make_unique<MetricsFile>(path, deck_.effective_toml, attrs, after);
    } catch (const std::exception& e) {
      if (!after) throw;
      const std::string aside = path + ".broken-" + std::to_string(start_step_);
      std::fprintf(stderr, "meshmoe: warning: cannot reopen %s (%s); keeping it as %s and starting a new one\n",
                   path.c_str(), e.what(), aside.c_str());
      std::rename(path.c_str(), aside.c_str());
      metrics_ = std::make_unique<MetricsFile>(path, deck_.effective_toml, attrs);
    }
  }

 private:
  std::vector<Micro> micro_batches(const Batch& batch, int64_t step, bool training, PhaseTimers* timers) const {
    return split_micro_batches(batch, int(cfg_.optim.micro_batches), mesh_.extent(Axis::Data), mesh_.coord(Axis::Data),
                               uint64_t(cfg_.run.seed), step, training, timers);
  }

  // One optimizer step: this rank's micro-batches forward and backward through its pipeline stage,
  // the gradients and statistics summed over the mesh, the global norm, then the update (or, when
  // the loss or the norm is not finite, no update: the step is counted as bad).
  StepStats train_step(int64_t step) {
    const int B = int(cfg_.optim.batch_size), T = int(cfg_.model.seq_len);
    const Batch batch = batcher_->next(B);
    double mask_total = 0;
    for (float m : batch.mask) mask_total += m;
    if (mask_total == 0) return empty_step(step);
    const LossWeights w = loss_weights(mask_total, double(B) * T);

    auto& P = model_->params();
    P.zero_grad();
    StepSums sums(size_t(model_->shape().num_moe_layers()), size_t(cfg_.moe.num_experts));
    std::vector<Micro> micros = micro_batches(batch, step, true, &timers_);
    if (cfg_.debug.nan_step > 0 && step >= cfg_.debug.nan_step && step < cfg_.debug.nan_step + cfg_.debug.nan_steps &&
        mesh_.rank() == cfg_.debug.nan_rank)
      model_->inject_nan_next_forward();
    const auto moe = model_->moe_layers();
    const size_t last_micro_tokens = size_t(B / cfg_.optim.micro_batches) * T;  // all data ranks' rows
    grad_sync_->begin_step(int(micros.size()), std::span(batch.inputs).last(last_micro_tokens));
    pipeline_->train(micros, w, [&](const ForwardStats& f) { sums.add(f, moe, first_moe_layer_); });
    {
      ScopedPhase t(&timers_, "grad_allreduce");  // with buckets: what the backward did not hide
      pipeline_->sync_tied_embedding(cfg_.model.tied_embeddings);
      grad_sync_->reduce_over_data();
      sums.all_reduce(mesh_.axis(Axis::Pipe), data_comm_);
    }
    StepStats s = sums.stats(double(B) * T, double(B) * T / double(cfg_.moe.group_size));
    ScopedPhase t(&timers_, "optimizer");
    s.grad_norm = grad_sync_->global_norm();
    s.lr = schedule_(step);
    if (!std::isfinite(s.grad_norm) || (sums.target_tokens() > 0 && !std::isfinite(s.loss))) {
      s.skipped = true;
      ++bad_steps_;
      if (mesh_.rank() == 0)
        std::fprintf(stderr, "meshmoe: warning: step %lld: non-finite loss or gradient norm; update skipped (%lld in a row)\n",
                     (long long)step, (long long)bad_steps_);
      if (!pipeline_->first_nonfinite().empty())
        std::fprintf(stderr, "meshmoe: warning: step %lld: rank %d: first non-finite output: %s\n", (long long)step,
                     mesh_.rank(), pipeline_->first_nonfinite().c_str());
      std::fflush(stderr);
      return s;
    }
    bad_steps_ = 0;
    good_cursor_ = batcher_->cursor();
    ++updates_;
    const double scale = clip_scale(s.grad_norm, cfg_.optim.grad_clip);
    scale_grads(P, scale);
    optimizer_->step(P, s.lr, updates_);  // t counts applied updates (bias correction)
    return s;
  }

  // A step whose batch holds no target token (every rank sees the same global batch, so all decide
  // alike): nothing to learn from, so no forward, no update of any kind (the aux and z losses
  // would otherwise still move the routers), not a bad step. Its loss is NaN (no token), the
  // figures zero. It ends a run of bad steps as a good step does: the parameters and the data
  // cursor after it are a consistent state.
  StepStats empty_step(int64_t step) {
    StepSums none(size_t(model_->shape().num_moe_layers()), size_t(cfg_.moe.num_experts));
    StepStats s = none.stats(1, 1);
    s.empty = true;
    s.lr = schedule_(step);
    ++empty_steps_;
    bad_steps_ = 0;
    good_cursor_ = batcher_->cursor();
    if (mesh_.rank() == 0) {
      std::fprintf(stderr, "meshmoe: warning: step %lld: no target token in the batch; no update (%lld empty steps so far)\n",
                   (long long)step, (long long)empty_steps_);
      std::fflush(stderr);
    }
    return s;
  }

  LossWeights loss_weights(double mask_total, double tokens) const {
    LossWeights w;
    w.ce = 1.0 / std::max(1.0, mask_total);
    const double groups = tokens / double(cfg_.moe.group_size);
    w.aux = cfg_.moe.aux_loss_coef / groups;
    w.z = cfg_.moe.z_loss_coef / tokens;
    return w;
  }

  // Every split the run will use is checked before the first step: an empty validation split found
  // only at the first evaluation would cost every step before it.
  void check_splits_in_use() const {
    if (cfg_.eval.every > 0 && !eval_set_.split().has_target())
      throw InputError(cfg_.data.path + ": the valid split has no target token (" + std::to_string(valid_.num_examples()) +
                       " examples) but eval.every = " + std::to_string(cfg_.eval.every) +
                       " evaluates on it: set eval.every = 0, or prepare the data set with a larger --valid-percent");
    if (cfg_.eval.every > 0 && count_too_long(eval_set_.split(), int(cfg_.model.seq_len)).dropped == eval_set_.num_examples())
      throw InputError(cfg_.data.path + ": every evaluated example's target is longer than model.seq_len + 1 = " +
                       std::to_string(cfg_.model.seq_len + 1) + " tokens (each would be dropped): raise model.seq_len " +
                       "(text from `meshmoe prep text`: prepare it with --max-len <= " +
                       std::to_string(cfg_.model.seq_len + 1) + ")");
  }

  void print_header() const {
    const auto& p = model_->params();
    std::printf("meshmoe train: run %s -> %s\n", cfg_.run.name.c_str(), dir_.c_str());
    std::printf("  mesh %s, %d BLAS thread%s per rank; data %s: %zu train / %zu valid examples, vocab %d\n",
                mesh_.shape().str().c_str(), blas_threads_, blas_threads_ == 1 ? "" : "s", cfg_.data.path.c_str(),
                train_.num_examples(), valid_.num_examples(), vocab_);
    // README "Datasets": what sequences of seq_len + 1 tokens cannot hold whole
    std::printf("  examples longer than model.seq_len + 1 = %lld: train %zu truncated at the source, %zu dropped "
                "(target too long); evaluated %zu truncated, %zu dropped\n",
                (long long)cfg_.model.seq_len + 1, train_too_long_.truncated, train_too_long_.dropped,
                valid_too_long_.truncated, valid_too_long_.dropped);
    std::printf("  model: %d layers (%d MoE), d_model %lld, %zu parameters; %.3g train FLOPs/token; peak %.1f GFLOP/s\n",
                model_->shape().num_layers, model_->shape().num_moe_layers(), (long long)cfg_.model.d_model,
                p.size(), flops_per_token_, peak_ / 1e9);
    std::fflush(stdout);
  }

  void log_step(int64_t step, const StepStats& s, double tokens_per_s, double eta) {
    // Per-phase times: max over ranks (the slowest rank sets the pace).
    // Every rank reduces the same list, whatever phases it ran (a stage may have no MoE layer).
    const std::vector<std::string> names(std::begin(kPhases), std::end(kPhases));
    std::vector<double> secs(names.size(), 0.0);
    for (size_t i = 0; i < names.size(); ++i) {
      const auto it = timers_.totals().find(names[i]);
      if (it != timers_.totals().end()) secs[i] = it->second;
    }
    mesh_.world_comm().all_reduce(secs.data(), secs.size(), Op::Max);
    timers_.reset();
    const double mfu = tokens_per_s * flops_per_token_ / peak_;
    const double bubble = pipeline_bubble();
    on_rank0_agreed([&] { write_step_row(step, s, tokens_per_s, eta, mfu, bubble, names, secs); });
  }

  // The measured pipeline bubble of the logging interval: the fraction of its time in the 1F1B
  // schedule that a rank waited on the pipe axis, mean over the ranks; -1 without a pipeline.
  double pipeline_bubble() {
    const PipelineExecutor::Bubble b = pipeline_->take_bubble();
    if (mesh_.extent(Axis::Pipe) == 1) return -1;
    double fraction = b.train_s > 0 ? b.wait_s / b.train_s : 0;
    mesh_.world_comm().all_reduce(&fraction, 1, Op::Sum);
    return fraction / mesh_.world_comm().size();
  }

  void write_step_row(int64_t step, const StepStats& s, double tokens_per_s, double eta, double mfu, double bubble,
                      const std::vector<std::string>& names, const std::vector<double>& secs) {
    const double ideal = ideal_bubble(mesh_.extent(Axis::Pipe), int(cfg_.optim.micro_batches));
    char bubble_text[64] = "";
    if (bubble >= 0) std::snprintf(bubble_text, sizeof bubble_text, " | bubble %.0f%% (ideal %.0f%%)", 100 * bubble, 100 * ideal);
    std::printf("step %6lld/%lld | loss %.4f | aux %.4f | lr %.2e | gnorm %.3f | %8.0f tok/s | MFU %5.1f%%%s | ETA %s%s\n",
                (long long)step, (long long)cfg_.run.steps, s.loss, s.aux, s.lr, s.grad_norm, tokens_per_s,
                100 * mfu, bubble_text, format_eta(eta).c_str(), s.skipped ? " | SKIPPED" : s.empty ? " | EMPTY" : "");
    std::fflush(stdout);
    std::map<std::string, double> row{{"loss", s.loss},       {"aux_loss", s.aux},          {"z_loss", s.z},
                                      {"lr", s.lr},           {"grad_norm", s.grad_norm},   {"tokens_per_s", tokens_per_s},
                                      {"mfu", mfu},           {"skipped", s.skipped ? 1.0 : 0.0},
                                      {"empty", s.empty ? 1.0 : 0.0}};
    if (bubble >= 0) {
      row["pipeline_bubble"] = bubble;
      row["pipeline_bubble_ideal"] = ideal;
    }
    for (size_t i = 0; i < names.size(); ++i) row["time/" + names[i]] = secs[i];
    for (size_t l = 0; l < s.load.size(); ++l) row[moe_name(l) + "/dropped_fraction"] = s.dropped[l];
    metrics_->append(step, row);
    for (size_t l = 0; l < s.load.size(); ++l) metrics_->append_row(moe_name(l) + "/expert_load", s.load[l]);
  }

  // metrics.h5 group of the l-th MoE layer: moe/layer<block index>.
  std::string moe_name(size_t l) const {
    size_t seen = 0;
    for (int i = 0; i < model_->shape().num_layers; ++i)
      if (model_->shape().is_moe_block(i) && seen++ == l) return "moe/layer" + std::to_string(i);
    return "moe/unknown";
  }

  // Rank 0 alone writes metrics.h5; the ranks agree on whether that worked, so that a failure (a
  // full disk, a series that no longer fits) stops them all together, after a checkpoint (run()).
  template <class Write>
  void on_rank0_agreed(Write&& write) {
    std::string error;
    if (mesh_.rank() == 0) {
      try {
        write();
      } catch (const std::exception& e) {
        error = "cannot write " + dir_ + "/metrics.h5: " + e.what();
      }
    }
    if (const std::string e = first_error(error, mesh_.world()); !e.empty()) throw AgreedFailure(e);
  }

  // Validation (src/train/evaluate.hpp). A stop request during it (signal, run.max_walltime)
  // returns its reason at once, and nothing of the evaluation is logged; 0 when done.
  int evaluate(int64_t step) {
    const double start = wall_seconds();
    const Evaluation e = meshmoe::evaluate(eval_set_, train_.info().languages.size(), cfg_, step, *model_, *pipeline_, mesh_,
                                           [this] { return stop_requested(); });
    if (e.stopped) {
      if (mesh_.rank() == 0)
        std::fprintf(stderr, "meshmoe: evaluation of step %lld interrupted after %lld batches (not recorded)\n",
                     (long long)step, (long long)e.batches);
      return e.stopped;
    }
    on_rank0_agreed([&] {
      std::printf("eval step %lld | valid loss %.4f over %.0f tokens", (long long)step, e.loss(), e.tokens);
      if (e.empty_batches > 0) std::printf(" (%lld of %lld batches without a target token, skipped)", (long long)e.empty_batches, (long long)e.batches);
      std::printf("\n");
      std::fflush(stdout);
      metrics_->append(step, {{"eval/loss", e.loss()},
                              {"eval/tokens", e.tokens},
                              {"eval/empty_batches", double(e.empty_batches)},
                              {"eval/time", wall_seconds() - start}});
      metrics_->append_row("eval/lang_loss", e.lang_loss());
      metrics_->append_row("eval/lang_tokens", e.lang_tokens);
    });
    return 0;
  }

  const Deck& deck_;
  std::string version_;
  const Config& cfg_;
  Mesh& mesh_;
  Comm& data_comm_;
  std::string dir_;
  RunDirectory run_dir_;  // locked for this run; checked to be the same directory on every rank
  Dataset train_, valid_;
  Dataset eval_set_;  // valid_, or its first eval.examples_per_language examples of every language
  int vocab_ = 0;
  std::unique_ptr<Transformer<float>> model_;
  std::unique_ptr<PipelineExecutor> pipeline_;
  std::unique_ptr<GradientSync> grad_sync_;
  std::unique_ptr<Optimizer> optimizer_;
  Schedule schedule_;
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<MetricsFile> metrics_;
  PhaseTimers timers_;
  double flops_per_token_ = 0, peak_ = 0;
  double run_start_ = 0;
  int blas_threads_ = 1;  // wall_seconds() when run() began (run.max_walltime)
  int64_t bad_steps_ = 0;
  TooLong train_too_long_, valid_too_long_;  // examples the sequences truncate or drop
  int64_t empty_steps_ = 0;  // steps without a target token so far (resumed from the checkpoint)
  int64_t updates_ = 0;
  int64_t start_step_ = 0;       // steps already done (from a checkpoint)
  DataCursor good_cursor_;       // the data cursor after the last step whose update was applied
  bool eval_pending_ = false;     // the evaluation of the last completed step was interrupted
  int64_t last_checkpoint_ = 0;  // step of the newest checkpoint written or resumed from (this lineage)
  std::string lineage_, forked_from_;  // CheckpointMeta::lineage / forked_from of what this run writes
  DatasetIdentity data_identity_;      // rank 0 only
  size_t first_moe_layer_ = 0;  // global index of this stage's first MoE layer
};

}  // namespace

int train_main(const Deck& deck, Mesh& mesh, const std::string& version) {
  Trainer trainer(deck, mesh, version);
  return trainer.run();
}

}  // namespace meshmoe
