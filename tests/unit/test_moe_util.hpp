// Shared helpers of the MoE tests (test_moe_*.cpp).
#pragma once
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mesh/mesh.hpp"
#include "model/moe/moe_layer.hpp"

namespace meshmoe::test {

// A small MoE layer config: M=6, E=4, H=5, S=8 unless changed by the caller.
inline MoeOptions small_moe(RouterKind router, Activation act = Activation::Relu) {
  MoeOptions o;
  o.d_model = 6;
  o.num_experts = 4;
  o.d_ff = 5;
  o.activation = act;
  o.router = router;
  o.top_k = router == RouterKind::Top1 ? 1 : router == RouterKind::Top2 ? 2 : 3;
  o.group_size = 8;
  o.capacity_factor_train = 1.0;
  o.capacity_factor_eval = 2.0;
  o.layer_id = 3;
  return o;
}

// One MoE layer with its own parameter store, initialised from `seed`.
template <typename T>
struct MoeHarness {
  ParamStore<T> store;
  std::unique_ptr<MoeLayer<T>> layer;
  explicit MoeHarness(const MoeOptions& opt, uint64_t seed = 7, double init_scale = 1.0) {
    layer = std::make_unique<MoeLayer<T>>(opt);
    layer->declare(store, "moe");
    store.allocate();
    store.init(seed, init_scale);
  }
};

// The placement model_sharding makes on `mesh` (one pipeline stage), for a layer instead of a deck:
// the experts over `axis`, the expert group the whole data axis.
inline Placement layer_placement(Mesh& mesh, ExpertAxis axis) {
  Placement p;
  p.data_rank = mesh.coord(Axis::Data);
  p.data_size = mesh.extent(Axis::Data);
  p.tensor = &mesh.axis(Axis::Tensor);
  p.tensor_rank = mesh.coord(Axis::Tensor);
  p.tensor_size = mesh.extent(Axis::Tensor);
  p.expert_axis = axis;
  p.expert_parallel = axis == ExpertAxis::Data ? p.data_size : 1;
  p.expert_group = &mesh.axis(Axis::Data);
  return p;
}

inline std::vector<double> normal_vector(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// Routing decisions only (expert and slot of every choice): what must not change under a finite
// difference step.
template <typename T>
inline std::vector<int> decisions(const Routing<T>& r) {
  std::vector<int> d(r.expert.begin(), r.expert.end());
  d.insert(d.end(), r.slot.begin(), r.slot.end());
  return d;
}

}  // namespace meshmoe::test
