// `meshmoe score --hyp FILE --ref FILE`: corpus BLEU and chrF of translations against references,
// one sentence per line (score/bleu.hpp, score/chrf.hpp). Rank 0 works; the exit code: 0, or 2
// for unreadable files or a different number of lines.
#pragma once
#include <string>

namespace meshmoe {

struct ScoreCliOptions {
  std::string hyp, ref;
  bool json = false;          // full-precision JSON (statistics included) instead of the summary lines
  bool print_tokens = false;  // print each hypothesis line as BLEU's 13a tokenisation sees it
};
int score_main(const ScoreCliOptions& opt);

}  // namespace meshmoe
