// Files a command writes (docs/user-guide.md "Faults": no command destroys an input). Before the
// work: the output is checked (its directory exists and is never created, it is not one of the
// command's inputs, an existing file there is one the command may replace). During it: the file is
// written under a temporary name beside it. At the end: fsync and a rename over the output, so
// that a reader, a kill or a full disk finds either the old file or the whole new one.
#pragma once
#include <string>
#include <vector>

namespace meshmoe {

// Both exist and are one file (st_dev and st_ino: through symlinks and hard links).
bool same_file(const std::string& a, const std::string& b);

struct OutputRules {
  std::string command;                   // how messages begin: "eval", "prep text"
  std::string option;                    // the option naming the output: "-o"
  std::vector<std::string> inputs;       // files the command reads
  std::vector<std::string> replaceable;  // an existing file is replaced only when it is HDF5 and its root
                                         // attribute created_by starts with one of these ("meshmoe eval");
                                         // empty: not checked
  bool text = false;                     // an existing file is replaced only when it holds text (no NUL
                                         // byte in its first 64 KiB: not a dataset, checkpoint or export)
};

// Throws InputError naming the command, `path` and the fix when `path` may not be written.
void check_output_path(const std::string& path, const OutputRules& rules);

// fsync of a file or a directory; a rename made durable (the directory of `to` synced). Throw
// Error with the system's reason.
void fsync_path(const std::string& path, bool directory);
void rename_durably(const std::string& from, const std::string& to);

// Writes `text` to `path` through a ReplacingFile (below): the old file or the whole new one, never
// half of one. Throws Error with the system's reason.
void replace_text_file(const std::string& path, const std::string& text);

// A file that replaces `path` whole: written at temporary() ("<path>.tmp-<pid>", same directory,
// so the rename is atomic) until commit() moves it over `path`. Destroyed uncommitted (an error, a
// stop), it removes the temporary and leaves `path` as it was. Creates nothing itself. A TERM, INT
// or HUP that would kill the process (no handler of its own: every command but train and distill)
// removes the temporaries first, then kills it as before; a SIGKILL leaves one, never `path` half
// written. Test hook: with MESHMOE_TEST_PAUSE_BEFORE_RENAME=F, commit() creates F.ready and waits
// (30 s at most) until F.go exists, so that a test stops the command there deterministically.
class ReplacingFile {
 public:
  ReplacingFile() = default;
  explicit ReplacingFile(std::string path);
  ~ReplacingFile();
  ReplacingFile(const ReplacingFile&) = delete;
  ReplacingFile& operator=(const ReplacingFile&) = delete;
  ReplacingFile(ReplacingFile&& o) noexcept;
  ReplacingFile& operator=(ReplacingFile&& o) noexcept;

  const std::string& path() const { return path_; }
  const std::string& temporary() const { return tmp_; }
  void commit();  // throws Error; the temporary is removed when the rename fails

 private:
  std::string path_, tmp_;
};

}  // namespace meshmoe
