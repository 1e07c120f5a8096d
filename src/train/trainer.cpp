#include "train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <thread>

#include "core/error.hpp"
#include "core/timers.hpp"
#include "data/batcher.hpp"
#include "data/dataset.hpp"
#include "data/dataset_identity.hpp"
#include "decode/decoder.hpp"
#include "decode/translation_eval.hpp"
#include "mesh/agree.hpp"
#include "mesh/comm.hpp"
#include "model/transformer.hpp"
#include "parallel/gradient_sync.hpp"
#include "parallel/pipeline_executor.hpp"
#include "tensor/cuda_profile.hpp"
#include "tensor/gemm_rate.hpp"
#include "tensor/host_threads.hpp"
#include "checkpoint/checkpoint.hpp"
#include "decode/decode_memory.hpp"
#include "train/evaluate.hpp"
#include "optim/grad_clip.hpp"
#include "tensor/device.hpp"
#include "tensor/device_graph.hpp"
#include "tensor/step_scalars.hpp"
#include "run/startup.hpp"
#include "optim/optimizer.hpp"
#include "run/run_checkpoints.hpp"
#include "run/run_data.hpp"
#include "run/run_directory.hpp"
#include "optim/schedule.hpp"
#include "run/select_device.hpp"
#include "run/signals.hpp"
#include "train/run_clock.hpp"
#include "train/step_log.hpp"
#include "train/step_stats.hpp"

