// The 1F1B schedule: every micro-batch forward then backward once per stage, warm-up depth P-p-1,
// and, simulated with blocking receives and buffered sends, every schedule completes (no deadlock)
// with each forward after the previous stage's forward and each backward after the next stage's.
#include <catch2/catch.hpp>

#include <map>

#include "parallel/pipeline_schedule.hpp"

using namespace meshmoe;

TEST_CASE("pipeline: 1F1B op order on each stage", "[pipeline]") {
  using V = std::vector<PipelineOp>;
  CHECK(one_f_one_b(0, 1, 3) == V{{true, 0}, {false, 0}, {true, 1}, {false, 1}, {true, 2}, {false, 2}});
  CHECK(one_f_one_b(0, 2, 3) == V{{true, 0}, {true, 1}, {false, 0}, {true, 2}, {false, 1}, {false, 2}});
  CHECK(one_f_one_b(1, 2, 3) == V{{true, 0}, {false, 0}, {true, 1}, {false, 1}, {true, 2}, {false, 2}});
  CHECK(one_f_one_b(0, 4, 2) == V{{true, 0}, {true, 1}, {false, 0}, {false, 1}});
  CHECK_THROWS(one_f_one_b(2, 2, 1));
}

TEST_CASE("pipeline: simulated 1F1B runs complete with the data dependencies respected", "[pipeline]") {
  for (int P = 1; P <= 5; ++P)
    for (int M = 1; M <= 7; ++M) {
      std::vector<std::vector<PipelineOp>> ops(P);
      std::vector<size_t> pc(P, 0);
      for (int p = 0; p < P; ++p) ops[p] = one_f_one_b(p, P, M);
      std::map<std::pair<int, int>, bool> fdone, bdone;  // (stage, micro)
      int in_flight_max = 0;
      std::vector<int> in_flight(P, 0);
      for (bool progress = true; progress;) {
        progress = false;
        for (int p = 0; p < P; ++p) {
          if (pc[p] == ops[p].size()) continue;
          const PipelineOp op = ops[p][pc[p]];
          // A forward needs the previous stage's forward; a backward the next stage's backward
          // (the last stage's backward needs its own forward).
          const bool ready = op.forward ? (p == 0 || fdone[{p - 1, op.micro}])
                                        : (p == P - 1 ? fdone[{p, op.micro}] : bdone[{p + 1, op.micro}]);
          if (!ready) continue;
          (op.forward ? fdone : bdone)[{p, op.micro}] = true;
          in_flight[p] += op.forward ? 1 : -1;
          in_flight_max = std::max(in_flight_max, in_flight[p]);
          ++pc[p];
          progress = true;
        }
      }
      INFO("P=" << P << " M=" << M);
      for (int p = 0; p < P; ++p) {
        CHECK(pc[p] == ops[p].size());
        CHECK(ops[p].size() == size_t(2 * M));
      }
      CHECK(in_flight_max <= std::min(P, M));
    }
}
