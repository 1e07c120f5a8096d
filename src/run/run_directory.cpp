#include "run/run_directory.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "io/output_file.hpp"
#include "mesh/agree.hpp"
#include "checkpoint/checkpoint.hpp"

namespace meshmoe {

namespace fs = std::filesystem;

std::string run_directory(const Config& cfg) {
  return cfg.run.out_dir.empty() ? "runs/" + cfg.run.name : cfg.run.out_dir;
}

void write_deck_file(const Deck& deck, const std::string& dir, MPI_Comm world) {
  std::string error;
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  if (rank == 0) try {
    // run.name is checked to be one printable line (deck.cpp); the deck's path may be anything.
    std::string from = deck.path;
    for (char& ch : from)
      if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
    // Replaced whole (src/io/output_file.hpp): a full disk leaves the earlier deck.toml as it was.
    replace_text_file(dir + "/deck.toml",
                      "# effective deck of run " + deck.cfg.run.name + " (from " + from + ")\n" + deck.effective_toml);
  } catch (const std::exception& e) {
    error = "cannot write the run directory " + dir + ": cannot write deck.toml (" + e.what() +
            "; set run.out_dir to a writable place)";
  }
  if (const std::string e = first_error(error, world); !e.empty()) throw InputError(e);
}

namespace {

constexpr const char* kLockName = "run.lock";

int comm_rank(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}

std::string utc_now(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string absolute(const std::string& p) {
  std::error_code ec;
  const fs::path a = fs::absolute(p, ec);
  return ec ? p : a.lexically_normal().string();
}

// The value of `key=` in the lock file's text, "" when absent.
std::string lock_field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  return "";
}

std::string read_text(int fd) {
  std::string text;
  char buf[4096];
  ssize_t n;
  lseek(fd, 0, SEEK_SET);
  while ((n = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, size_t(n));
  return text;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return in ? ss.str() : "";
}

}  // namespace

std::string RunDirectory::lock_text() const {
  const char* job = std::getenv("SLURM_JOB_ID");
  return "nonce=" + nonce_ + "\nhost=" + host_name() + "\npid=" + std::to_string(getpid()) + "\njob=" + (job ? job : "-") +
         "\nstarted=" + utc_now("%Y-%m-%dT%H:%M:%SZ") + "\nrun=" + absolute(dir_) + "\n";
}

// What keeps rank 0 from writing the run's file `path` later ("" when nothing): a link to nothing, not
// a regular file, no write permission, a read-only mount.
static std::string file_problem(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "";
  if (S_ISLNK(st.st_mode) && ::stat(path.c_str(), &st) != 0) return path + " is a symbolic link to nothing";
  if (!S_ISREG(st.st_mode)) return path + " is not a regular file";
  if (::access(path.c_str(), W_OK) != 0) return "cannot write " + path + ": " + std::strerror(errno);
  return "";
}

std::string RunDirectory::take_lock(const std::string& lock_path, const std::string& what, int& fd) const {
  const std::string cannot = "cannot write " + what;
  const std::string hint = " (set run.out_dir to a writable place)";
  if (fd >= 0) ::close(fd);
  fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return cannot + ": " + lock_path + ": " + std::strerror(errno) + hint;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      const std::string t = read_text(fd);
      const std::string job = lock_field(t, "job"), run = lock_field(t, "run");
      return what + " is in use by another run (pid " + lock_field(t, "pid") + " on " + lock_field(t, "host") +
             (job.empty() || job == "-" ? "" : ", Slurm job " + job) + (run.empty() ? "" : ", run directory " + run) +
             ", started " + lock_field(t, "started") + "; " + lock_path +
             " is locked): two runs must not share a run directory or a checkpoint directory; wait for that run to "
             "end, or give this one another run.name or run.out_dir";
    }
    // A file system without locks (some NFS or Lustre mounts): say so and go on.
    std::fprintf(stderr, "meshmoe: warning: cannot lock %s (%s): a second run started in this directory would not "
                         "be detected\n", lock_path.c_str(), std::strerror(errno));
  }
  const std::string text = lock_text();
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != ssize_t(text.size()) || ::fsync(fd) != 0)
    return cannot + ": " + lock_path + ": " + std::strerror(errno) + hint;
  return "";
}

std::string RunDirectory::check_checkpoint_dir(bool create) const {
  const std::string ckpt = dir_ + "/ckpt";
  const std::string hint = ": a run writes its checkpoints there (set run.out_dir to a writable place)";
  struct stat st {};
  if (::lstat(ckpt.c_str(), &st) != 0) {
    if (!create) return "";
    if (::mkdir(ckpt.c_str(), 0755) != 0) return "cannot create the checkpoint directory " + ckpt + ": " + std::strerror(errno) + hint;
  } else if (S_ISLNK(st.st_mode) && ::stat(ckpt.c_str(), &st) != 0) {
    std::error_code ec;
    return "the checkpoint directory " + ckpt + " is a symbolic link to nothing (" + fs::read_symlink(ckpt, ec).string() +
           ")" + hint + "; make its target, or remove the link";
  } else if (!S_ISDIR(st.st_mode)) {
    return "the checkpoint directory " + ckpt + " is not a directory" + hint + "; move the file away";
  }
  if (::access(ckpt.c_str(), W_OK | X_OK) != 0)
    return "cannot write the checkpoint directory " + ckpt + ": " + std::strerror(errno) + hint;
  std::error_code ec;
  const fs::path real = fs::canonical(ckpt, ec);
  const std::string resolved = ec || real == fs::absolute(ckpt, ec) ? "" : " (" + real.string() + ")";
  // Hidden, so that a listing of ckpt/ shows the checkpoints and LATEST only.
  return take_lock(ckpt + "/." + kLockName, "the checkpoint directory " + ckpt + resolved, ckpt_lock_fd_);
}

