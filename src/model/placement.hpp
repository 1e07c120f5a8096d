// Where this rank's part of the model lives on the mesh (docs/ARCHITECTURE.md "Placement"): its
// coordinate and the extent of every axis, the Comms the layers talk over, and where the experts of
// the MoE layers sit (docs/ARCHITECTURE.md "The mesh"). Built once per run from the Mesh and the deck
// (docs/ARCHITECTURE.md "One run": placement_at, then its Comms by model_sharding); the Transformer,
// its MoE layers, their dispatchers, the gradient sync and the shape table all read this one object.
// The default is the whole model on one rank.
//   pipe:   stage p holds blocks [p L / pipe, (p+1) L / pipe); the first also embeds, the last has
//           ln_f, the head and the loss.
//   tensor: Megatron: heads and hidden units split over the tensor ranks.
//   expert_axis = data   (GShard / Switch): the data axis splits into expert groups of P =
//           expert_parallel consecutive data ranks (mesh.expert_parallel, DeepSpeed-MoE's ep_size;
//           "Expert replicas"); data rank d is rank d mod P of its group and owns experts
//           [(d mod P) E / P, (d mod P + 1) E / P); tokens move with two all-to-alls over the group.
//           The data / P groups are replicas of each other. With tensor > 1 (Switch 5.5) each
//           expert's hidden units are also split over the tensor ranks.
//   expert_axis = tensor (Pipeline-MoE, arXiv 2304.11414 section 3.3, Algorithm 1): tensor rank t owns
//           experts [t E / tensor, (t+1) E / tensor); tokens are replicated over tensor, dispatch is
//           a local index selection and combine an all-reduce over tensor. P = 1.
#pragma once
#include "deck/options.hpp"
#include "mesh/comm.hpp"
#include "model/layer_shapes.hpp"

namespace meshmoe {

struct Config;
class Mesh;
struct MeshShape;
struct RankCoords;

struct Placement {
  int pipe_rank = 0, pipe_size = 1;
  int data_rank = 0, data_size = 1;
  int tensor_rank = 0, tensor_size = 1;
  // The tensor axis: the f/g all-reduce of the tensor-parallel layers, the Switch 5.5 all-reduce
  // inside an expert, the Pipeline-MoE combine (null when tensor_size = 1 or sizes only).
  Comm* tensor = nullptr;
  ExpertAxis expert_axis = ExpertAxis::Data;
  int expert_parallel = 1;  // P: data ranks of an expert group (shape_rules.hpp expert_parallel)
  Comm* expert_group = nullptr;   // the all-to-all among the P ranks (the data axis when P = data_size)
  Comm* replica_group = nullptr;  // the data_size / P ranks holding this rank's experts, when 1 < P < data_size
  // The trainer's model: its weights and gradients in memory the data axis's collectives read
  // directly (ParamStore::allocate); model_sharding leaves it null. Must outlive the model.
  Comm* data = nullptr;
  // With `data`: the data ranks of a node hold one copy of the weights between them when no
  // parameter is split over data (optim.shard_state: each updates only what it owns).
  bool one_weight_copy = false;

  bool first_stage() const { return pipe_rank == 0; }
  bool last_stage() const { return pipe_rank == pipe_size - 1; }
  // This rank in its expert group, and the data ranks holding each of its experts.
  int expert_rank() const { return data_rank % expert_parallel; }
  int replicas() const { return data_size / expert_parallel; }
  // Experts split over the data axis (all-to-all path).
  bool expert_parallel_data() const { return expert_axis == ExpertAxis::Data && expert_parallel > 1; }
  // Each expert's hidden units split over tensor (Switch 5.5).
  bool hidden_split() const { return expert_axis == ExpertAxis::Data && tensor_size > 1; }
  // Experts split over the tensor axis (index-select + all-reduce path).
  bool expert_parallel_tensor() const { return expert_axis == ExpertAxis::Tensor && tensor_size > 1; }

  // Checks against an MoE layer of E experts with hidden width H (the deck checks the same rules
  // with key names; this guards other callers). Throws std::logic_error for missing communicators.
  // shared_H: the shared experts' hidden width n H (0: none).
  void validate_experts(int E, int H, int shared_H = 0) const;
  // This rank's block of an MoE layer of E experts of hidden width H (model width M): experts split
  // over the expert axis, hidden units over tensor when hidden_split(). The weights of experts split
  // over data are not summed over data by the trainer (with replicas: over their replica group
  // only); split over tensor (whole experts or their hidden units) they are not identical over tensor.
  ExpertShape expert_shape(int M, int E, int H, Activation act) const;
  // This rank's block of the shared experts as one feed-forward of hidden width nH (moe_layer.hpp):
  // hidden units split over tensor like the dense feed-forward's (Megatron), whatever the expert axis.
  FfnShape shared_shape(int M, int nH, Activation act) const;
};

// The placement of the rank at `at` of `mesh` for the model of `cfg`, sizes only (no Comms): what
// the shape table and the memory plan read.
Placement placement_at(const Config& cfg, const MeshShape& mesh, const RankCoords& at);

// This rank's placement `sizes` (placement_at's of this rank's coordinates on `mesh`) with the Comm
// of every axis it needs: collective over the data axis the first time the mesh makes the expert
// and replica groups (Mesh::expert_comms).
Placement model_sharding(Mesh& mesh, Placement sizes);
// The same from the deck: model_sharding(mesh, placement_at(cfg, mesh's shape, this rank)).
Placement model_sharding(Mesh& mesh, const Config& cfg);

}  // namespace meshmoe
