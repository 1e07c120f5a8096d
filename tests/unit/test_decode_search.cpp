// Generation and beam search (src/decode/sampling.hpp, beam_search.hpp) against references that
// recompute the full forward for every prefix (no cache): greedy equals the argmax of the full
// recomputation at each step, top-k 1 equals greedy, the seed fixes the samples; beam 1 equals
// greedy, and the flat beam search (all hypotheses of a source in one stream, masked) equals a
// plain per-hypothesis beam search on random small models (dense, Switch, GShard top-2), in double
// precision: the same tokens, log-probabilities within 1e-9. The encoder-decoder the same way: the
// prompts' sources encoded once, each decoder started from BOS, against the full encdec forward of
// (source, BOS output) for every prefix.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "decode/beam_search.hpp"
#include "decode/sampling.hpp"
#include "decode_test_util.hpp"
#include "../test_util.hpp"

using namespace meshmoe;
using meshmoe::test::decode_config;
using meshmoe::test::full_logits;

namespace {

constexpr int kVocab = 23;

std::vector<std::vector<int32_t>> random_prompts(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> p;
  for (int len : {3, 5, 1, 4}) {
    auto& q = p.emplace_back();
    for (int t = 0; t < len; ++t) q.push_back(int32_t(rng() % kVocab));
  }
  return p;
}

// The log-softmax of row `at` of logits [., V].
std::vector<double> log_softmax_row(const std::vector<double>& logits, size_t at) {
  const double* row = logits.data() + at * kVocab;
  const double top = *std::max_element(row, row + kVocab);
  double z = 0;
  for (int v = 0; v < kVocab; ++v) z += std::exp(row[v] - top);
  std::vector<double> out(row, row + kVocab);
  for (double& x : out) x -= top + std::log(z);
  return out;
}

// The next token's log-probabilities after `seq` (a prompt and the output so far), recomputed in full.
using NextLogProbs = std::function<std::vector<double>(const std::vector<int32_t>& seq)>;

// A random model (`ffn`: dense, top1, top2; decoder, or encdec with a random source per prompt and
// the prompts all BOS) with its cached decoder, random prompts, greedy options and an EOS that
// greedy decoding meets: token `eos_at` of prompt `eos_prompt`'s output without EOS (so that
// finishing is exercised).
struct RandomDecoder {
  static constexpr int32_t kBos = 1;
  Transformer<double> model;
  CachedModel<double> cached;
  std::vector<std::vector<int32_t>> prompts, sources;
  SamplingOptions greedy;
  int32_t eos = -1;
  RandomDecoder(const char* ffn, uint64_t seed, uint32_t prompt_seed, int max_new, int eos_prompt, int eos_at,
                bool encdec = false)
      : model(encdec ? test::encdec_decode_config(ffn) : decode_config(ffn), kVocab),
        cached((model.init(seed, 1.0), model)),
        prompts(random_prompts(prompt_seed)) {
    if (encdec) {
      sources = prompts;
      prompts.assign(sources.size(), {kBos});
      cached.encode(sources);
    }
    greedy.max_new = max_new;
    eos = generate(cached, prompts, -1, greedy)[size_t(eos_prompt)][size_t(eos_at)];
  }
  // The full forward's next-token log-probabilities for prompt b.
  NextLogProbs oracle(size_t b) {
    if (sources.empty())
      return [this](const std::vector<int32_t>& seq) {
        return log_softmax_row(full_logits(model, seq, 1, int(seq.size())), seq.size() - 1);
      };
    return [this, b](const std::vector<int32_t>& seq) {
      int T_full = 0;
      const auto l = test::full_encdec_logits(model, {sources[b]}, {seq}, T_full);
      return log_softmax_row(l, seq.size() - 1);
    };
  }
};

std::vector<int32_t> greedy_reference(const NextLogProbs& next_log_probs, int seq_len, std::vector<int32_t> seq,
                                      int32_t eos, int max_new) {
  std::vector<int32_t> out;
  const int room = std::min(max_new, seq_len - int(seq.size()) + 1);
  while (int(out.size()) < room) {
    const std::vector<double> lp = next_log_probs(seq);
    const int32_t next = int32_t(std::max_element(lp.begin(), lp.end()) - lp.begin());
    if (next == eos) break;
    out.push_back(next);
    seq.push_back(next);
  }
  return out;
}

// The plain beam search: every hypothesis its own sequence, recomputed in full; the rule of
// beam_search.hpp written out again.
Hypothesis beam_reference(const NextLogProbs& next_log_probs, int seq_len, const std::vector<int32_t>& prompt,
                          int32_t eos, int K, double alpha, int max_len) {
  struct Hyp {
    std::vector<int32_t> tokens;
    double lp;
  };
  max_len = std::min(max_len, seq_len - int(prompt.size()) + 1);
  std::vector<Hyp> live{{{}, 0.0}};
  std::vector<Hypothesis> done;
  auto score = [&](double lp, int len) { return lp / std::pow((5.0 + len) / 6.0, alpha); };
  for (int t = 0; !live.empty(); ++t) {
    struct Cand {
      double lp;
      int h;
      int32_t v;
    };
    std::vector<Cand> all;
    for (int h = 0; h < int(live.size()); ++h) {
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), live[size_t(h)].tokens.begin(), live[size_t(h)].tokens.end());
      const std::vector<double> lp = next_log_probs(seq);
      for (int v = 0; v < kVocab; ++v) all.push_back({live[size_t(h)].lp + lp[size_t(v)], h, int32_t(v)});
    }
    std::sort(all.begin(), all.end(), [](const Cand& a, const Cand& b) {
      return a.lp != b.lp ? a.lp > b.lp : a.h != b.h ? a.h < b.h : a.v < b.v;
    });
    std::vector<Hyp> next;
    for (size_t c = 0; c < all.size() && c < size_t(2 * K) && int(next.size()) < K; ++c) {
      Hyp child{live[size_t(all[c].h)].tokens, all[c].lp};
      if (all[c].v == eos) {
        if (int(done.size()) < K)
          done.push_back({child.tokens, child.lp, true, score(child.lp, int(child.tokens.size()) + 1)});
        continue;
      }
      child.tokens.push_back(all[c].v);
      next.push_back(child);
    }
    live = next;
    if (int(done.size()) >= K || t + 1 >= max_len) {
      for (const Hyp& h : live) done.push_back({h.tokens, h.lp, false, score(h.lp, int(h.tokens.size()))});
      live.clear();
    }
  }
  Hypothesis best = done.front();
  for (const Hypothesis& h : done)
    if (h.score > best.score) best = h;
  return best;
}

}  // namespace

