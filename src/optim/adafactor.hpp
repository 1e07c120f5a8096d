// Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory
// Cost", Algorithms 4 and 5), configured as GShard appendix A.2: factored second moments,
// beta1 = 0 (no first moment), beta2_t = 1 - t^(-0.8), update clipping threshold d = 1.0, and a
// plain learning-rate schedule (no relative step size, no parameter-scale multiplication).
//
// For update t (1-based), with c = optim.adafactor_decay, eps1 = optim.adafactor_eps,
// d = optim.adafactor_clip and lr = schedule(t):
//   beta2_t = 1 - t^(-c)                                     (S&S section 7.2; 0 at t = 1)
// Matrix X [n, m] (factored, Alg. 4); a param with >= 2 dims [..., n, m] is a batch of such
// matrices (expert weights [E, M, H]: one factorisation per expert):
//   R_t = beta2_t R_{t-1} + (1 - beta2_t) mean_j (G_t^2 + eps1)        R [n]   (row means)
//   C_t = beta2_t C_{t-1} + (1 - beta2_t) mean_i (G_t^2 + eps1)        C [m]   (column means)
//   V_t = R_t C_t^T / mean_i(R_t)                                     V [n, m]
// This is Alg. 4's R C / (1^T R) with sums replaced by means: the ratio is the same, the stored
// numbers do not depend on the size of the dims.
// Vector X [n] (unfactored, Alg. 5):
//   V_t = beta2_t V_{t-1} + (1 - beta2_t)(G_t^2 + eps1)
// Both:
//   U_t = G_t / sqrt(V_t)
//   U^_t = U_t / max(1, RMS(U_t) / d)       RMS over every element of the (logical) parameter,
//                                           as Mesh TensorFlow does for a whole variable
//   X_t = X_{t-1} - lr * U^_t
// Sharded params: row means, column means, mean_i(R) and RMS(U) are summed over the ranks holding
// the other blocks through the DimReduce hook, so any split gives the unsharded result.
#pragma once
#include "tensor/device.hpp"
#include "optim/optimizer.hpp"

namespace meshmoe {

struct AdafactorOptions {
  double decay = 0.8, eps1 = 1e-30, clip = 1.0;
  static AdafactorOptions from_config(const Config& cfg);
};

class Adafactor final : public Optimizer {
 public:
  Adafactor(const ParamStore<float>& store, std::vector<size_t> owned, AdafactorOptions opt, DimReduce reduce = {});
  void step(ParamStore<float>& store, double lr, int64_t t, double grad_scale = 1.0) override;
  std::vector<StateTensor> state() override;

  // Whether an owned entry is factored (>= 2 dims).
  static bool factored(const ParamInfo& p) { return p.local_shape.size() >= 2; }
  // Tests only: each owned entry's RMS(U_t) / d in the last step, before clipping (a transfer point).
  std::vector<double> last_rms_over_d() const;

 private:
  struct Entry {
    ParamInfo info;
    size_t batch = 1, rows = 0, cols = 0;   // factored: local [batch, rows, cols]
    Buffer<float> v_row, v_col;             // factored: [batch, rows], [batch, cols]
    Buffer<float> v;                        // unfactored: [size]
  };
  void reduce(const ParamInfo& p, int dim, double* buf, size_t n) const;
  AdafactorOptions opt_;
  DimReduce reduce_;
  std::vector<Entry> entries_;
  // Scratch for one param at a time, sized at construction for the largest owned entry:
  Buffer<double> row_sums_, col_sums_, row_moment_sums_;  // sums of G^2 [B, n], [B, m]; of v_row [B]
  Buffer<double> u_;                                      // U [size]
  Buffer<double> partials_;                               // chunk sums of U^2 (queue_sum_squares)
  // Per owned entry, the last step's sum of U^2, RMS(U) / d and clipped step (AdafactorClipFactor):
  Buffer<double> sum_u2_, rms_over_d_, step_;
};

}  // namespace meshmoe
