#include "run/run_checkpoints.hpp"

#include <cstdio>
#include <filesystem>
#include <string_view>

#include "core/error.hpp"
#include "core/timers.hpp"
#include "deck/deck.hpp"
#include "mesh/agree.hpp"
#include "mesh/comm.hpp"
#include "model/transformer.hpp"

namespace meshmoe {

namespace {

// The sentences of the difference between the data a checkpoint records and `now`.
std::string data_difference(const CheckpointMeta& head, const DatasetIdentity& now) {
  const DatasetIdentity then{head.data_path, head.data_summary, head.data_fingerprint, split_languages(head.data_languages)};
  std::string text;
  for (const auto& d : now.differences_from(then)) text += "\n  " + d;
  return text;
}

}  // namespace

void check_checkpoint_data(const std::string& option, const std::string& path, const std::string& data_path,
                           bool allow_other, MPI_Comm world) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::string error;
  if (rank == 0) try {
      const CheckpointMeta head = read_checkpoint_meta(path);
      if (!head.data_fingerprint.empty()) {
        const DatasetIdentity now =
            dataset_identity(data_path, Dataset::open(data_path, "train"), Dataset::open(data_path, "valid"));
        if (const std::string diff = data_difference(head, now); !diff.empty()) {
          const std::string what = option + " " + path + " was trained on other data than data.path = " + data_path +
                                   " (it records " + head.data_path + "):" + diff;
          if (!allow_other)
            error = what + "\n  its tokens, language table and per-language counts belong to that data: set data.path = " +
                    head.data_path + ", or give --allow-other-data to use it on this data anyway";
          else
            std::fprintf(stderr, "meshmoe: warning: %s\n  going on (--allow-other-data): the tokens are read as this "
                                 "data's tokenizer reads them, and the per-language trained tokens are reported by "
                                 "index into this data's language table\n", what.c_str());
        }
      }
    } catch (const std::exception& e) {
      error = option + " " + path + ": cannot compare its data with data.path = " + data_path + ": " + e.what();
    }
  if (const std::string e = first_error(error, world); !e.empty()) throw InputError(e);
}

RunCheckpoints::RunCheckpoints(const Deck& deck, std::string version, Mesh& mesh, const RunDirectory& run_dir,
                               DatasetIdentity data, ParamStore<float>& params, Optimizer& optimizer, Batcher& batcher,
                               TrainProgress& progress)
    : deck_(deck),
      cfg_(deck.cfg),
      version_(std::move(version)),
      mesh_(mesh),
      run_dir_(run_dir),
      ckpt_dir_(run_dir.path() + "/ckpt"),
      data_identity_(std::move(data)),
      params_(params),
      optimizer_(optimizer),
      batcher_(batcher),
      progress_(progress) {}

std::vector<StateTensor> selection_bias_state(Transformer<float>& model) {
  std::vector<StateTensor> out;
  int i = model.first_block();
  for (auto& b : model.blocks()) {
    if (b.moe && !b.moe->router.selection_bias.empty()) {
      const int64_t E = int64_t(b.moe->router.selection_bias.size());
      out.push_back({"blocks." + std::to_string(i) + ".moe.router/selection_bias", {E}, {E}, {0},
                     &b.moe->router.selection_bias});
    }
    ++i;
  }
  return out;
}

std::vector<StateTensor> RunCheckpoints::state() const {
  std::vector<StateTensor> s = optimizer_.state();
  s.insert(s.end(), model_state_.begin(), model_state_.end());
  return s;
}

