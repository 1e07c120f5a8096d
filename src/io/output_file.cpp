#include "io/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"
#include "io/h5.hpp"

namespace meshmoe {

namespace fs = std::filesystem;

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

namespace {

// Whether the first 64 KiB of `path` hold no NUL byte (text, not a dataset, checkpoint or export).
bool holds_text(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  std::string head(64 << 10, '\0');
  head.resize(std::fread(head.data(), 1, head.size(), f));
  std::fclose(f);
  return head.find('\0') == std::string::npos;
}

// Sets `by` to the root attribute created_by of an HDF5 file ("" when it has none); false when the
// file does not open as HDF5.
bool created_by(const std::string& path, std::string& by) {
  try {
    h5::File f = h5::File::open(path);
    by = f.has_attr("created_by") ? f.attr<std::string>("created_by") : "";
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

void check_output_path(const std::string& path, const OutputRules& rules) {
  const std::string name = rules.command + ": the output file " + path;
  const std::string another = "; give another " + rules.option + ")";
  if (path.empty()) throw InputError(rules.command + ": the output file name is empty (give " + rules.option + " FILE)");
  const fs::path parent = fs::path(path).parent_path();
  struct stat st {};
  if (!parent.empty() && (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)))
    throw InputError(name + ": cannot create it: its directory " + parent.string() +
                     " does not exist (a command never creates it: make it first)");
  for (const std::string& in : rules.inputs)
    if (!in.empty() && same_file(path, in))
      throw InputError(name + " is the input " + in + ": refusing to overwrite it (the same file" + another);
  if (::lstat(path.c_str(), &st) != 0) return;  // a new file
  if (S_ISLNK(st.st_mode) && ::stat(path.c_str(), &st) != 0)
    throw InputError(name + " is a symbolic link to nothing: refusing to write through it (remove it" + another);
  if (!S_ISREG(st.st_mode)) throw InputError(name + " exists and is not a regular file (" + another.substr(2));
  if (rules.text && !holds_text(path))
    throw InputError(name + " exists and does not hold text (a dataset, checkpoint or other binary file?): refusing to "
                     "replace it (remove it yourself" + another);
  if (rules.replaceable.empty()) return;
  std::string by;
  const bool hdf5 = created_by(path, by);
  for (const std::string& ok : rules.replaceable)
    if (hdf5 && by.rfind(ok, 0) == 0) return;
  std::string allowed;
  for (const std::string& ok : rules.replaceable) allowed += (allowed.empty() ? "" : " or ") + ok;
  throw InputError(name + " exists and is " +
                   (!hdf5        ? std::string("not an HDF5 file")
                    : by.empty() ? std::string("an HDF5 file of another kind (a run's metrics or checkpoint?)")
                                 : "a file of " + by) +
                   ": refusing to replace it, only an earlier result of " + allowed + " is replaced (remove it yourself" +
                   another);
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open to fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(path + ": fsync failed: " + std::strerror(err));
}

void rename_durably(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw Error("cannot rename " + from + " to " + to + ": " + std::strerror(errno));
  const fs::path dir = fs::path(to).parent_path();
  fsync_path(dir.empty() ? "." : dir.string(), true);
}

namespace {

// The temporaries of the live ReplacingFiles, for the signal handler below (which may only unlink
// and re-raise): fixed slots, a path that does not fit is not removed on a signal.
constexpr int kSlots = 16;
constexpr size_t kSlotBytes = 4096;
char g_temporaries[kSlots][kSlotBytes];
volatile std::sig_atomic_t g_slot_used[kSlots];

extern "C" void remove_temporaries_and_die(int sig) {
  for (int i = 0; i < kSlots; ++i)
    if (g_slot_used[i]) ::unlink(g_temporaries[i]);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// The handler for the signals that would kill the process as it stands (SIG_DFL), once.
void install_removal_on_kill() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;
    struct sigaction sa {};
    sa.sa_handler = remove_temporaries_and_die;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

void hold_temporary(const std::string& tmp) {
  if (tmp.size() >= kSlotBytes) return;
  install_removal_on_kill();
  for (int i = 0; i < kSlots; ++i)
    if (!g_slot_used[i]) {
      std::memcpy(g_temporaries[i], tmp.c_str(), tmp.size() + 1);
      g_slot_used[i] = 1;
      return;
    }
}

void release_temporary(const std::string& tmp) {
  for (int i = 0; i < kSlots; ++i)
    if (g_slot_used[i] && tmp == g_temporaries[i]) {
      g_slot_used[i] = 0;
      return;
    }
}

void pause_before_rename() {
  const char* f = std::getenv("MESHMOE_TEST_PAUSE_BEFORE_RENAME");
  if (!f) return;
  std::fclose(std::fopen((std::string(f) + ".ready").c_str(), "w"));
  for (int i = 0; i < 3000 && !fs::exists(std::string(f) + ".go"); ++i) ::usleep(10000);
}

// Removes the temporary `tmp` (if any) and forgets it.
void drop(std::string& tmp) {
  if (tmp.empty()) return;
  std::remove(tmp.c_str());
  release_temporary(tmp);
  tmp.clear();
}

}  // namespace

ReplacingFile::ReplacingFile(std::string path)
    : path_(std::move(path)), tmp_(path_ + ".tmp-" + std::to_string(::getpid())) {
  hold_temporary(tmp_);
}

ReplacingFile::~ReplacingFile() { drop(tmp_); }

ReplacingFile::ReplacingFile(ReplacingFile&& o) noexcept : path_(std::move(o.path_)), tmp_(std::move(o.tmp_)) {
  o.tmp_.clear();
}

ReplacingFile& ReplacingFile::operator=(ReplacingFile&& o) noexcept {
  if (this != &o) {
    drop(tmp_);
    path_ = std::move(o.path_);
    tmp_ = std::move(o.tmp_);
    o.tmp_.clear();
  }
  return *this;
}

void ReplacingFile::commit() {
  if (tmp_.empty()) throw Error(path_ + ": committed twice");
  pause_before_rename();
  fsync_path(tmp_, false);
  try {
    rename_durably(tmp_, path_);
  } catch (...) {
    drop(tmp_);
    throw;
  }
  release_temporary(tmp_);
  tmp_.clear();
}

void replace_text_file(const std::string& path, const std::string& text) {
  ReplacingFile out(path);
  std::FILE* f = std::fopen(out.temporary().c_str(), "wb");
  if (!f) throw Error("cannot write " + out.temporary() + ": " + std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int saved = errno;
  if (std::fclose(f) != 0 || !ok) throw Error("cannot write " + out.temporary() + ": " + std::strerror(ok ? errno : saved));
  out.commit();
}

}  // namespace meshmoe
