// Parameter initialisation (Switch section 2.4): truncated normal with std sqrt(s / fan_in), values
// beyond two standard deviations resampled; keyed by parameter name and logical index, so a block
// gets exactly the values of the same elements of the whole parameter.
#include <catch2/catch.hpp>

#include <cmath>

#include "model/params.hpp"

using namespace meshmoe;

TEST_CASE("params: truncated-normal init has the stated scale and bound", "[params]") {
  ParamStore<double> store;
  ParamView<double> w, ones, zeros;
  const double fan_in = 64, s = 0.1;
  store.add("w", {512, 256}, InitKind::TruncNormal, fan_in, &w);
  store.add("g", {7}, InitKind::Ones, 1, &ones);
  store.add("b", {7}, InitKind::Zeros, 1, &zeros);
  store.allocate();
  store.init(42, s);
  const double sigma = std::sqrt(s / fan_in);
  double sum = 0, sq = 0, max_abs = 0;
  for (size_t i = 0; i < w.size; ++i) {
    sum += w.w[i];
    sq += w.w[i] * w.w[i];
    max_abs = std::max(max_abs, std::abs(w.w[i]));
  }
  const double n = double(w.size), mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  // A standard normal truncated to [-2, 2] has standard deviation 0.87962566; with n = 131072
  // samples the sample mean and sd are within 5 standard errors of theirs.
  CHECK(max_abs <= 2 * sigma);
  CHECK(std::abs(mean) <= 5 * 0.8796 * sigma / std::sqrt(n));
  CHECK(std::abs(sd - 0.87962566 * sigma) <= 5 * 0.8796 * sigma / std::sqrt(2 * n));
  for (size_t i = 0; i < 7; ++i) {
    CHECK(ones.w[i] == 1.0);
    CHECK(zeros.w[i] == 0.0);
  }
  // Another seed gives other values; the same seed the same ones.
  ParamStore<double> again;
  ParamView<double> w2;
  again.add("w", {512, 256}, InitKind::TruncNormal, fan_in, &w2);
  again.allocate();
  again.init(42, s);
  CHECK(std::equal(w.w, w.w + w.size, w2.w));
  again.init(43, s);
  CHECK(!std::equal(w.w, w.w + w.size, w2.w));
}

TEST_CASE("params: a block is initialised like the same elements of the whole parameter", "[params]") {
  ParamStore<float> whole, part;
  ParamView<float> a, b;
  whole.add("blocks.0.moe.experts.w_in", {4, 6, 10}, InitKind::TruncNormal, 6, &a);
  part.add_block("blocks.0.moe.experts.w_in", {4, 6, 10}, {2, 6, 5}, {2, 0, 5}, InitKind::TruncNormal, 6, &b);
  whole.allocate();
  part.allocate();
  whole.init(7, 1.0);
  part.init(7, 1.0);
  for (int e = 0; e < 2; ++e)
    for (int m = 0; m < 6; ++m)
      for (int h = 0; h < 5; ++h) CHECK(b.w[(e * 6 + m) * 5 + h] == a.w[((e + 2) * 6 + m) * 10 + (h + 5)]);
}
