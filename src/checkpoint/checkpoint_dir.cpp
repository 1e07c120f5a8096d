// The checkpoint directory: step file names, the atomic commit of a file and of LATEST, pruning,
// the choice of a checkpoint to resume from, and the file a command line names (checkpoint.hpp).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.hpp"
#include "io/output_file.hpp"
#include "mesh/agree.hpp"
#include "checkpoint/checkpoint_format.hpp"

namespace meshmoe {

namespace fs = std::filesystem;

namespace {

void write_latest(const std::string& dir, const std::string& file_name) {
  const std::string tmp = dir + "/LATEST.tmp", latest = dir + "/LATEST";
  {
    std::ofstream o(tmp, std::ios::trunc);
    o << file_name << "\n";
    o.flush();
    if (!o) throw Error(tmp + ": cannot write");
  }
  fsync_path(tmp, false);
  rename_durably(tmp, latest);
}

// Step of "step_00001000.h5" (or of "...h5.tmp" when tmp), -1 when the name is something else.
int64_t step_of(const std::string& name, bool tmp) {
  const std::string prefix = "step_", suffix = tmp ? ".h5.tmp" : ".h5";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

// Removes the checkpoints of keep.lineage beyond the retention policy (never just_written).
void prune(const std::string& dir, int64_t just_written, const RetentionPolicy& keep) {
  std::vector<std::pair<int64_t, std::string>> all;  // this lineage's, oldest first
  for (auto& c : list_checkpoints(dir)) {
    std::string lineage;
    try {
      lineage = checkpoint_lineage(c.second);
    } catch (const std::exception&) {
      continue;  // unreadable: not provably ours, leave it
    }
    if (lineage == keep.lineage) all.push_back(std::move(c));
  }
  std::set<int64_t> kept{just_written};
  int n = 0;
  for (auto it = all.rbegin(); it != all.rend() && n < std::max(keep.keep_last, 1); ++it, ++n) kept.insert(it->first);
  for (const auto& [step, path] : all) {
    if (kept.count(step) || (keep.keep_every > 0 && step % keep.keep_every == 0)) continue;
    std::error_code ec;
    fs::remove(path, ec);
    if (ec) std::fprintf(stderr, "meshmoe: warning: cannot remove old checkpoint %s: %s\n", path.c_str(), ec.message().c_str());
  }
}

}  // namespace

namespace ckpt {

void commit_checkpoint(const std::string& tmp, const std::string& path, const std::string& ckpt_dir,
                       int64_t step, const RetentionPolicy& keep) {
  fsync_path(tmp, false);
  rename_durably(tmp, path);
  write_latest(ckpt_dir, fs::path(path).filename().string());
  prune(ckpt_dir, step, keep);
}

}  // namespace ckpt

// ---------------------------------------------------------------------------------------------
// Public (checkpoint.hpp).

std::string checkpoint_file_name(int64_t step) {
  char b[40];
  std::snprintf(b, sizeof b, "step_%08lld.h5", static_cast<long long>(step));
  return b;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& ckpt_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(ckpt_dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(ckpt_dir, ec)) {
    const int64_t s = step_of(e.path().filename().string(), false);
    if (s >= 0 && e.is_regular_file(ec)) out.emplace_back(s, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_latest_name(const std::string& dir) {
  const std::string latest = dir + "/LATEST";
  std::error_code ec;
  if (!fs::exists(latest, ec)) return "";
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  if (step_of(name, false) < 0) throw Error(latest + " does not name a checkpoint file (holds \"" + name + "\")");
  return name;
}

ResumeChoice find_resume_checkpoint(const std::string& ckpt_dir, MPI_Comm comm) {
  ResumeChoice c;
  if (ckpt::comm_rank(comm) == 0) {
    std::error_code ec;
    if (fs::is_directory(ckpt_dir, ec)) {
      for (const auto& e : fs::directory_iterator(ckpt_dir, ec)) {
        const std::string n = e.path().filename().string();
        if (step_of(n, true) >= 0 || n == "LATEST.tmp")
          c.warnings.push_back("ignoring " + e.path().string() + ": left over from an interrupted checkpoint write");
      }
      std::string latest;
      try {
        latest = read_latest_name(ckpt_dir);
      } catch (const std::exception& e) {
        c.warnings.push_back(e.what());
      }
      // Newest first. A step file is renamed into place only once complete, so the newest one
      // that verifies is the newest good state; LATEST normally names it (not when a crash came
      // between the rename and the LATEST update, or when LATEST's file went bad).
      auto all = list_checkpoints(ckpt_dir);
      for (auto it = all.rbegin(); it != all.rend(); ++it) {
        VerifyResult v = verify_checkpoint(it->second);
        if (v.ok) {
          c.path = it->second;
          break;
        }
        c.warnings.push_back("skipping bad checkpoint " + it->second + ": " + v.message);
      }
      const std::string chosen = c.path.empty() ? "" : fs::path(c.path).filename().string();
      if (!latest.empty() && latest != chosen) {
        if (!fs::exists(ckpt_dir + "/" + latest))
          c.warnings.push_back(ckpt_dir + "/LATEST names " + latest + ", which does not exist");
        else if (step_of(latest, false) < step_of(chosen, false))
          c.warnings.push_back(ckpt_dir + "/LATEST names " + latest + " but " + chosen +
                               " is newer and complete (the run stopped before LATEST was updated)");
      } else if (latest.empty() && !chosen.empty()) {
        c.warnings.push_back(ckpt_dir + "/LATEST is missing; using " + chosen);
      }
      if (c.path.empty() && !all.empty())
        c.warnings.push_back("no usable checkpoint in " + ckpt_dir + ": every step_*.h5 failed verification");
    }
  }
  ckpt::Out o;
  o.str(c.path);
  o.i64(int64_t(c.warnings.size()));
  for (const auto& w : c.warnings) o.str(w);
  const std::string s = broadcast_string(o.buf, 0, comm);
  ckpt::In in(s);
  ResumeChoice out;
  out.path = in.str();
  for (int64_t n = in.i64(); n > 0; --n) out.warnings.push_back(in.str());
  return out;
}

std::string find_named_checkpoint(const std::string& given) {
  const std::string forms = "name a checkpoint file (step_*.h5), a checkpoint directory or a run directory";
  std::error_code ec;
  if (fs::is_regular_file(given, ec)) return given;
  if (!fs::exists(given, ec)) throw InputError(given + ": no such file or directory (" + forms + ")");
  if (!fs::is_directory(given, ec)) throw InputError(given + ": neither a file nor a directory (" + forms + ")");
  for (const std::string& dir : {given, given + "/ckpt"}) {
    if (!fs::exists(dir + "/LATEST", ec)) continue;
    std::string name;
    try {
      name = read_latest_name(dir);
    } catch (const std::exception& e) {
      throw InputError(e.what());
    }
    const std::string path = dir + "/" + name;
    if (!fs::is_regular_file(path, ec)) throw InputError(dir + "/LATEST names " + name + ", which does not exist");
    return path;
  }
  throw InputError(given + ": a directory without LATEST (nor ckpt/LATEST): looked for " + given + "/LATEST and " + given +
                   "/ckpt/LATEST; " + forms);
}

std::string resolve_named_checkpoint(const std::string& given, const std::string& option, MPI_Comm comm) {
  std::string path, err;
  if (ckpt::comm_rank(comm) == 0) {
    try {
      path = find_named_checkpoint(given);
    } catch (const std::exception& e) {
      err = option + " " + e.what();
    }
  }
  if (auto e = first_error(err, comm); !e.empty()) throw InputError(e);
  path = broadcast_string(path, 0, comm);
  agree_on_input(comm, [&] {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      throw InputError(option + " " + given + ": " + path + " is not a file here (rank 0 reads it: give a path every node sees)");
  });
  return path;
}

}  // namespace meshmoe