void RunCheckpoints::resume() {
  std::string path;
  int continues = 0;
  if (cfg_.run.resume.kind == ResumeFrom::Kind::Auto) {
    const ResumeChoice c = find_resume_checkpoint(ckpt_dir_, mesh_.world());
    if (mesh_.rank() == 0)
      for (const auto& w : c.warnings) std::fprintf(stderr, "meshmoe: warning: %s\n", w.c_str());
    path = c.path;
    continues = !path.empty();
  } else if (cfg_.run.resume.kind == ResumeFrom::Kind::Path) {
    path = cfg_.run.resume.path;
    if (mesh_.rank() == 0) {
      const auto mine = list_checkpoints(ckpt_dir_);
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
    if (head.optimizer != option_name(cfg_.optim.name))
      throw InputError("checkpoint " + path + " holds " + head.optimizer + " state but optim.name = " + std::string(option_name(cfg_.optim.name)) +
                       " (set run.resume = never to start afresh)");
    if (head.step > cfg_.run.steps)
      throw InputError("checkpoint " + path + " is at step " + std::to_string(head.step) + ", beyond run.steps = " +
                       std::to_string(cfg_.run.steps));
    check_same_data(path, head);
    const std::vector<DeckChange> changes = changes_since(path, head);
    std::vector<StateTensor> state = this->state();
    CheckpointMeta m;
    try {
      m = read_checkpoint(path, params_, state, mesh_.world());
    } catch (const InputError& e) {
      const std::string keys = describe_changes(changes, true);
      if (keys.empty() || std::string_view(e.what()).rfind(kIncompatibleModel, 0) != 0) throw;
      throw InputError(std::string(e.what()) + "\nthe deck differs from the checkpoint's in:" + keys +
                       "\na model cannot change shape on resume: set these keys back, or run.resume = never to start afresh");
    }
    report_changes(changes, head.step);
    batcher_.restore(m.data_cursor);
    progress_.good_cursor = m.data_cursor;
    progress_.start_step = m.step;
    last_checkpoint_ = continues ? m.step : 0;
    progress_.updates = m.update_count;
    if (auto it = m.counters.find("bad_steps"); it != m.counters.end()) progress_.bad_steps = it->second;
    if (auto it = m.counters.find("empty_steps"); it != m.counters.end()) progress_.empty_steps = it->second;
    // A checkpoint from before the per-language counts (or of another language table) restarts them.
    if (m.lang_tokens.size() == progress_.lang_tokens.size()) progress_.lang_tokens = m.lang_tokens;
    if (auto it = m.counters.find("eval_pending"); it != m.counters.end())
      progress_.eval_pending = it->second != 0 && (cfg_.eval.every > 0 || cfg_.eval.bleu_every > 0);
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

std::vector<DeckChange> RunCheckpoints::changes_since(const std::string& path, const CheckpointMeta& head) {
  if (head.deck.empty()) return {};
  std::vector<DeckChange> changes;
  std::string unreadable;
  try {
    changes = deck_changes(parse_deck(head.deck, path + ":/meta/deck").cfg, cfg_);
  } catch (const InputError& e) {  // a deck of another version's schema: nothing to compare with
    unreadable = e.what();
  }
  if (mesh_.rank() == 0 && !unreadable.empty())
    std::fprintf(stderr, "meshmoe: note: the deck stored in %s does not parse with this version, so its changes are not listed:\n%s\n",
                 path.c_str(), unreadable.c_str());
  return changes;
}

void RunCheckpoints::report_changes(const std::vector<DeckChange>& changes, int64_t step) const {
  if (mesh_.rank() != 0) return;
  if (const std::string s = describe_changes(changes, false); !s.empty())
    std::printf("deck changed since the checkpoint (run length, mesh, output):%s\n", s.c_str());
  if (const std::string s = describe_changes(changes, true); !s.empty())
    std::fprintf(stderr, "meshmoe: warning: resuming with a deck that trains differently from the checkpoint's from step %lld on:%s\n",
                 (long long)step, s.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
}

void RunCheckpoints::check_same_data(const std::string& path, const CheckpointMeta& head) {
  std::string error;
  if (mesh_.rank() == 0 && !head.data_fingerprint.empty()) {
    if (const std::string diff = data_difference(head, data_identity_); !diff.empty()) {
      error = "checkpoint " + path + " was trained on other data:" + diff;
      error += "\n  its data cursor and per-language metrics belong to that data: set data.path back to " +
               head.data_path + ", or start afresh (run.resume = \"never\" moves the earlier run aside)";
    } else if (head.data_path != cfg_.data.path) {
      std::printf("data.path changed from %s to %s: the same data (fingerprint %s)\n", head.data_path.c_str(),
                  cfg_.data.path.c_str(), head.data_fingerprint.c_str());
    }
  }
  if (const std::string e = first_error(error, mesh_.world()); !e.empty()) throw InputError(e);
}

bool RunCheckpoints::save(int64_t step, const DataCursor* cursor) {
  if (step <= 0 || step == last_checkpoint_) return true;
  const double t0 = wall_seconds();
  CheckpointMeta m;
  m.step = step;
  m.update_count = progress_.updates;
  m.seed = uint64_t(cfg_.run.seed);
  m.data_cursor = cursor ? *cursor : batcher_.cursor();
  m.optimizer = option_name(cfg_.optim.name);
  m.deck = deck_.effective_toml;
  m.version = version_;
  m.counters = {{"bad_steps", cursor ? 0 : progress_.bad_steps},
                {"eval_pending", progress_.eval_pending ? 1 : 0},
                {"empty_steps", progress_.empty_steps}};
  m.lang_tokens = progress_.lang_tokens;
  m.lineage = lineage_;
  m.forked_from = forked_from_;
  m.data_path = data_identity_.path;  // rank 0's meta is the one written
  m.data_summary = data_identity_.summary;
  m.data_fingerprint = data_identity_.fingerprint;
  m.data_languages = join_languages(data_identity_.languages);
  std::string path;
  try {
    path = write_checkpoint(ckpt_dir_, params_, state(), m, mesh_,
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

int RunCheckpoints::stop(int64_t last_step, int why) {
  const bool nothing_new = last_step <= 0 || last_step == last_checkpoint_;
  // run.max_walltime before the first step of this start: a requeued job would start, stop and
  // requeue forever without a step. Not 75 (docs/user-guide.md "Exit codes").
  if (why == 2 && last_step == progress_.start_step) {
    if (mesh_.rank() == 0)
      std::fprintf(stderr, "meshmoe: error: run.max_walltime = %g s reached before the first step of this start (step %lld): "
                   "no progress; exiting with code %d, not %d, so that a requeued job does not loop: raise "
                   "run.max_walltime\n", cfg_.run.max_walltime, (long long)last_step, int(kExitFailure), int(kExitCheckpointed));
    if (!nothing_new) save(last_step);
    return kExitFailure;
  }
  if (nothing_new) {
    if (mesh_.rank() == 0)
      std::fprintf(stderr, "meshmoe: %s before the first step of this start (step %lld): nothing to checkpoint%s; "
                   "exiting with code %d (resume to continue)\n", why == 1 ? "stop signal received" : "run.max_walltime reached",
                   (long long)last_step, last_step > 0 ? " (the checkpoint of that step is where a resume starts)" : "",
                   int(kExitCheckpointed));
    return kExitCheckpointed;
  }
  if (mesh_.rank() == 0)
    std::fprintf(stderr, "meshmoe: %s after step %lld: writing a checkpoint and exiting with code %d (resume to continue)\n",
                 why == 1 ? "stop signal received" : "run.max_walltime reached", (long long)last_step, int(kExitCheckpointed));
  if (!save(last_step)) return kExitFailure;
  return kExitCheckpointed;
}

void RunCheckpoints::save_before_failure(int64_t done) {
  if (done <= last_checkpoint_) return;
  if (mesh_.rank() == 0)
    std::fprintf(stderr, "meshmoe: writing a checkpoint of step %lld before stopping on the error below\n", (long long)done);
  save(done);
}

}  // namespace meshmoe

namespace meshmoe {

void init_from(const std::string& given, const InitFromOptions& opt, ParamStore<float>& params, Mesh& mesh) {
  const std::string path = resolve_named_checkpoint(given, "--init-from", mesh.world());
  const InitFromResult r = init_from_checkpoint(path, params, mesh.world(), opt);
  if (mesh.rank() != 0) return;
  std::printf("init from %s: %zu parameters copied", path.c_str(), r.copied.size());
  if (opt.upcycle) std::printf(", %zu upcycled (each expert the dense feed-forward)", r.upcycled.size());
  const size_t left = r.kept.size() + r.mismatched.size();
  std::printf(", %zu kept at their initialisation", left);
  for (size_t i = 0; i < r.kept.size(); ++i) std::printf("%s%s", i == 0 ? " (" : ", ", r.kept[i].c_str());
  std::printf("%s\n", r.kept.empty() ? "" : ")");
  // --init-partial: the tensors of another shape, with both shapes.
  for (const std::string& m : r.mismatched) std::printf("  left at initialisation: %s\n", m.c_str());
  std::fflush(stdout);
}

}  // namespace meshmoe
