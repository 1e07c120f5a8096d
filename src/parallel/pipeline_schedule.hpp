// The 1F1B pipeline schedule (PipeDream-Flush, Narayanan et al. 2021; Pipeline-MoE section 3.3.5):
// stage p of P runs min(P-p-1, M) warm-up forwards, then alternates one forward and one backward,
// then drains the remaining backwards. At most P-p micro-batches are in flight on stage p.
#pragma once
#include <string>
#include <vector>

namespace meshmoe {

struct PipelineOp {
  bool forward = true;
  int micro = 0;
  bool operator==(const PipelineOp&) const = default;
};

// The ops of `stage` (0-based) of `stages` for `micro_batches` micro-batches, in execution order.
std::vector<PipelineOp> one_f_one_b(int stage, int stages, int micro_batches);

// model.recompute (Recompute, src/deck/options.hpp): what a stage keeps of a micro-batch between
// its forward and its backward.

// The ideal 1F1B bubble fraction (P-1)/(M+P-1) of P stages and M micro-batches (Narayanan et al.
// 2021, section 2.2), against which the measured one is reported.
double ideal_bubble(int stages, int micro_batches);

}  // namespace meshmoe
