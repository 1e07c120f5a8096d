// Error types and exit codes shared by every part of meshmoe.
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

namespace meshmoe {

// Exit codes of the executable (docs/user-guide.md "Exit codes").
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,
  kExitInputError = 2,    // bad deck, bad command line, wrong rank count, bad data file
  kExitCheckpointed = 75  // stopped by signal or walltime with a checkpoint written: resume to continue
};

// A problem with what the user gave us (deck, command line, data file, launch). All ranks must
// reach it together (e.g. after rank 0 validated and broadcast the verdict); main() prints the
// messages once on rank 0 and every rank exits with kExitInputError.
class InputError : public std::runtime_error {
 public:
  explicit InputError(std::vector<std::string> messages)
      : std::runtime_error(join(messages)), messages_(std::move(messages)) {}
  explicit InputError(const std::string& message) : InputError(std::vector<std::string>{message}) {}
  const std::vector<std::string>& messages() const { return messages_; }

 private:
  static std::string join(const std::vector<std::string>& m) {
    std::string s;
    for (const auto& x : m) s += (s.empty() ? "" : "\n") + x;
    return s;
  }
  std::vector<std::string> messages_;
};

// A run-time failure that every rank reaches together because the ranks agreed on it (e.g. rank 0
// could not append to metrics.h5 and told the others): main() prints it once on rank 0 and every
// rank exits with kExitFailure, without MPI_Abort.
class AgreedFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Anything else that goes wrong at run time (I/O, library errors). Raised by one rank possibly
// alone: main() prints it with the rank and calls MPI_Abort.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace meshmoe
