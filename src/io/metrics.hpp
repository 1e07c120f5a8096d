// The metrics file of a run (runs/<name>/metrics.h5), written by rank 0 only (serial HDF5).
//
// Layout: /step (int64, one row per logged step) and one extendible float64 dataset per metric,
// named by the caller ("loss", "time/forward", "moe/layer3/dropped_fraction", "eval/loss"; '/'
// makes groups), plus 2-D series [step, n] from append_row ("moe/3/expert_load" [step, E]).
// Row r of every series belongs to step /step[r]: a metric missing at some logged step holds NaN
// there (eval metrics every N steps, say), and a series shorter than /step has no values at the
// later steps yet. Every dataset carries `units` and `description` attributes, set when it is
// created (from describe() or the built-in table, default_info()). /deck holds the effective
// deck text; the root carries the caller's attributes. Each append is flushed, and the file is
// not locked, so h5py can read it while the run goes on. The datasets of one step grow one after
// the other; the root attribute `rows` counts the rows whose datasets are all written
// (publish_rows, flushed after them), so a reader reads it first and slices every series to it
// (docs/user-guide.md "metrics.h5"):
//   f = h5py.File("metrics.h5", "r"); n = f.attrs["rows"]; plt.plot(f["step"][:n], f["loss"][:n])
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/h5.hpp"

namespace meshmoe {

struct MetricInfo {
  std::string units;        // "nats/token", "s", "tokens/s", "1" (dimensionless)
  std::string description;  // one sentence
};

// Root attributes that are arrays: lists of strings (HDF5 variable-length UTF-8) and of numbers.
struct MetricsArrayAttrs {
  std::map<std::string, std::vector<std::string>> strings;
  std::map<std::string, std::vector<double>> numbers;
};

class MetricsFile {
 public:
  // Creates `path` (truncating any old file). With `resume_after_step`, continues an existing file
  // instead (creating it when missing) without the rows logged after that step, so a run resumed
  // from the checkpoint at that step continues the series without duplicates; /deck is replaced
  // and the attributes are updated. The existing file is changed in place after a copy of it is
  // made beside it, which is put back when a write fails (a full disk): then `path` is left as it
  // was and the constructor throws. `arrays`: root attributes that are arrays.
  MetricsFile(const std::string& path, const std::string& deck_text,
              const std::map<std::string, std::string>& attrs = {},
              std::optional<int64_t> resume_after_step = std::nullopt, const MetricsArrayAttrs& arrays = {});
  ~MetricsFile();  // pads every series to the length of /step, closes the file
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  // Units and description for a series created later (overrides the built-in table).
  void describe(const std::string& name, const std::string& units, const std::string& description);

  // Logs `scalars` at `step`. A step equal to the last one logged adds to that row (e.g. eval
  // metrics after the training metrics of the same step); a smaller step is an error.
  void append(int64_t step, const std::map<std::string, double>& scalars);
  // Logs a row of a 2-D series at the last logged step (call append(step, ...) first). The row
  // length is fixed by the first call.
  void append_row(const std::string& name, const std::vector<double>& row);

  // Sets the root attribute `rows` to rows() and flushes: every dataset of those rows is written.
  // Call it after the appends of one step.
  void publish_rows();

  int64_t rows() const { return rows_; }                // rows of /step
  std::optional<int64_t> last_step() const { return last_step_; }

  // Built-in units/description for the metric names the trainer writes ('*' = one path
  // component); {"", ""} for unknown names.
  static MetricInfo default_info(const std::string& name);

 private:
  h5::Dataset& series(const std::string& name, int64_t width);  // opens or creates
  void write_at_current_row(h5::Dataset& d, const std::vector<double>& values);
  void pad_all();
  // The constructor's work: a new file, or (with `resume_after_step`) the rows up to it of `path`.
  void open_or_create(const std::string& path, const std::string& deck_text, const std::map<std::string, std::string>& attrs,
                      std::optional<int64_t> resume_after_step, const MetricsArrayAttrs& arrays);

  std::string path_;
  h5::File file_;
  h5::Dataset step_;
  std::map<std::string, h5::Dataset> series_;  // closed before file_ (declared after it)
  std::map<std::string, MetricInfo> described_;
  int64_t rows_ = 0;
  std::optional<int64_t> last_step_;
  bool broken_ = false;  // an HDF5 write failed (not a caller's mistake): see ~MetricsFile
  // Runs an HDF5 write; when it throws, marks the file broken and rethrows.
  template <class Write>
  void guarded(Write&& write) {
    try {
      write();
    } catch (...) {
      broken_ = true;
      throw;
    }
  }
};

}  // namespace meshmoe