namespace meshmoe {

namespace {

class Trainer {
 public:
  Trainer(const Deck& deck, Mesh& mesh, const Startup& start, std::string version, const TrainOptions& opt)
      : version_(std::move(version)),
        hooks_(opt.hooks),
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
    std::string device_line = select_device(cfg_.run.device, cfg_.model.precision, mesh.world());
#ifdef MESHMOE_CUDA
    if (cfg_.run.device == Device::Cuda) {
      mesh.enable_device();
      device_line += "; NCCL for the data and tensor axes' device buffers, MPI for the pipe axis and host values";
    }
#endif
    if (mesh.rank() == 0) std::printf("%s\n", device_line.c_str());
    check_dataset_tokenizer(cfg_.data.path, train_.info(), cfg_.data.tokenizer, cfg_.data.spm_pieces);
    vocab_ = model_vocab(cfg_, train_);
    start.agree_vocab(vocab_, mesh.world());  // the vocabulary the start-up planned with
    valid_too_long_ = check_eval_split(cfg_, valid_, eval_set_);
    DatasetIdentity data_identity;  // rank 0 only
    if (mesh.rank() == 0) data_identity = dataset_identity(cfg_.data.path, train_, valid_);
    install_stop_signal_handlers();
    // On the GPU the arena takes this rank's planned bytes in one piece before the model allocates
    // (docs/ARCHITECTURE.md "Device memory"); nothing on the host.
    if (cfg_.run.device == Device::Cuda) reserve_buffer_memory(start.plan().model_bytes());
    if (cfg_.eval.bleu_every > 0) {  // every rank holds the same pairs (a data error throws on all alike)
      tokenizer_ = valid_.info().tokenizer_object();
      const int64_t n = cfg_.eval.bleu_examples > 0 ? cfg_.eval.bleu_examples : cfg_.eval.examples_per_language;
      bleu_pairs_ = validation_pairs(valid_, tokenizer_, n);
      bleu_tokens_ = translation_forward_tokens(bleu_pairs_, tokenizer_);
    }
    // The start-up's placement and shape table (run/startup.hpp); the Comms now that the device is chosen.
    const Placement placement = start.placement_on(mesh);
    Placement trained = placement;
    trained.data = &mesh.axis(Axis::Data);  // weights and gradients node-shared over data (ParamStore::allocate)
    trained.one_weight_copy = cfg_.optim.shard_state;
    model_ = std::make_unique<Transformer<float>>(cfg_, start.table(), trained);
    if (mesh.rank() == 0 && mesh.extent(Axis::Data) > 1) {
      const ParamStore<float>& params = model_->params();
      const bool across = mesh.axis(Axis::Data).hierarchical();
      std::printf("weights and gradients: %s\n",
                  params.one_weight_copy() && across
                      ? "one copy of the weights per node over the data axis (optim.shard_state: the owners' updates "
                        "all-gathered between the nodes' copies), gradients node-shared within each node "
                        "(hierarchical sums: shared memory inside a node, MPI between nodes)"
                  : params.one_weight_copy()
                      ? "one copy of the weights per node over the data axis (optim.shard_state: no all-gather), "
                        "gradients node-shared (the sums read them in place)"
                  : !params.node_shared() ? "private to each rank"
                  : across ? "node-shared within each node over the data axis (hierarchical sums: shared memory inside "
                             "a node, MPI between nodes)"
                           : "node-shared over the data axis (the sums read them in place)");
    }
    model_->set_loss_gradient_in_forward(true);
    if (cfg_.eval.bleu_every > 0) {
      // Decoding is host code (src/decode): on a device it decodes a host copy of the model,
      // refreshed from the trained weights before each evaluation (refresh_host_decoder).
      std::optional<HostSection> host;
      if (buffers_on_device()) {
        host.emplace();
        host_decoder_ = std::make_unique<Transformer<float>>(cfg_, start.table(), placement);
      }
      cached_ = data_group_cached_model(host_decoder_ ? *host_decoder_ : *model_, mesh);
    }
    for (int i = 0; i < model_->first_block(); ++i) first_moe_layer_ += model_->shape().is_moe_block(i);
    model_->init(uint64_t(cfg_.run.seed), cfg_.model.init_scale);
    if (cfg_.run.phase_sync) timers_.set_fence(device_synchronize);
    pipeline_ = std::make_unique<PipelineExecutor>(*model_, mesh, timers_, cfg_.model.recompute);
    const size_t bucket_elems = size_t(cfg_.run.grad_bucket_mb * (1 << 20)) / sizeof(float);
    grad_sync_ = std::make_unique<GradientSync>(
        *model_, mesh, cfg_.run.grad_bucket_mb > 0 ? std::max<size_t>(bucket_elems, 1) : 0, cfg_.model.tied_embeddings,
        &timers_, cfg_.optim.shard_state);
    optimizer_ = make_optimizer(cfg_, model_->params(), grad_sync_->owned_entries(),
                                [this](const ParamInfo& p, int dim, double* buf, size_t n) {
                                  // A block split along `dim`: the expert dimension of [E, ...] expert
                                  // weights is split over data (over the expert group when the experts
                                  // have replicas), every other split dimension over tensor.
                                  const bool expert_dim = (p.sharded_over & kShardData) && dim == 0;
                                  Comm& over = !expert_dim                          ? mesh_.axis(Axis::Tensor)
                                               : (p.sharded_over & kShardReplicas) ? *model_->placement().expert_group
                                                                                   : mesh_.axis(Axis::Data);
                                  over.all_reduce(buf, n, Op::Sum);
                                });
    // run.cuda_graphs: the optimizer's update launched as a device graph (tensor/device_graph.hpp);
    // on the host's backend nothing is queued, so nothing is captured.
    if (cfg_.run.cuda_graphs && device_graphs_supported() && optimizer_->set_update_graph(true) && mesh.rank() == 0)
      std::printf("run.cuda_graphs: the optimizer's update captured at its first step, launched as a device graph\n");
    schedule_ = Schedule::from_config(cfg_);
    batcher_ = std::make_unique<Batcher>(train_, int(cfg_.model.seq_len), uint64_t(cfg_.run.seed), cfg_.data.shuffle,
                                         cfg_.data.temperature, cfg_.model.arch);
    progress_.lang_tokens.assign(train_.info().languages.size(), 0);
    train_too_long_ = batcher_->too_long();
    checkpoints_ = std::make_unique<RunCheckpoints>(deck, version_, mesh, run_dir_, std::move(data_identity),
                                                    model_->params(), *optimizer_, *batcher_, progress_);
    checkpoints_->add_model_state(selection_bias_state(*model_));
    flops_per_token_ = start.plan().flops_per_token;
    planned_bytes_ = double(start.plan().total_bytes());
    params_ = {.total = start.plan().params_total, .activated = start.plan().params_activated};
    // The sgemm ceiling with the run's BLAS threads (applied above), measured by every rank at once so
    // that the ranks of a node share its cores as they do in a step; the mesh's ceiling is the sum.
    if (cfg_.run.peak_gflops > 0) {
      peak_ = cfg_.run.peak_gflops * 1e9;
    } else {
      mesh.world_comm().barrier();
      peak_ = measure_peak_flops();
      mesh.world_comm().all_reduce(&peak_, 1, Op::Sum);
    }
    const std::string memory = start.memory_report(mesh.world());
    if (mesh.rank() == 0) std::fputs(memory.c_str(), stdout);
    checkpoints_->resume();
    if (!opt.init_from.empty() && progress_.start_step == 0) {
      InitFromOptions init = opt.init;
      init.seed = uint64_t(cfg_.run.seed);
      init_from(opt.init_from, init, model_->params(), mesh_);
    }
    write_deck_file(deck, dir_, mesh.world());
    log_ = std::make_unique<StepLog>(deck, dir_, mesh, model_->shape(), timers_, *pipeline_, flops_per_token_, peak_);
    agree_on_input(mesh.world(), [&] {  // metrics.h5 that cannot be continued stops every rank (StepLog::open)
      if (mesh.rank() == 0)
        log_->open(progress_.start_step, train_.info().languages, version_, train_too_long_,
                   valid_too_long_, batcher_->language_probabilities());
    });
  }

