#include "model/placement.hpp"

#include <stdexcept>
#include <string>

#include "core/error.hpp"
#include "deck/config.hpp"
#include "deck/shape_rules.hpp"
#include "mesh/mesh.hpp"
#include "model/shape_table.hpp"

namespace meshmoe {

void Placement::validate_experts(int E, int H, int shared_H) const {
  const bool over_data = expert_axis == ExpertAxis::Data;
  const int ways = over_data ? expert_parallel : tensor_size;
  if (E % ways != 0)
    throw InputError("moe.num_experts = " + std::to_string(E) + " is not divisible by the " +
                     (over_data ? "data" : "tensor") + " axis (" + std::to_string(ways) + " ranks)");
  if (hidden_split() && H % tensor_size != 0)
    throw InputError("expert d_ff = " + std::to_string(H) + " is not divisible by mesh.tensor = " +
                     std::to_string(tensor_size) + " (expert hidden units are split over the tensor axis)");
  if (tensor_size > 1 && shared_H % tensor_size != 0)
    throw InputError("moe.shared_experts x expert d_ff = " + std::to_string(shared_H) +
                     " is not divisible by mesh.tensor = " + std::to_string(tensor_size) +
                     " (the shared experts' hidden units are split over the tensor axis)");
  if (expert_parallel_data() && !expert_group)
    throw std::logic_error("Placement: expert groups of " + std::to_string(expert_parallel) +
                           " data ranks without their Comm");
  if ((hidden_split() || expert_parallel_tensor() || (shared_H > 0 && tensor_size > 1)) && !tensor)
    throw std::logic_error("Placement: tensor_size > 1 without a tensor Comm");
}

ExpertShape Placement::expert_shape(int M, int E, int H, Activation act) const {
  const Split experts = expert_axis == ExpertAxis::Data ? split_evenly(E, expert_rank(), expert_parallel)
                                                        : split_evenly(E, tensor_rank, tensor_size);
  const Split hidden = hidden_split() ? split_evenly(H, tensor_rank, tensor_size) : whole(H);
  uint8_t shard = kShardNone;
  if (expert_parallel_data()) shard |= kShardData;
  if (expert_parallel_data() && replicas() > 1) shard |= kShardReplicas;
  if (hidden_split() || expert_parallel_tensor()) shard |= kShardTensor;
  return {E, experts.offset, experts.local, ffn_shape(M, H, act, hidden), shard};
}

FfnShape Placement::shared_shape(int M, int nH, Activation act) const {
  return ffn_shape(M, nH, act, tensor_size > 1 ? split_evenly(nH, tensor_rank, tensor_size) : whole(nH));
}

Placement placement_at(const Config& cfg, const MeshShape& mesh, const RankCoords& at) {
  Placement p;
  p.pipe_rank = at.pipe, p.pipe_size = mesh.pipe;
  p.data_rank = at.data, p.data_size = mesh.data;
  p.tensor_rank = at.tensor, p.tensor_size = mesh.tensor;
  p.expert_axis = cfg.moe.expert_axis;
  p.expert_parallel = int(expert_parallel(cfg, mesh.data));
  return p;
}

Placement model_sharding(Mesh& mesh, const Config& cfg) {
  return model_sharding(mesh, placement_at(cfg, mesh.shape(),
                                           RankCoords{mesh.coord(Axis::Pipe), mesh.coord(Axis::Data), mesh.coord(Axis::Tensor)}));
}

Placement model_sharding(Mesh& mesh, Placement p) {
  if (MeshShape{p.pipe_size, p.data_size, p.tensor_size} != mesh.shape() || p.pipe_rank != mesh.coord(Axis::Pipe) ||
      p.data_rank != mesh.coord(Axis::Data) || p.tensor_rank != mesh.coord(Axis::Tensor))
    throw std::logic_error("model_sharding: the placement of another rank or mesh than this one");
  p.tensor = &mesh.axis(Axis::Tensor);
  const int P = p.expert_parallel;
  if (P == p.data_size) {
    p.expert_group = &mesh.axis(Axis::Data);
  } else if (P > 1 && p.data_size % P == 0) {
    const Mesh::ExpertComms c = mesh.expert_comms(P);
    p.expert_group = c.group, p.replica_group = c.replicas;
  }
  return p;
}

}  // namespace meshmoe
