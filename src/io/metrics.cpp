// The metrics file: see metrics.hpp.
#include "io/metrics.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <thread>


namespace meshmoe {

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string normalize(const std::string& name) {
  size_t b = name.find_first_not_of('/');
  return b == std::string::npos ? "" : name.substr(b);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = std::min(s.find('/', start), s.size());
    parts.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

bool matches(const std::string& pattern, const std::string& name) {
  auto p = split(pattern), n = split(name);
  if (p.size() != n.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != "*" && p[i] != n[i]) return false;
  return true;
}

struct Known {
  const char* pattern;
  MetricInfo info;
};

const std::vector<Known>& known_metrics() {
  static const std::vector<Known> table = {
      {"step", {"1", "optimizer step; row r of every series belongs to step[r]"}},
      {"loss", {"nats/token", "training cross-entropy, mean over the tokens of the step"}},
      {"aux_loss", {"1", "MoE auxiliary load-balancing loss (GShard 2.2, Switch eq. 4), summed over MoE layers"}},
      {"z_loss", {"1", "router z-loss (mean squared log-sum-exp of router logits), summed over MoE layers"}},
      {"lr", {"1", "learning rate applied at this step"}},
      {"grad_norm", {"1", "global L2 norm of the gradient before clipping"}},
      {"tokens_per_s", {"tokens/s", "training throughput over the step, all ranks together"}},
      {"mfu", {"1", "model FLOPs utilization"}},
      {"pipeline_bubble", {"1", "fraction of its time in the 1F1B schedule a rank waited on the pipe axis, mean over ranks (mesh.pipe > 1)"}},
      {"pipeline_bubble_ideal", {"1", "the ideal 1F1B bubble (pipe - 1) / (micro_batches + pipe - 1)"}},
      {"time/*", {"s", "wall time of this phase during the step (max over ranks)"}},
      {"moe/*/dropped_fraction", {"1", "fraction of token-to-expert assignments dropped for lack of capacity"}},
      {"moe/*/expert_load", {"1", "fraction of the tokens routed to each expert; row per step, column per expert"}},
      {"moe/*/experts_per_token", {"1", "fraction of the routed tokens dispatched to 0, 1, 2 and >= 3 experts; row per step, 4 columns (expert-choice routing gives a token 0..E experts)"}},
      {"moe/*/rerouted_fraction", {"1", "fraction of token-to-expert assignments placed by No-Token-Left-Behind"}},
      {"moe/*/declined_fraction", {"1", "fraction of second choices that random or threshold routing did not dispatch (0 for top-1)"}},
      {"moe/*/router_entropy", {"nats", "mean over tokens of the entropy of the router's softmax over experts (ln E when uniform)"}},
      {"moe/*/capacity", {"slots", "expert capacity C per routing group"}},
      {"moe/*/bias_max_abs", {"1", "moe.balance = bias: largest |selection bias| of the layer's experts in the step's forwards (before the step's update)"}},
      {"eval/loss", {"nats/token", "evaluation cross-entropy, mean over the evaluation tokens"}},
      {"distill/soft_loss", {"nats/token", "distillation: training cross-entropy against the teacher's probabilities, mean over the tokens of the step"}},
      {"distill/teacher_loss", {"nats/token", "distillation report: the teacher's validation cross-entropy"}},
      {"distill/student_loss", {"nats/token", "distillation report: the student's validation cross-entropy"}},
      {"distill/baseline_loss", {"nats/token", "distillation report: the baseline's (--baseline) validation cross-entropy"}},
      {"distill/preserved", {"1", "distillation report: fraction of the teacher's gain over the baseline the student keeps, (baseline - student) / (baseline - teacher) in validation loss (Switch Table 6)"}},
  };
  return table;
}

// Every extendible dataset under `loc`, by path relative to the file root.
void collect_series(const h5::Location& loc, const std::string& prefix, std::vector<std::string>& out) {
  for (const auto& child : loc.children()) {
    std::string path = prefix.empty() ? child : prefix + "/" + child;
    if (loc.is_group(child)) {
      collect_series(loc.group(child), path, out);
    } else if (loc.is_dataset(child)) {
      h5::Dims m = loc.dataset(child).max_dims();
      if (!m.empty() && m[0] < 0) out.push_back(path);
    }
  }
}

}  // namespace

MetricInfo MetricsFile::default_info(const std::string& name) {
  std::string n = normalize(name);
  for (const auto& k : known_metrics())
    if (matches(k.pattern, n)) return k.info;
  return {"", ""};
}

namespace {

// Test hook (tests/scripts/metrics_rows.sh): MESHMOE_TEST_METRICS_PAUSE seconds of sleep between a
// step's /step append (flushed) and its other series, so that a reader meets a half-written step.
double test_pause_seconds() {
  static const double s = [] {
    const char* v = std::getenv("MESHMOE_TEST_METRICS_PAUSE");
    return v ? std::atof(v) : 0.0;
  }();
  return s;
}

// Bytes a resume may add to metrics.h5 in place (the rows cut back, the deck and attributes
// rewritten), beyond the copy made before it.
constexpr std::uintmax_t kResumeSlack = 64 << 10;

}  // namespace

MetricsFile::MetricsFile(const std::string& path, const std::string& deck_text,
                         const std::map<std::string, std::string>& attrs, std::optional<int64_t> resume_after_step,
                         const MetricsArrayAttrs& arrays)
    : path_(path) {
  bool resume = resume_after_step.has_value() && std::filesystem::exists(path);
  // A resumed file is changed in place (it may be a link, or a mount point), after a copy of it is
  // made beside its real path: when a write fails (a full disk), the copy is renamed back, so that
  // the readable history is never left half-rewritten (docs/user-guide.md "Faults").
  std::string real, copy;
  if (resume) {
    std::error_code ec;
    real = std::filesystem::canonical(path, ec).string();
    if (ec) throw Error("cannot resolve " + path + ": " + ec.message());
    copy = real + ".tmp-" + std::to_string(::getpid());
    // Room for the copy and the rewrite, or no HDF5 write at all: a write that fails on a full disk
    // leaves HDF5 objects that cannot be closed, and those crash its shutdown in MPI_Finalize.
    const auto size = std::filesystem::file_size(real, ec);
    if (ec) throw Error("cannot read the size of " + path + ": " + ec.message());
    const auto room = std::filesystem::space(std::filesystem::path(real).parent_path(), ec);
    if (!ec && room.available < size + kResumeSlack)
      throw Error("no room to continue " + path + ": " + std::to_string(room.available) +
                  " bytes free on its file system, and it needs " + std::to_string(size + kResumeSlack) +
                  " (a copy of it and " + std::to_string(kResumeSlack) + " for the rewrite)");
    if (!std::filesystem::copy_file(real, copy, std::filesystem::copy_options::overwrite_existing, ec) || ec) {
      std::remove(copy.c_str());
      throw Error("cannot copy " + path + " before continuing it: " + ec.message());
    }
  }
  try {
    open_or_create(path, deck_text, attrs, resume ? resume_after_step : std::nullopt, arrays);
  } catch (const std::exception& e) {
    if (!resume) throw;
    // Its writes failed: no flush, no close (see ~MetricsFile); the copy goes back in its place.
    step_.release();
    file_.release();
    if (std::rename(copy.c_str(), real.c_str()) != 0)
      throw Error(std::string(e.what()) + "; the copy made before could not be put back (" + std::strerror(errno) +
                  "): it is " + copy);
    throw;
  }
  if (resume) std::remove(copy.c_str());
}

void MetricsFile::open_or_create(const std::string& path, const std::string& deck_text,
                                 const std::map<std::string, std::string>& attrs, std::optional<int64_t> resume_after_step,
                         const MetricsArrayAttrs& arrays) {
  const bool resume = resume_after_step.has_value();
  if (resume) {
    file_ = h5::File::open(path, h5::Access::ReadWrite);
    if (!file_.is_dataset("step"))
      throw Error(path + ": not a meshmoe metrics file (no /step dataset); move it away to start a new one");
    step_ = file_.dataset("step");
    // Keep the rows up to and including the resume step; steps increase along the file.
    std::vector<int64_t> steps = step_.read<int64_t>();
    auto keep = static_cast<int64_t>(std::upper_bound(steps.begin(), steps.end(), *resume_after_step) - steps.begin());
    std::vector<std::string> names;
    collect_series(file_, "", names);
    for (const auto& n : names) {
      h5::Dataset d = file_.dataset(n);
      h5::Dims s = d.shape();
      if (s[0] > keep) {
        s[0] = keep;
        d.resize(s);
      }
    }
    rows_ = keep;
    if (keep > 0) last_step_ = steps[static_cast<size_t>(keep - 1)];
    std::vector<int64_t> resumed;
    if (file_.has_attr("resumed_after_steps")) resumed = file_.attr<std::vector<int64_t>>("resumed_after_steps");
    resumed.push_back(*resume_after_step);
    file_.set_attr("resumed_after_steps", resumed);
    if (file_.exists("deck")) file_.remove("deck");
  } else {
    file_ = h5::File::create(path);
    step_ = file_.create_series<int64_t>("step");
    MetricInfo i = default_info("step");
    step_.set_attr("units", i.units);
    step_.set_attr("description", i.description);
    file_.set_attr("format", std::string("meshmoe metrics 1"));
  }
  h5::Dataset deck = file_.write_string("deck", deck_text);
  deck.set_attr("description", std::string("effective input deck (TOML, after --set overrides)"));
  for (const auto& [k, v] : attrs) file_.set_attr(k, v);
  for (const auto& [k, v] : arrays.strings) file_.set_attr(k, v);
  for (const auto& [k, v] : arrays.numbers) file_.set_attr(k, v);
  file_.set_attr("rows", rows_);
  file_.flush();
}

MetricsFile::~MetricsFile() {
  if (broken_) {
    // A write failed (e.g. the disk is full; guarded()): closing the file would flush again, fail, and leave
    // HDF5 1.10 with half-closed objects that crash its shutdown in MPI_Finalize. Leave the handles
    // open; the rows flushed before the failure are in the file.
    step_.release();
    for (auto& [name, d] : series_) d.release();
    file_.release();
    return;
  }
  try {
    pad_all();
    file_.flush();
  } catch (const std::exception&) {
    // A destructor cannot report; the rows appended so far were flushed already.
  }
}

void MetricsFile::describe(const std::string& name, const std::string& units, const std::string& description) {
  described_[normalize(name)] = {units, description};
}

h5::Dataset& MetricsFile::series(const std::string& raw_name, int64_t width) {
  std::string name = normalize(raw_name);
  if (name.empty() || name == "step" || name == "deck")
    throw Error(path_ + ": '" + raw_name + "' cannot be used as a metric name");
  auto it = series_.find(name);
  if (it == series_.end()) {
    h5::Dataset d;
    if (file_.exists(name)) {
      d = file_.dataset(name);
    } else {
      d = width == 0 ? file_.create_series<double>(name) : file_.create_series<double>(name, {width});
      auto di = described_.find(name);
      MetricInfo info = di != described_.end() ? di->second : default_info(name);
      d.set_attr("units", info.units);
      d.set_attr("description", info.description);
    }
    it = series_.emplace(name, std::move(d)).first;
  }
  h5::Dims s = it->second.shape();
  bool ok = width == 0 ? s.size() == 1 : (s.size() == 2 && s[1] == width);
  if (!ok)
    throw Error(path_ + ": metric '" + name + "' was logged as " +
                (s.size() == 1 ? std::string("a scalar") : "a row of " + std::to_string(s.back())) + ", now as " +
                (width == 0 ? std::string("a scalar") : "a row of " + std::to_string(width)));
  return it->second;
}

namespace {
// Extends a series to `n` rows with NaN: the logged steps at which this metric was missing.
void pad_nan(h5::Dataset& d, int64_t n) {
  h5::Dims s = d.shape();
  int64_t old = s[0], width = s.size() == 2 ? s[1] : 1;
  if (old >= n) return;
  s[0] = n;
  d.resize(s);
  std::vector<double> nan(static_cast<size_t>((n - old) * width), kNaN);
  h5::Dims off(s.size(), 0), cnt = s;
  off[0] = old;
  cnt[0] = n - old;
  d.write_block(off, cnt, nan.data());
}
}  // namespace

void MetricsFile::write_at_current_row(h5::Dataset& d, const std::vector<double>& values) {
  guarded([&] {
    pad_nan(d, rows_ - 1);
    h5::Dims s = d.shape();
    if (s[0] < rows_) {
      s[0] = rows_;
      d.resize(s);
    }
    d.write_row(rows_ - 1, values.data(), static_cast<int64_t>(values.size()));
  });
}

void MetricsFile::append(int64_t step, const std::map<std::string, double>& scalars) {
  if (last_step_ && step < *last_step_)
    throw Error(path_ + ": step " + std::to_string(step) + " logged after step " + std::to_string(*last_step_));
  if (!last_step_ || step > *last_step_) {
    guarded([&] { step_.append(&step, 1); });
    ++rows_;
    last_step_ = step;
    if (test_pause_seconds() > 0) {
      guarded([&] { file_.flush(); });
      std::this_thread::sleep_for(std::chrono::duration<double>(test_pause_seconds()));
    }
  }
  for (const auto& [name, value] : scalars) write_at_current_row(series(name, 0), {value});
  guarded([&] { file_.flush(); });
}

void MetricsFile::append_row(const std::string& name, const std::vector<double>& row) {
  if (rows_ == 0) throw Error(path_ + ": append_row('" + name + "') before any append(step, ...)");
  if (row.empty()) throw Error(path_ + ": append_row('" + name + "') with an empty row");
  write_at_current_row(series(name, static_cast<int64_t>(row.size())), row);
  guarded([&] { file_.flush(); });
}

void MetricsFile::publish_rows() {
  guarded([&] {
    file_.set_attr("rows", rows_);
    file_.flush();
  });
}

void MetricsFile::pad_all() {
  if (!file_.valid()) return;
  std::vector<std::string> names;
  collect_series(file_, "", names);
  for (const auto& n : names) {
    if (n == "step") continue;
    h5::Dataset d = file_.dataset(n);
    pad_nan(d, rows_);
  }
}

}  // namespace meshmoe
