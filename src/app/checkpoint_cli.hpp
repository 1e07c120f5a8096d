// `meshmoe ckpt info PATH` / `meshmoe ckpt verify PATH` (PATH: a checkpoint file, a ckpt
// directory or a run directory; for a directory the file LATEST names). Rank 0 works, every rank
// returns its exit code: 0 good, 1 bad or unreadable (reason on stderr), 2 bad command line.
#pragma once
#include <string>

namespace meshmoe {

struct CkptCliOptions {
  std::string action;  // "info" | "verify"
  std::string path;
};
int ckpt_main(const CkptCliOptions& opt);

}  // namespace meshmoe
