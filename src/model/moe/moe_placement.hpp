// Where the experts of one MoE layer live on the mesh (DESIGN.md "The mesh", issue 4):
//   expert_axis = data   (GShard / Switch): data rank d owns experts [d*E/D, (d+1)*E/D); tokens move
//                        with two all-to-alls over the data axis. With tensor > 1 (Switch 5.5) each
//                        expert's hidden units are also split over the tensor ranks. With expert
//                        replicas (mesh.expert_parallel = P < D, DeepSpeed-MoE's ep_size) "the data
//                        axis" here is the rank's expert group of P data ranks: data_rank is
//                        d mod P, data_size P, and `replicas` = D / P ranks hold the same experts.
//   expert_axis = tensor (Pipeline-MoE, seed 003 section 3.3, Algorithm 1): tensor rank t owns
//                        experts [t*E/T, (t+1)*E/T); tokens are replicated over tensor, dispatch is a
//                        local index selection and combine an all-reduce over tensor.
// The default placement is everything on this rank (the single-rank layer).
#pragma once
#include <stdexcept>
#include <string>

#include "core/error.hpp"
#include "deck/options.hpp"
#include "mesh/comm.hpp"
#include "model/layer_shapes.hpp"

namespace meshmoe {

struct MoePlacement {
  ExpertAxis axis = ExpertAxis::Data;
  Comm* data = nullptr;  // all-to-all of expert_axis = data (may be null when data_size = 1)
  int data_rank = 0, data_size = 1;  // in the expert group
  int replicas = 1;  // data ranks holding each of this rank's experts (mesh.data / expert group)
  Comm* tensor = nullptr;  // all-reduce of expert_axis = tensor, and of Switch 5.5 (null when tensor_size = 1)
  int tensor_rank = 0, tensor_size = 1;

  // Experts split over the data axis (all-to-all path).
  bool expert_parallel_data() const { return axis == ExpertAxis::Data && data_size > 1; }
  // Each expert's hidden units split over tensor (Switch 5.5).
  bool hidden_split() const { return axis == ExpertAxis::Data && tensor_size > 1; }
  // Experts split over the tensor axis (index-select + all-reduce path).
  bool expert_parallel_tensor() const { return axis == ExpertAxis::Tensor && tensor_size > 1; }

  // Checks against a layer of E experts with hidden width H (the deck checks the same rules with
  // key names; this guards other callers). Throws std::logic_error for missing communicators.
  // shared_H: the shared experts' hidden width n H (0: none).
  void validate(int E, int H, int shared_H = 0) const {
    const int ways = axis == ExpertAxis::Data ? data_size : tensor_size;
    if (E % ways != 0)
      throw InputError("moe.num_experts = " + std::to_string(E) + " is not divisible by the " +
                       (axis == ExpertAxis::Data ? "data" : "tensor") + " axis (" + std::to_string(ways) + " ranks)");
    if (hidden_split() && H % tensor_size != 0)
      throw InputError("expert d_ff = " + std::to_string(H) + " is not divisible by mesh.tensor = " +
                       std::to_string(tensor_size) + " (expert hidden units are split over the tensor axis)");
    if (tensor_size > 1 && shared_H % tensor_size != 0)
      throw InputError("moe.shared_experts x expert d_ff = " + std::to_string(shared_H) +
                       " is not divisible by mesh.tensor = " + std::to_string(tensor_size) +
                       " (the shared experts' hidden units are split over the tensor axis)");
    if (expert_parallel_data() && !data) throw std::logic_error("MoePlacement: data_size > 1 without a data Comm");
    if ((hidden_split() || expert_parallel_tensor() || (shared_H > 0 && tensor_size > 1)) && !tensor)
      throw std::logic_error("MoePlacement: tensor_size > 1 without a tensor Comm");
  }
  // This rank's block of a layer of E experts of hidden width H (model width M): experts split over
  // the expert axis, hidden units over tensor when hidden_split(). The weights of experts split over
  // data are not summed over data by the trainer (with replicas: over their replica group only); split over tensor (whole experts or their hidden
  // units) they are not identical over tensor.
  ExpertShape expert_shape(int M, int E, int H, Activation act) const {
    const Split experts = axis == ExpertAxis::Data ? split_evenly(E, data_rank, data_size)
                                                   : split_evenly(E, tensor_rank, tensor_size);
    const Split hidden = hidden_split() ? split_evenly(H, tensor_rank, tensor_size) : whole(H);
    uint8_t shard = kShardNone;
    if (expert_parallel_data()) shard |= kShardData;
    if (expert_parallel_data() && replicas > 1) shard |= kShardReplicas;
    if (hidden_split() || expert_parallel_tensor()) shard |= kShardTensor;
    return {E, experts.offset, experts.local, ffn_shape(M, H, act, hidden), shard};
  }
  // This rank's block of the shared experts as one feed-forward of hidden width nH (moe_layer.hpp):
  // hidden units split over tensor like the dense feed-forward's (Megatron), whatever the expert axis.
  FfnShape shared_shape(int M, int nH, Activation act) const {
    return ffn_shape(M, nH, act, tensor_size > 1 ? split_evenly(nH, tensor_rank, tensor_size) : whole(nH));
  }
};

}  // namespace meshmoe
