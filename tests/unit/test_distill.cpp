// Distillation's soft-target cross-entropy against PyTorch: the hidden case [distill-torch] writes,
// per case, logits, targets, mask, the teacher's logits and probabilities (SoftmaxRow), alpha,
// weight, and the C++ loss, per-token losses and dlogits to $MESHMOE_TEST_TMPDIR/distill_ref.h5;
// tests/reference/distill_reference.py recomputes them with torch autograd (tolerances stated there).
// Run by tests/scripts/distill_vs_torch.sh.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "io/h5.hpp"
#include "model/cross_entropy.hpp"
#include "model/cross_entropy_bodies.hpp"
#include "tensor/launch_rows.hpp"
#include "test_util.hpp"

using namespace meshmoe;

namespace {

struct SoftCase {
  std::string name;
  int N, V;
  double alpha, scale;  // logit scale: 30 makes near one-hot rows
  bool masked;
};

void write_case(h5::File& f, const SoftCase& c, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t NV = size_t(c.N) * c.V;
  std::vector<float> logits(NV), teacher(NV), probs(NV), mask(size_t(c.N), 1.0f);
  for (auto& x : logits) x = float(c.scale) * normal(gen);
  for (auto& x : teacher) x = float(c.scale) * normal(gen);
  std::vector<int32_t> targets(size_t(c.N));
  for (int n = 0; n < c.N; ++n) targets[size_t(n)] = int32_t(gen() % uint32_t(c.V));
  if (c.masked)
    for (int n = 0; n < c.N; n += 3) mask[size_t(n)] = 0.0f, targets[size_t(n)] = -1;
  for (int64_t n = 0; n < c.N; ++n) SoftmaxRow<float>{teacher.data(), probs.data(), c.V}(n, HostLanes{});
  double count = 0;
  for (float m : mask) count += m;
  const double weight = 1.0 / count;
  StepContext ctx;
  CrossEntropy<float> ce;
  const double loss = ce.forward(ctx, logits.data(), targets.data(), mask.data(), c.N, c.V, weight, probs.data(), c.alpha);
  std::vector<float> dlogits(NV);
  ce.backward(ctx, logits.data(), dlogits.data(), c.N);
  h5::Group g = f.create_group(c.name);
  g.set_attr("alpha", c.alpha);
  g.set_attr("weight", weight);
  g.set_attr("loss", loss);
  g.write("logits", logits, {c.N, c.V});
  g.write("teacher_logits", teacher, {c.N, c.V});
  g.write("probs", probs, {c.N, c.V});
  g.write("targets", targets, {c.N});
  g.write("mask", mask, {c.N});
  g.write("dlogits", dlogits, {c.N, c.V});
  g.write("hard", std::vector<double>(ce.per_token_loss().begin(), ce.per_token_loss().end()), {c.N});
  g.write("soft", std::vector<double>(ce.per_token_soft_loss().begin(), ce.per_token_soft_loss().end()), {c.N});
}

}  // namespace

TEST_CASE("soft-target cross entropy vs PyTorch: write the C++ side", "[.][distill-torch]") {
  const std::vector<SoftCase> cases{
      {"alpha_0.25", 24, 37, 0.25, 2.0, false},
      {"alpha_0", 16, 37, 0.0, 2.0, true},
      {"alpha_1", 16, 37, 1.0, 2.0, true},
      {"alpha_0.5_masked", 40, 259, 0.5, 3.0, true},
      {"peaked", 12, 64, 0.25, 30.0, true},
  };
  h5::File f = h5::File::create(test::scratch_dir() + "/distill_ref.h5");
  f.set_attr("cases", int64_t(cases.size()));
  uint32_t seed = 500;
  for (const SoftCase& c : cases) write_case(f, c, seed++);
  SUCCEED();
}