RunDirectory::RunDirectory(std::string dir, MPI_Comm world) : dir_(std::move(dir)) {
  const bool root = comm_rank(world) == 0;
  const std::string lock_path = dir_ + "/" + kLockName;
  // Rank 0: create the directory, take the lock, write who holds it.
  std::string error;
  if (root) {
    const std::string cannot = "cannot write the run directory " + dir_;
    const std::string hint = " (set run.out_dir to a writable place)";
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) error = cannot + ": " + ec.message() + hint;
    if (error.empty()) {
      const auto now = std::chrono::system_clock::now().time_since_epoch().count();
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx",
                    (unsigned long long)fnv1a64(host_name() + "/" + std::to_string(getpid()) + "/" + std::to_string(now)));
      nonce_ = hex;
      error = take_lock(lock_path, "the run directory " + dir_, lock_fd_);
    }
    // The checkpoint directory as well: ckpt/ may be a link that another run's ckpt/ resolves to too.
    if (error.empty()) error = check_checkpoint_dir(true);
  }
  if (const std::string e = first_error(error, world); !e.empty()) throw InputError(e);
  nonce_ = broadcast_string(nonce_, 0, world);

  // Every other rank must read rank 0's nonce in the same file. A file system shared over the
  // network may show a new file late: look again for a few seconds before giving up.
  std::string mine;
  if (!root) {
    std::string seen;
    for (int attempt = 0; attempt < 30; ++attempt) {
      seen = lock_field(read_file(lock_path), "nonce");
      if (seen == nonce_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (seen != nonce_)
      mine = "the run directory " + absolute(dir_) + " is not the one rank 0 writes (" + lock_path +
             (seen.empty() ? " is missing here" : " belongs to another run here") +
             "): the run directory must be on a file system every rank shares; give run.out_dir as an absolute "
             "path on a shared file system (a relative one resolves against each rank's working directory)";
  }
  // Every file the run will write, checked before any step (docs/user-guide.md "Faults"): the
  // checkpoint directory on every rank (each writes its part of a checkpoint), the rest on rank 0.
  if (mine.empty() && !root && ::access((dir_ + "/ckpt").c_str(), W_OK | X_OK) != 0)
    mine = "cannot write the checkpoint directory " + dir_ + "/ckpt here: " + std::strerror(errno) +
           ": every rank writes its part of each checkpoint there";
  if (mine.empty() && root)
    for (const char* name : {"metrics.h5", "deck.toml"})
      if (const std::string why = file_problem(dir_ + "/" + name); !why.empty()) {
        mine = why + ": the run writes it (move it away, or set run.out_dir to another place)";
        break;
      }
  agree_on_input(world, [&] {
    if (!mine.empty()) throw Error(mine);
  });
}

RunDirectory::~RunDirectory() {
  if (ckpt_lock_fd_ >= 0) ::close(ckpt_lock_fd_);  // releases the flocks
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string RunDirectory::move_aside(MPI_Comm world) const {
  std::string note, error;
  if (comm_rank(world) == 0) {
    std::error_code ec;
    const std::string ckpt = dir_ + "/ckpt";
    const auto steps = list_checkpoints(ckpt);  // committed ones, oldest first
    bool ckpt_files = false;                    // those, .tmp leftovers or LATEST
    if (fs::is_directory(ckpt, ec))
      for (const auto& e : fs::directory_iterator(ckpt, ec)) {
        const std::string n = e.path().filename().string();
        ckpt_files = ckpt_files || n.rfind("step_", 0) == 0 || n.rfind("LATEST", 0) == 0;
      }
    std::vector<std::string> moved;  // names relative to dir_
    if (ckpt_files) moved.push_back("ckpt");
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      const std::string n = e.path().filename().string();
      if (n == "metrics.h5" || n.rfind("metrics.h5.broken-", 0) == 0) moved.push_back(n);
    }
    if (!moved.empty()) {
      if (fs::exists(dir_ + "/deck.toml", ec)) moved.push_back("deck.toml");
      std::string aside = dir_ + "/superseded-" + utc_now("%Y%m%dT%H%M%SZ");
      for (int k = 2; fs::exists(aside, ec); ++k) aside = dir_ + "/superseded-" + utc_now("%Y%m%dT%H%M%SZ") + "-" + std::to_string(k);
      fs::create_directories(aside, ec);
      if (ec) error = "cannot move the earlier run aside: cannot create " + aside + ": " + ec.message();
      for (const auto& n : moved) {
        if (!error.empty()) break;
        fs::rename(dir_ + "/" + n, aside + "/" + n, ec);
        if (ec) error = "cannot move " + dir_ + "/" + n + " aside to " + aside + ": " + ec.message();
      }
      // A new ckpt/ in place of the one moved, locked as the old one was (check_checkpoint_dir).
      if (error.empty() && ckpt_files) error = check_checkpoint_dir(true);
      std::string what;
      if (!steps.empty()) {
        what = "checkpoints of step";
        what += steps.size() > 1 ? "s " : " ";
        for (size_t i = 0; i < steps.size(); ++i) what += (i ? ", " : "") + std::to_string(steps[i].first);
      }
      for (const auto& n : moved)
        if (n != "ckpt" || steps.empty()) what += (what.empty() ? "" : ", ") + n;
      note = "the run directory held an earlier run (" + what + "); moved it to " + aside +
             " (a fresh start never resumes from, prunes or appends to another run's files)";
    }
  }
  if (const std::string e = first_error(error, world); !e.empty()) throw InputError(e);
  return note;
}

}  // namespace meshmoe
