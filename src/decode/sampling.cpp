#include "decode/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/philox.hpp"

namespace meshmoe {

template <typename T>
int32_t choose_token(const T* logits, int V, const SamplingOptions& opt, double u) {
  if (opt.temperature <= 0) return int32_t(std::max_element(logits, logits + V) - logits);
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const size_t keep = opt.top_k > 0 ? std::min<size_t>(size_t(opt.top_k), order.size()) : order.size();
  std::vector<double> p(keep);
  const double top = double(logits[order[0]]);
  double z = 0;
  for (size_t i = 0; i < keep; ++i) z += p[i] = std::exp((double(logits[order[i]]) - top) / opt.temperature);
  size_t nucleus = keep;
  if (opt.top_p < 1) {
    double acc = 0;
    for (size_t i = 0; i < keep; ++i)
      if ((acc += p[i]) >= opt.top_p * z) {
        nucleus = i + 1;
        break;
      }
  }
  const double mass = std::accumulate(p.begin(), p.begin() + std::ptrdiff_t(nucleus), 0.0);
  double acc = 0;
  for (size_t i = 0; i < nucleus; ++i)
    if (u * mass < (acc += p[i])) return order[i];
  return order[nucleus - 1];
}

template <typename T>
std::vector<std::vector<int32_t>> generate(CachedModel<T>& model, const std::vector<std::vector<int32_t>>& prompts,
                                           int32_t eos, const SamplingOptions& opt, uint64_t first_index) {
  const int B = int(prompts.size()), V = model.vocab();
  std::vector<std::vector<int32_t>> out(prompts.size());
  if (B == 0 && !model.lockstep()) return out;
  std::vector<int> room(prompts.size()), row;
  int longest = 0;
  for (int b = 0; b < B; ++b) {
    // The last token is never fed back, so it may take the position after model.seq_len's last.
    room[size_t(b)] = std::min(opt.max_new, model.max_positions() - int(prompts[size_t(b)].size()) + 1);
    longest = std::max(longest, int(prompts[size_t(b)].size()));
  }
  model.reset(B, longest + std::clamp(opt.max_new, 0, model.max_positions()));
  const Buffer<T>* logits = &model.prefill(prompts, row);
  const Rng rng{opt.seed, 0, 0, RngPurpose::Sampling};
  std::vector<bool> active(size_t(B), true);
  std::vector<int32_t> tokens, stream, position;
  for (uint32_t t = 0;; ++t) {
    tokens.clear(), stream.clear(), position.clear();
    const Rng at_step{rng.seed, t, rng.layer, rng.purpose};
    for (int b = 0; b < B; ++b) {
      if (!active[size_t(b)] || int(out[size_t(b)].size()) >= room[size_t(b)]) continue;
      const int32_t next = choose_token(logits->data() + size_t(row[size_t(b)]) * V, V, opt,
                                        at_step.uniform_double(first_index + uint64_t(b)));
      if (next == eos) {
        active[size_t(b)] = false;
        continue;
      }
      out[size_t(b)].push_back(next);
      if (int(out[size_t(b)].size()) == room[size_t(b)]) continue;  // full: no need to feed it
      row[size_t(b)] = int(tokens.size());
      tokens.push_back(next);
      stream.push_back(b);
      position.push_back(int32_t(prompts[size_t(b)].size() + t));
    }
    if (!model.keep_stepping(!tokens.empty())) break;
    logits = &model.step(tokens.data(), CachedTokens{int(tokens.size()), stream.data(), position.data()});
  }
  return out;
}

template int32_t choose_token<float>(const float*, int, const SamplingOptions&, double);
template int32_t choose_token<double>(const double*, int, const SamplingOptions&, double);
template std::vector<std::vector<int32_t>> generate<float>(CachedModel<float>&, const std::vector<std::vector<int32_t>>&,
                                                           int32_t, const SamplingOptions&, uint64_t);
template std::vector<std::vector<int32_t>> generate<double>(CachedModel<double>&, const std::vector<std::vector<int32_t>>&,
                                                            int32_t, const SamplingOptions&, uint64_t);

}  // namespace meshmoe
