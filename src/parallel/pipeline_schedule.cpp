#include "parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/error.hpp"

namespace meshmoe {

std::vector<PipelineOp> one_f_one_b(int stage, int stages, int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1)
    throw std::logic_error("one_f_one_b: bad stage, stage count or micro-batch count");
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<PipelineOp> ops;
  for (int m = 0; m < warmup; ++m) ops.push_back({true, m});
  for (int m = warmup; m < micro_batches; ++m) {
    ops.push_back({true, m});
    ops.push_back({false, m - warmup});
  }
  for (int m = micro_batches - warmup; m < micro_batches; ++m) ops.push_back({false, m});
  return ops;
}

double ideal_bubble(int stages, int micro_batches) {
  return double(stages - 1) / double(micro_batches + stages - 1);
}

}  // namespace meshmoe