  int run() {
    const int64_t steps = cfg_.run.steps;
    if (mesh_.rank() == 0)
      log_->header(blas_threads_, train_, valid_, vocab_, params_, model_->params().size(), train_too_long_,
                   valid_too_long_);
    clock_.emplace(wall_seconds());
    run_start_ = clock_->start();
    // Test hook (tests/scripts/decode_bounds.sh): MESHMOE_TEST_DELAY_FIRST_STEP seconds of sleep
    // before the first step, so that run.max_walltime is reached there every time.
    if (const char* delay = std::getenv("MESHMOE_TEST_DELAY_FIRST_STEP"))
      std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(delay)));
    int64_t interval_tokens = 0;
    const int64_t first = progress_.start_step + 1;
    int64_t done = progress_.start_step;  // the last step whose update (or skip) is complete
    try {
      // An evaluation a stop request interrupted is done first, so that metrics.h5 holds what an
      // uninterrupted run's does.
      if (progress_.eval_pending) {
        if (const int why = evaluate(progress_.start_step)) return checkpoints_->stop(progress_.start_step, why);
        progress_.eval_pending = false;
      }
      for (int64_t step = first; step <= steps; ++step) {
        const HostWaits waits_before = host_waits();
        if (const int why = stop_requested()) return checkpoints_->stop(step - 1, why);
        const StepStats s = train_step(step);
        if (step == first) cuda_profile_restart();  // MESHMOE_DEVICE_PROFILE: the steps after start-up
        // The kernel keeps no peak of Pss (VmHWM counts shared pages whole on every rank): it is
        // sampled where the plan's bytes are all live, after the first step (activations, the
        // backward's workspace and the stashes stay allocated for the next step, the optimizer
        // state exists from its first update), and at the end of the run (evaluation, checkpoint).
        if (step == first) peak_pss_ = std::max(peak_pss_, pss_bytes());
        done = step;
        interval_tokens += int64_t(cfg_.optim.batch_size) * cfg_.model.seq_len;
        if (step % cfg_.run.log_every == 0 || step == steps || s.skipped || s.empty) {
          const double now = wall_seconds();
          log_->step(step, s, clock_->interval_tokens_per_s(now, interval_tokens), eta(now, step, first),
                     progress_.lang_tokens);
          clock_->start_interval(wall_seconds());
          interval_tokens = 0;
        }
        report_host_waits(step, host_waits() - waits_before);
        if (progress_.bad_steps >= cfg_.run.max_bad_steps) {
          if (mesh_.rank() == 0)
            std::fprintf(stderr,
                         "meshmoe: error: %lld consecutive non-finite steps (run.max_bad_steps) up to step %lld; "
                         "stopping with the parameters of the last good step%s\n",
                         (long long)progress_.bad_steps, (long long)step, pipeline_->first_nonfinite().empty() ? "" : " (see the warnings for the first non-finite layer)");
          checkpoints_->save(step - progress_.bad_steps, &progress_.good_cursor);
          return kExitFailure;
        }
        if (due(cfg_.eval.every, step) || due(cfg_.eval.bleu_every, step))
          if (const int why = evaluate(step)) {
            progress_.eval_pending = true;  // recorded in the checkpoint: the resumed run evaluates this step first
            return checkpoints_->stop(step, why);
          }
        if ((cfg_.checkpoint.every > 0 && step % cfg_.checkpoint.every == 0) || (step == steps && cfg_.checkpoint.at_end)) {
          const double begin = wall_seconds();
          // Test hook (tests/scripts/ckpt_clock.sh): MESHMOE_TEST_CHECKPOINT_SLEEP seconds of sleep
          // in each checkpoint's write, so that its time out of tok/s is seen.
          if (const char* sleep = std::getenv("MESHMOE_TEST_CHECKPOINT_SLEEP"))
            std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(sleep)));
          const bool saved = checkpoints_->save(step);
          clock_->add_checkpoint(wall_seconds() - begin);
          if (!saved) return kExitFailure;
        }
      }
    } catch (const InputError&) {
      checkpoints_->save_before_failure(done);
      throw;
    } catch (const AgreedFailure&) {
      checkpoints_->save_before_failure(done);
      throw;
    }
    if (hooks_)
      hooks_->after_run(
          [&] {
            return meshmoe::evaluate(eval_set_, train_.info().languages.size(), cfg_, steps, *model_, *pipeline_, mesh_,
                                     [] { return 0; });
          },
          [&](const std::map<std::string, double>& scalars) { log_->record(steps, scalars); });
    peak_pss_ = std::max(peak_pss_, pss_bytes());
    const std::string measured = measured_memory_line(peak_pss_, planned_bytes_, mesh_.world());
    if (mesh_.rank() == 0) std::fputs(measured.c_str(), stdout);
    log_->done(wall_seconds() - run_start_);
    return kExitOk;
  }

 private:
  // MESHMOE_TEST_HOST_WAITS (tests only): this rank's waits for the device in the step (HostWaits,
  // tensor/device.hpp), from its boundary through its update and its logged line.
  void report_host_waits(int64_t step, const HostWaits& w) const {
    static const bool on = std::getenv("MESHMOE_TEST_HOST_WAITS") != nullptr;
    if (!on) return;
    std::fprintf(stderr, "meshmoe: host waits: rank %d step %lld: %zu (%zu copies to the host, %zu other waits)\n",
                 mesh_.rank(), (long long)step, w.total(), w.copies, w.synchronize);
  }

  // At a step boundary all ranks agree whether to stop: a signal on any rank (1) or the wall-time
  // limit run.max_walltime (2).
  int stop_requested() {
    int why = stop_signal_received() ? 1 : 0;
    if (cfg_.run.max_walltime > 0 && wall_seconds() - run_start_ >= cfg_.run.max_walltime) why = std::max(why, 2);
    mesh_.world_comm().all_reduce(&why, 1, Op::Max);
    return why;
  }

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
    LossWeights w = loss_weights(mask_total, double(B) * T);

    auto& P = model_->params();
    P.zero_grad();
    StepSums sums(size_t(model_->shape().num_moe_layers()), size_t(cfg_.moe.num_experts));
    std::vector<Micro> micros = micro_batches(batch, step, true, &timers_);
    if (cfg_.debug.nan_step > 0 && step >= cfg_.debug.nan_step && step < cfg_.debug.nan_step + cfg_.debug.nan_steps &&
        mesh_.rank() == cfg_.debug.nan_rank)
      model_->inject_nan_next_forward();
    const auto moe = model_->moe_layers();
    const size_t last_micro_tokens = size_t(B / cfg_.optim.micro_batches) * T;  // all data ranks' rows
    if (hooks_) hooks_->before_loss(micros, w, timers_);
    grad_sync_->begin_step(int(micros.size()), std::span(batch.inputs).last(last_micro_tokens));
    // The step's scalars (each forward's losses, routing totals and finite flags, the gradient
    // norm's sums) reach the host in one copy, where the norm is read: until then each is a copy
    // queued on the device and the host's work on it waits in order (tensor/step_scalars.hpp;
    // docs/ARCHITECTURE.md "Device work and transfer points"). So `sums` fills at global_norm().
    StepScalars::Collect scalars(step_scalars());
    pipeline_->train(micros, w, [&](const ForwardStats& f) { sums.add(f, moe, first_moe_layer_); });
    {
      ScopedPhase t(&timers_, "grad_allreduce");  // with buckets: what the backward did not hide
      pipeline_->sync_tied_embedding(cfg_.model.tied_embeddings);
      grad_sync_->reduce_over_data();
    }
    ScopedPhase t(&timers_, "optimizer");
    const double grad_norm = grad_sync_->global_norm();  // the read of the step's scalars
    sums.all_reduce(mesh_.axis(Axis::Pipe), data_comm_);
    StepStats s = sums.stats(double(B) * T, double(B) * T / double(cfg_.moe.group_size));
    s.distill = hooks_ != nullptr;
    s.grad_norm = grad_norm;
    s.lr = schedule_(step);
    if (!std::isfinite(s.grad_norm) || (sums.target_tokens() > 0 && !std::isfinite(s.loss))) {
      s.skipped = true;
      ++progress_.bad_steps;
      if (mesh_.rank() == 0)
        std::fprintf(stderr, "meshmoe: warning: step %lld: non-finite loss or gradient norm; update skipped (%lld in a row)\n",
                     (long long)step, (long long)progress_.bad_steps);
      if (!pipeline_->first_nonfinite().empty())
        std::fprintf(stderr, "meshmoe: warning: step %lld: rank %d: first non-finite output: %s\n", (long long)step,
                     mesh_.rank(), pipeline_->first_nonfinite().c_str());
      std::fflush(stderr);
      return s;
    }
    progress_.bad_steps = 0;
    progress_.good_cursor = batcher_->cursor();
    ++progress_.updates;
    count_lang_tokens(batch);
    // t counts applied updates (bias correction); the clipping factor is applied as the update reads g
    optimizer_->step(P, s.lr, progress_.updates, clip_scale(s.grad_norm, cfg_.optim.grad_clip));
    grad_sync_->gather_params();                   // optim.shard_state: the owners' updates to every data rank
    update_selection_biases(s);
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
    ++progress_.empty_steps;
    progress_.bad_steps = 0;
    progress_.good_cursor = batcher_->cursor();
    if (mesh_.rank() == 0) {
      std::fprintf(stderr, "meshmoe: warning: step %lld: no target token in the batch; no update (%lld empty steps so far)\n",
                   (long long)step, (long long)progress_.empty_steps);
      std::fflush(stderr);
    }
    return s;
  }

  // moe.balance = bias: each MoE layer of this stage moves its selection biases by the step's loads,
  // summed over every rank's tokens (StepSums), so all ranks keep the same biases. Skipped and
  // empty steps leave them as they are, as they leave the parameters.
  void update_selection_biases(const StepStats& s) {
    if (cfg_.moe.balance != BalanceKind::Bias) return;
    size_t l = first_moe_layer_;
    for (auto& b : model_->blocks())
      if (b.moe) b.moe->router.update_bias(s.load_count[l++]);
  }

  // The global batch's target tokens per language into the run's counts (TrainProgress::lang_tokens).
  void count_lang_tokens(const Batch& batch) {
    for (size_t i = 0; i < batch.mask.size(); ++i)
      if (batch.mask[i] != 0 && batch.lang[i] >= 0) ++progress_.lang_tokens[size_t(batch.lang[i])];
  }

  LossWeights loss_weights(double mask_total, double tokens) const {
    LossWeights w;
    w.ce = 1.0 / std::max(1.0, mask_total);
    w.aux = balance_loss_weight(cfg_.moe.balance, cfg_.moe.aux_loss_coef, tokens, cfg_.moe.group_size);
    w.z = z_loss_weight(cfg_.moe.z_loss_coef, tokens);
    return w;
  }

  // Seconds left at the log of `step` (the run's first step `first`), the evaluations due from this
  // step's on included (RunClock). An evaluation not yet timed counts as the forwards of its tokens,
  // a third of a training step's FLOPs per token each: a validation its batches, translation scores
  // their pairs' tokens (translation_forward_tokens; a lower bound: decoding a token at a time runs
  // below the training's rate).
  double eta(double now, int64_t step, int64_t first) const {
    const int64_t steps = cfg_.run.steps;
    const int64_t left[2] = {evaluations_due(cfg_.eval.every, step, steps), evaluations_due(cfg_.eval.bleu_every, step, steps)};
    const int64_t B = cfg_.optim.batch_size;
    const double batches = cfg_.eval.examples_per_language > 0 ? double((int64_t(eval_set_.num_examples()) + B - 1) / B)
                                                               : double(cfg_.eval.batches);
    const double step_tokens = double(B) * double(cfg_.model.seq_len);
    const double steps_estimate[2] = {batches / 3.0, double(bleu_tokens_) / (3.0 * step_tokens)};
    return clock_->eta(now, step - first + 1, steps - first + 1, left, steps_estimate);
  }

  // Whether something done every `every` steps (0: never) is due at `step`: its multiples and the last step.
  bool due(int64_t every, int64_t step) const { return every > 0 && (step % every == 0 || step == cfg_.run.steps); }

  // What is due at `step`: validation (eval.every) and translation scores (eval.bleu_every). A stop
  // request during either (signal, run.max_walltime) returns its reason at once, and nothing of
  // the unfinished part is logged; 0 when done.
  int evaluate(int64_t step) {
    if (due(cfg_.eval.every, step))
      if (const int why = evaluate_loss(step)) return why;
    if (due(cfg_.eval.bleu_every, step)) return evaluate_bleu(step);
    return 0;
  }

  // Validation (src/train/evaluate.hpp).
  int evaluate_loss(int64_t step) {
    const double start = wall_seconds();
    const Evaluation e = meshmoe::evaluate(eval_set_, train_.info().languages.size(), cfg_, step, *model_, *pipeline_, mesh_,
                                           [this] { return stop_requested(); });
    if (e.stopped) {
      if (mesh_.rank() == 0)
        std::fprintf(stderr, "meshmoe: evaluation of step %lld interrupted after %lld batches (not recorded)\n",
                     (long long)step, (long long)e.batches);
      return e.stopped;
    }
    clock_->add_evaluation(RunClock::kValidation, wall_seconds() - start);
    log_->eval(step, e, start);
    return 0;
  }

  // Greedy translations of eval.bleu_examples validation pairs of every language (per_language_sample), scored
  // (src/decode/translation_eval.hpp). Decoding runs the model in evaluation mode and keeps no
  // state that a training step reads, so the training is the same with it and without.
  int evaluate_bleu(int64_t step) {
    const double start = wall_seconds();
    std::vector<size_t> which;
    for (size_t l = 0; l < bleu_pairs_.size(); ++l)
      if (!bleu_pairs_[l].sources.empty()) which.push_back(l);
    BeamOptions greedy;
    greedy.beam = 1;
    int stopped = 0;
    std::optional<HostSection> host;
    if (host_decoder_) {
      refresh_host_decoder();
      host.emplace();
    }
    const std::vector<TranslationScore> scores = translate_and_score(
        *cached_, data_comm_, tokenizer_, bleu_pairs_, which, greedy, kBleuBatch, [this] { return stop_requested(); }, {}, &stopped);
    if (stopped) {
      if (mesh_.rank() == 0)
        std::fprintf(stderr, "meshmoe: translation scores of step %lld interrupted (not recorded)\n", (long long)step);
      return stopped;
    }
    clock_->add_evaluation(RunClock::kTranslation, wall_seconds() - start);
    log_->bleu(step, scores, start);
    return 0;
  }
  // The trained weights and the routers' selection biases into the host copy that decodes.
  void refresh_host_decoder() {
    copy_to_host(host_decoder_->params().weights(), model_->params().weights(), model_->params().size() * sizeof(float));
    const std::vector<StateTensor> from = selection_bias_state(*model_), to = selection_bias_state(*host_decoder_);
    for (size_t i = 0; i < from.size(); ++i)
      copy_to_host(to[i].data->data(), from[i].data->data(), from[i].data->size() * sizeof(float));
  }
  std::string version_;
  TrainHooks* hooks_ = nullptr;
  const Config& cfg_;
  Mesh& mesh_;
  Comm& data_comm_;
  std::string dir_;
  RunDirectory run_dir_;  // locked for this run; checked to be the same directory on every rank
  Dataset train_, valid_;
  Dataset eval_set_;  // valid_, or eval.examples_per_language examples of every language (eval_subset)
  Tokenizer tokenizer_;                // eval.bleu_every: the dataset's
  std::vector<TextPairs> bleu_pairs_;  // eval.bleu_every: the pairs translated, per language
  int64_t bleu_tokens_ = 0;            // eval.bleu_every: translation_forward_tokens of bleu_pairs_
  int vocab_ = 0;
  std::unique_ptr<Transformer<float>> model_;
  std::unique_ptr<Transformer<float>> host_decoder_;  // eval.bleu_every on a device: model_'s host copy
  std::unique_ptr<CachedModel<float>> cached_;        // eval.bleu_every: decodes with model_ or host_decoder_
  std::unique_ptr<PipelineExecutor> pipeline_;
  std::unique_ptr<GradientSync> grad_sync_;
  std::unique_ptr<Optimizer> optimizer_;
  Schedule schedule_;
  std::unique_ptr<Batcher> batcher_;
  double planned_bytes_ = 0, peak_pss_ = 0;  // this rank's memory plan and its measured peak Pss
  TrainProgress progress_;  // steps, updates, bad steps: what a checkpoint records
  std::unique_ptr<RunCheckpoints> checkpoints_;
  std::unique_ptr<StepLog> log_;
  PhaseTimers timers_;
  double flops_per_token_ = 0, peak_ = 0;
  ModelParamCounts params_;  // the whole model's, for the banner
  double run_start_ = 0;  // wall_seconds() when run() began (run.max_walltime)
  std::optional<RunClock> clock_;  // tok/s and ETA with the evaluations apart
  int blas_threads_ = 1;
  TooLong train_too_long_, valid_too_long_;  // examples the sequences truncate or drop
  size_t first_moe_layer_ = 0;  // global index of this stage's first MoE layer
};

}  // namespace

int train_main(const Deck& deck, Mesh& mesh, const Startup& start, const std::string& version, const TrainOptions& opt) {
  Trainer trainer(deck, mesh, start, version, opt);
  return trainer.run();
}

}  // namespace meshmoe
