#include "train/distill.hpp"

#include <cmath>
#include <cstdio>
#include <memory>

#include "core/error.hpp"
#include "core/timers.hpp"
#include "mesh/agree.hpp"
#include "model/cross_entropy_bodies.hpp"
#include "parallel/pipeline_executor.hpp"
#include "tensor/launch_rows.hpp"
#include "checkpoint/checkpoint.hpp"
#include "run/run_checkpoints.hpp"
#include "run/run_data.hpp"
#include "train/trainer.hpp"

namespace meshmoe {

double preserved_fraction(double teacher_loss, double student_loss, double baseline_loss) {
  const double gain = baseline_loss - teacher_loss;
  return gain > kMinTeacherGain * std::abs(baseline_loss) ? (baseline_loss - student_loss) / gain : std::nan("");
}

namespace {

// A trained model for forward passes on the student's mesh and batches: the deck stored in its
// checkpoint (mesh and device replaced by the student's), its parameters (and routers' selection
// biases) from the file.
struct FrozenModel {
  std::string path;
  Config cfg;
  std::unique_ptr<Transformer<float>> model;
  std::unique_ptr<PipelineExecutor> pipeline;  // its forwards over the pipe axis (its own stage split)
  PhaseTimers timers;                          // not logged
};

// `what`: "--teacher" or "--baseline", for the messages. Collective; every refusal is an
// InputError on every rank alike.
std::unique_ptr<FrozenModel> load_frozen(const std::string& what, const std::string& given, const Config& student,
                                         int vocab, bool allow_other_data, Mesh& mesh) {
  auto f = std::make_unique<FrozenModel>();
  CheckpointMeta head;
  f->path = resolve_named_checkpoint(given, what, mesh.world());
  // Its probabilities are over the student's tokens only if it learnt the student's data.
  check_checkpoint_data(what, f->path, student.data.path, allow_other_data, mesh.world());
  agree_on_input(mesh.world(), [&] {
    head = read_checkpoint_meta(f->path);
    if (head.deck.empty()) throw InputError(what + " " + f->path + " stores no deck (written by an older version)");
  });
  f->cfg = parse_deck(head.deck, f->path + ":/meta/deck").cfg;
  Config& c = f->cfg;
  c.mesh = student.mesh;
  c.run.device = student.run.device;
  c.data = student.data;
  c.optim.batch_size = student.optim.batch_size;  // its batches are the student's
  c.optim.micro_batches = student.optim.micro_batches;
  std::string why;
  if (c.model.arch != student.model.arch)
    why = "its model.arch = " + std::string(option_name(c.model.arch)) + ", the deck's " + std::string(option_name(student.model.arch));
  else if (c.model.seq_len != student.model.seq_len)
    why = "its model.seq_len = " + std::to_string(c.model.seq_len) + ", the deck's " + std::to_string(student.model.seq_len);
  else if (c.model.vocab_size != student.model.vocab_size)
    why = "its model.vocab_size = " + std::to_string(c.model.vocab_size) + ", the deck's " +
          std::to_string(student.model.vocab_size);
  if (!why.empty())
    throw InputError(what + " " + f->path + " reads other batches than the deck's model (" + why +
                     "): the teacher, the baseline and the student must share the sequences and the vocabulary");
  // Its start-up on the deck's mesh (run/startup.hpp): its experts, heads and routing groups must
  // divide over the deck's mesh and batch.
  const Startup start = [&] {
    try {
      return Startup::forward_only(c, vocab, mesh, true);
    } catch (const InputError& e) {
      throw InputError(what + " " + f->path + " does not fit the deck's mesh and batch: " + e.what());
    }
  }();
  f->model = std::make_unique<Transformer<float>>(c, start.table(), start.placement_on(mesh));
  std::vector<StateTensor> state = selection_bias_state(*f->model);
  read_checkpoint(f->path, f->model->params(), state, mesh.world());
  f->pipeline = std::make_unique<PipelineExecutor>(*f->model, mesh, f->timers);
  return f;
}

class Distiller : public TrainHooks {
 public:
  Distiller(const Config& student, int vocab, Mesh& mesh, const DistillOptions& opt)
      : student_(student), mesh_(mesh), vocab_(vocab), alpha_(student.distill.alpha) {
    teacher_ = load_frozen("--teacher", opt.teacher, student, vocab, opt.allow_other_data, mesh);
    if (!opt.baseline.empty())
      baseline_ = load_frozen("--baseline", opt.baseline, student, vocab, opt.allow_other_data, mesh);
    if (mesh.rank() == 0) {
      std::printf("distill: teacher %s (%zu parameters on this rank), alpha %.3g%s%s\n", teacher_->path.c_str(),
                  teacher_->model->params().size(), alpha_, baseline_ ? ", baseline " : "",
                  baseline_ ? baseline_->path.c_str() : "");
      std::fflush(stdout);
    }
  }
  const std::string& teacher_path() const { return teacher_->path; }

