#include "app/score_cli.hpp"

#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "app/text_input.hpp"
#include "core/error.hpp"
#include "score/bleu.hpp"
#include "score/chrf.hpp"

namespace meshmoe {

namespace {

template <size_t K>
std::string json_array(const std::array<int64_t, K>& a) {
  std::string s = "[";
  for (size_t i = 0; i < K; ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + "]";
}

}  // namespace

int score_main(const ScoreCliOptions& opt) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return kExitOk;
  const std::vector<std::string> hyp = split_lines(read_text_input(opt.hyp, "score --hyp")),
                                 ref = split_lines(read_text_input(opt.ref, "score --ref"));
  if (hyp.size() != ref.size())
    throw InputError(opt.hyp + " has " + std::to_string(hyp.size()) + " lines but " + opt.ref + " has " +
                     std::to_string(ref.size()) + ": one translation per reference line");
  if (opt.print_tokens) {
    for (const auto& line : hyp) std::printf("%s\n", tokenize_13a_text(line).c_str());
    return kExitOk;
  }
  BleuStats b;
  ChrfStats c;
  for (size_t i = 0; i < hyp.size(); ++i) {
    b.add(hyp[i], ref[i]);
    c.add(hyp[i], ref[i]);
  }
  const BleuScore bleu = bleu_score(b);
  const double chrf = chrf_score(c);
  if (opt.json) {
    std::printf("{\"sentences\": %zu, \"bleu\": %.17g, \"precisions\": [%.17g, %.17g, %.17g, %.17g], "
                "\"brevity_penalty\": %.17g, \"hyp_len\": %lld, \"ref_len\": %lld, \"matches\": %s, \"totals\": %s, "
                "\"chrf\": %.17g, \"chrf_hyp\": %s, \"chrf_ref\": %s, \"chrf_matches\": %s}\n",
                hyp.size(), bleu.score, bleu.precisions[0], bleu.precisions[1], bleu.precisions[2], bleu.precisions[3],
                bleu.brevity_penalty, (long long)b.hyp_len, (long long)b.ref_len, json_array(b.matches).c_str(),
                json_array(b.totals).c_str(), chrf, json_array(c.hyp).c_str(), json_array(c.ref).c_str(),
                json_array(c.matches).c_str());
    return kExitOk;
  }
  std::printf("BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f ratio = %.3f hyp_len = %lld ref_len = %lld; 13a, exp smoothing)\n",
              bleu.score, bleu.precisions[0], bleu.precisions[1], bleu.precisions[2], bleu.precisions[3],
              bleu.brevity_penalty, b.ref_len > 0 ? double(b.hyp_len) / double(b.ref_len) : 0.0, (long long)b.hyp_len,
              (long long)b.ref_len);
  std::printf("chrF2 = %.2f (character orders 1-%d, whitespace removed)\n", chrf, kChrfOrder);
  return kExitOk;
}

}  // namespace meshmoe