TEST_CASE("decode: choose_token's temperature, top-k and top-p cuts", "[decode]") {
  const double logits[4] = {std::log(0.2), std::log(0.5), std::log(0.3), -1e9};
  SamplingOptions o;
  CHECK(choose_token(logits, 4, o, 0.9) == 1);  // temperature 0: argmax
  o.temperature = 1;
  CHECK(choose_token(logits, 4, o, 0.49) == 1);  // sorted: 1 (0.5), 2 (0.3), 0 (0.2)
  CHECK(choose_token(logits, 4, o, 0.51) == 2);
  CHECK(choose_token(logits, 4, o, 0.81) == 0);
  o.top_k = 2;  // {1, 2}, mass 0.8
  CHECK(choose_token(logits, 4, o, 0.62) == 1);
  CHECK(choose_token(logits, 4, o, 0.63) == 2);
  CHECK(choose_token(logits, 4, o, 0.999) == 2);
  o.top_k = 0;
  o.top_p = 0.75;  // 0.5 + 0.3 >= 0.75: {1, 2}
  CHECK(choose_token(logits, 4, o, 0.63) == 2);
  o.top_p = 0.5;  // {1}
  CHECK(choose_token(logits, 4, o, 0.99) == 1);
}

TEST_CASE("decode: greedy generation equals the argmax of the full recomputation; top-k 1 equals greedy; seeded",
          "[decode]") {
  for (const char* ffn : {"dense", "top1", "top2"}) {
    SECTION(ffn) {
      RandomDecoder d(ffn, 17, 4, 8, 0, 2);
      auto& [model, cached, prompts, sources, greedy, eos] = d;
      const auto got = generate(cached, prompts, eos, greedy);
      for (size_t b = 0; b < prompts.size(); ++b)
        REQUIRE(got[b] == greedy_reference(d.oracle(b), model.shape().seq_len, prompts[b], eos, 8));
      REQUIRE(got[0].size() <= 2);  // the EOS stopped it (earlier when that token came before)

      SamplingOptions top1 = greedy;
      top1.temperature = 1.3;
      top1.top_k = 1;
      REQUIRE(generate(cached, prompts, eos, top1) == got);

      SamplingOptions sampled = greedy;
      sampled.temperature = 1.5;
      sampled.seed = 1;
      const auto a = generate(cached, prompts, -1, sampled);
      REQUIRE(generate(cached, prompts, -1, sampled) == a);
      // A prompt's samples do not depend on the batch it is decoded in.
      REQUIRE(generate(cached, {prompts[2]}, -1, sampled, 2)[0] == a[2]);
      int differ = 0;
      for (uint64_t seed : {2, 3, 4}) {
        sampled.seed = seed;
        differ += generate(cached, prompts, -1, sampled) != a;
      }
      REQUIRE(differ > 0);
    }
  }
}

TEST_CASE("decode: beam 1 equals greedy; flat beam search equals a plain per-hypothesis beam search", "[decode]") {
  for (const bool encdec : {false, true})
    for (const char* ffn : {"dense", "top1", "top2"}) {
      DYNAMIC_SECTION((encdec ? "encdec " : "decoder ") << ffn) {
        RandomDecoder d(ffn, 23, 8, 9, 1, 3, encdec);
        auto& [model, cached, prompts, sources, greedy, eos] = d;
        const int seq_len = model.shape().seq_len;
        const auto want = generate(cached, prompts, eos, greedy);
        BeamOptions one{1, 0.6, 9};
        const auto got = beam_search(cached, prompts, eos, one);
        for (size_t b = 0; b < prompts.size(); ++b) {
          REQUIRE(got[b].tokens == want[b]);
          REQUIRE(got[b].tokens == greedy_reference(d.oracle(b), seq_len, prompts[b], eos, 9));
        }

        for (const auto& [K, alpha] : std::vector<std::pair<int, double>>{{3, 0.6}, {4, 0.0}, {2, 1.0}}) {
          const BeamOptions opt{K, alpha, 9};
          const auto flat = beam_search(cached, prompts, eos, opt);
          REQUIRE(beam_search(cached, prompts, eos, opt)[0].tokens == flat[0].tokens);  // deterministic
          int ended = 0;
          for (size_t b = 0; b < prompts.size(); ++b) {
            const Hypothesis ref = beam_reference(d.oracle(b), seq_len, prompts[b], eos, K, alpha, 9);
            INFO("beam " << K << " alpha " << alpha << " prompt " << b);
            REQUIRE(flat[b].tokens == ref.tokens);
            REQUIRE(flat[b].ended == ref.ended);
            REQUIRE(flat[b].log_prob == Approx(ref.log_prob).epsilon(1e-9));
            REQUIRE(flat[b].score == Approx(ref.score).epsilon(1e-9));
            ended += ref.ended;
          }
          REQUIRE(ended > 0);  // EOS was met: finished hypotheses took part
        }
      }
    }
}
