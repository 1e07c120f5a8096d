#include "decode/beam_search.hpp"

#include <algorithm>
#include <cmath>

namespace meshmoe {

double length_penalty(int length, double alpha) { return std::pow((5.0 + length) / 6.0, alpha); }

namespace {

struct Candidate {
  double log_prob;
  int hyp;
  int32_t token;
};

bool ranks_before(const Candidate& a, const Candidate& b) {
  if (a.log_prob != b.log_prob) return a.log_prob > b.log_prob;
  return a.hyp != b.hyp ? a.hyp < b.hyp : a.token < b.token;
}

// log-softmax of one row of logits [V], in double
template <typename T>
void log_softmax(const T* logits, int V, std::vector<double>& out) {
  out.resize(size_t(V));
  const double top = double(*std::max_element(logits, logits + V));
  double z = 0;
  for (int v = 0; v < V; ++v) z += std::exp(double(logits[v]) - top);
  const double lse = top + std::log(z);
  for (int v = 0; v < V; ++v) out[size_t(v)] = double(logits[v]) - lse;
}

struct Live {
  std::vector<int32_t> tokens;
  double log_prob = 0;
  std::vector<uint8_t> sees;  // [capacity] the keys of the source's stream this hypothesis sees
  int row = 0;                // its row in the last logits
};

Hypothesis finish(const Live& h, bool ended, double alpha) {
  const int length = int(h.tokens.size()) + (ended ? 1 : 0);
  return Hypothesis{h.tokens, h.log_prob, ended, h.log_prob / length_penalty(length, alpha)};
}

}  // namespace

template <typename T>
std::vector<Hypothesis> beam_search(CachedModel<T>& model, const std::vector<std::vector<int32_t>>& prompts,
                                    int32_t eos, const BeamOptions& opt) {
  const int B = int(prompts.size()), K = opt.beam, V = model.vocab();
  std::vector<Hypothesis> best(prompts.size());
  if (B == 0 && !model.lockstep()) return best;
  std::vector<int> max_len(prompts.size()), row;
  int longest = 0;
  for (int b = 0; b < B; ++b) {
    const int P = int(prompts[size_t(b)].size());
    max_len[size_t(b)] = std::min(opt.max_len, model.max_positions() - P + 1);
    longest = std::max(longest, P);
  }
  // No output passes model.seq_len: a --max-len beyond it asks for no room beyond it.
  const int capacity = longest + K * std::clamp(opt.max_len, 1, model.max_positions());
  model.reset(B, capacity);
  const Buffer<T>* logits = &model.prefill(prompts, row);
  std::vector<std::vector<Live>> live(prompts.size());
  std::vector<std::vector<Hypothesis>> finished(prompts.size());
  for (int b = 0; b < B; ++b) {
    Live& root = live[size_t(b)].emplace_back();
    root.sees.assign(size_t(capacity), 0);
    std::fill(root.sees.begin(), root.sees.begin() + std::ptrdiff_t(prompts[size_t(b)].size()), uint8_t(1));
    root.row = row[size_t(b)];
  }
  std::vector<double> lp;
  std::vector<Candidate> cand;
  std::vector<int32_t> tokens, stream, position;
  std::vector<uint8_t> visible;
  std::vector<std::pair<int, int>> fed;  // (source, live index) of each fed token
  for (int t = 0;; ++t) {
    tokens.clear(), stream.clear(), position.clear(), visible.clear(), fed.clear();
    for (int b = 0; b < B; ++b) {
      std::vector<Live>& hyps = live[size_t(b)];
      if (hyps.empty()) continue;
      if (max_len[size_t(b)] < 1) {  // no position left after the prompt
        finished[size_t(b)].push_back(finish(hyps.front(), false, opt.alpha));
        hyps.clear();
        continue;
      }
      cand.clear();
      for (int h = 0; h < int(hyps.size()); ++h) {
        log_softmax(logits->data() + size_t(hyps[size_t(h)].row) * V, V, lp);
        for (int v = 0; v < V; ++v) cand.push_back({hyps[size_t(h)].log_prob + lp[size_t(v)], h, int32_t(v)});
      }
      const size_t top = std::min(cand.size(), size_t(2 * K));
      std::partial_sort(cand.begin(), cand.begin() + std::ptrdiff_t(top), cand.end(), ranks_before);
      std::vector<Live> next;
      std::vector<Hypothesis>& done = finished[size_t(b)];
      for (size_t c = 0; c < top && int(next.size()) < K; ++c) {
        const Live& parent = hyps[size_t(cand[c].hyp)];
        Live child{parent.tokens, cand[c].log_prob, {}, 0};
        if (cand[c].token == eos) {
          if (int(done.size()) < K) done.push_back(finish(child, true, opt.alpha));
          continue;
        }
        child.tokens.push_back(cand[c].token);
        child.sees = parent.sees;
        next.push_back(std::move(child));
      }
      hyps = std::move(next);
      if (int(done.size()) >= K || t + 1 >= max_len[size_t(b)]) {
        for (const Live& h : hyps) done.push_back(finish(h, false, opt.alpha));
        hyps.clear();
        continue;
      }
      for (int h = 0; h < int(hyps.size()); ++h) {
        fed.emplace_back(b, h);
        tokens.push_back(hyps[size_t(h)].tokens.back());
        stream.push_back(b);
        position.push_back(int32_t(prompts[size_t(b)].size()) + t);
        visible.insert(visible.end(), hyps[size_t(h)].sees.begin(), hyps[size_t(h)].sees.end());
      }
    }
    if (!model.keep_stepping(!tokens.empty())) break;
    logits = &model.step(tokens.data(), CachedTokens{int(tokens.size()), stream.data(), position.data(), visible.data()});
    for (size_t i = 0; i < fed.size(); ++i) {
      Live& h = live[size_t(fed[i].first)][size_t(fed[i].second)];
      h.sees[size_t(model.where()[i])] = 1;
      h.row = int(i);
    }
  }
  for (int b = 0; b < B; ++b) {
    const std::vector<Hypothesis>& done = finished[size_t(b)];
    best[size_t(b)] = *std::max_element(done.begin(), done.end(),
                                        [](const Hypothesis& x, const Hypothesis& y) { return x.score < y.score; });
  }
  return best;
}

template std::vector<Hypothesis> beam_search<float>(CachedModel<float>&, const std::vector<std::vector<int32_t>>&, int32_t,
                                                    const BeamOptions&);
template std::vector<Hypothesis> beam_search<double>(CachedModel<double>&, const std::vector<std::vector<int32_t>>&,
                                                     int32_t, const BeamOptions&);

}  // namespace meshmoe