  // The teacher's forward of each micro-batch in evaluation mode (no dropout, jitter or random
  // routing; moe.capacity_factor_eval), through its own stages on a pipeline (forward_only: one
  // micro-batch after another, before the student's 1F1B schedule uses the pipe axis); on the
  // last stage, where the student's loss is, its logits turned into probabilities.
  void before_loss(std::vector<Micro>& micros, LossWeights& w, PhaseTimers& timers) override {
    ScopedPhase t(&timers, "teacher_forward");
    Transformer<float>& teacher = *teacher_->model;
    probs_.resize(micros.size());
    for (size_t m = 0; m < micros.size(); ++m) {
      StepContext ctx = micros[m].ctx;
      ctx.training = false;
      ctx.timers = nullptr;  // the student's phases stay the student's
      teacher_->pipeline->forward_only(micros[m], int(m), ctx);
      if (!teacher.last_stage()) continue;
      const Buffer<float>& logits = teacher.logits();
      probs_[m].resize(logits.size());
      const int N = micros[m].rows.rows * micros[m].rows.seq_len;
      for_each_row(N, SoftmaxRow<float>{logits.data(), probs_[m].data(), vocab_}, 2 * int64_t(vocab_));
      micros[m].soft_targets = probs_[m].data();
    }
    w.distill_alpha = alpha_;
  }

  void after_run(const std::function<Evaluation()>& student,
                 const std::function<void(const std::map<std::string, double>&)>& record) override {
    const double teacher = evaluate_frozen(*teacher_);
    const double learnt = student().loss();
    std::map<std::string, double> row{{"distill/teacher_loss", teacher}, {"distill/student_loss", learnt}};
    char line[256];
    std::snprintf(line, sizeof line, "distill: validation loss (nats/token): teacher %.4f | student %.4f", teacher, learnt);
    std::string report = line;
    if (baseline_) {
      const double base = evaluate_frozen(*baseline_);
      const double kept = preserved_fraction(teacher, learnt, base);
      row["distill/baseline_loss"] = base;
      row["distill/preserved"] = kept;
      if (std::isfinite(kept))
        std::snprintf(line, sizeof line, " | baseline %.4f | the student keeps %.1f%% of the teacher's gain over the baseline",
                      base, 100 * kept);
      else
        std::snprintf(line, sizeof line,
                      " | baseline %.4f | the teacher is no better than the baseline (by less than %g%% of its loss): "
                      "no share of its gain to keep",
                      base, 100 * kMinTeacherGain);
      report += line;
    }
    record(row);
    if (mesh_.rank() == 0) {
      std::printf("%s\n", report.c_str());
      std::fflush(stdout);
    }
  }

 private:
  // Validation loss on the student's validation sample (its deck's eval keys and batches).
  double evaluate_frozen(FrozenModel& f) {
    const Dataset valid = open_split(student_.data.path, "valid", mesh_.world());
    const Dataset sample = eval_subset(valid, student_.eval.examples_per_language);
    return evaluate(sample, valid.info().languages.size(), student_, student_.run.steps, *f.model, *f.pipeline, mesh_,
                    [] { return 0; })
        .loss();
  }

  const Config& student_;
  Mesh& mesh_;
  int vocab_;
  double alpha_;
  std::unique_ptr<FrozenModel> teacher_, baseline_;
  std::vector<Buffer<float>> probs_;  // [micro-batch][N, V] the teacher's probabilities of the step
};

}  // namespace

int distill_main(const Deck& deck, Mesh& mesh, const Startup& start, const std::string& version, const DistillOptions& opt) {
  const Config& cfg = deck.cfg;
  if (cfg.run.device != Device::Cpu)
    throw InputError("distill runs on the host only for now (the teacher's probabilities are made by host loops): use --set run.device=cpu");
  // The data's errors, a vocabulary smaller than the data's included, come before a teacher loads;
  // the split is let go before the Trainer reads it again.
  start.agree_vocab(model_vocab(cfg, open_split(cfg.data.path, "train", mesh.world())), mesh.world());
  Distiller distiller(cfg, start.vocab(), mesh, opt);
  TrainOptions topt;
  topt.init_from = distiller.teacher_path();  // Switch 4.2: the student starts from the teacher's non-expert weights
  topt.init.partial = true;  // a student of another width keeps what does not fit at its initialisation
  topt.hooks = &distiller;
  return train_main(deck, mesh, start, version, topt);
}

}  // namespace meshmoe
