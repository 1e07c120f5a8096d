// A command's start-up (docs/ARCHITECTURE.md "One run"): from the validated deck and its Mesh, in
// this order and each once, the vocabulary, the shape rules, the Placement, the ShapeTable, the
// MemoryPlan and the memory check, before anything large is allocated. Whatever builds a model
// (the Trainer and the host copy it decodes with, the distillation's teacher and baseline, the
// decoders of generate, translate and eval) takes this rank's pieces from here; `meshmoe plan` and
// the trainer's log print the stages' plans.
#pragma once
#include <mpi.h>

#include <optional>
#include <string>
#include <vector>

#include "deck/config.hpp"
#include "mesh/mesh.hpp"
#include "model/placement.hpp"
#include "model/shape_table.hpp"
#include "run/memory.hpp"
#include "run/memory_limit.hpp"

namespace meshmoe {

class Startup {
 public:
  // `train` and `distill`'s student. Collective over the mesh's ranks:
  //   1. the vocabulary: model.vocab_size, else the dataset's (data.path's vocab_size, read on rank 0
  //      before the data is loaded); when it cannot be known nothing below is computed (the trainer,
  //      opening the data, says what is wrong with it);
  //   2. the shape rules, the batch's included (CheckedShapes);
  //   3.-5. the placement (placement_at), shape table and memory plan of every pipeline stage's
  //      first rank (data and tensor rank 0; every rank computes every stage, so that an error is
  //      every rank's alike) and of this rank (the same pieces when it is one of them);
  //   6. the memory check of this rank's stage (check_memory_plan, run.device = "cpu"): a plan the
  //      nodes cannot hold is refused on every rank (exit 2).
  static Startup training(const Config& cfg, const Mesh& mesh);
  // `meshmoe plan`: steps 1-5 for the stages only (no piece of this rank, no check).
  static Startup stages(const Config& cfg, const Mesh& mesh);
  // The same for a mesh planned in one process, without its ranks (`meshmoe plan` on fewer ranks
  // than the mesh has): every figure is a function of the deck and the shape. Collective over `world`.
  static Startup stages(const Config& cfg, const MeshShape& shape, MPI_Comm world);
  // A model run forward only (generate, translate, eval; distill's teacher and baseline): the
  // vocabulary given, the shape rules (the batch's too with with_batch, and then the table holds
  // the micro-batch's buffers), this rank's placement and shape table; no plan, no check.
  static Startup forward_only(const Config& cfg, int vocab, const Mesh& mesh, bool with_batch);

  int vocab() const { return vocab_; }  // <= 0: unknown (training: nothing after step 1 was computed)
  const Placement& placement() const;   // this rank's, sizes only
  const ShapeTable& table() const;      // this rank's
  const MemoryPlan& plan() const;       // this rank's (training)

  // This rank's placement with the mesh's Comms (model_sharding): what its model is built with, once
  // the device is chosen (the axes' Comms are then the device's). Collective over the data axis the
  // first time the mesh makes the expert groups.
  Placement placement_on(Mesh& mesh) const;

  // Collective over `world`: refuses (InputError on every rank) the vocabulary of the loaded data,
  // `vocab` (model_vocab), when it is not the one the start-up planned with on rank 0 before
  // (another file on another node, or the file rewritten since), or when there is none.
  void agree_vocab(int vocab, MPI_Comm world) const;

  // Collective over `world`: the report `meshmoe plan` prints and the trainer logs (memory_report:
  // one column per stage; with optim.shard_state rank 0 plans the stages' other data ranks too),
  // ending with an "available memory: ..., the plan fits" line, on rank 0 ("" elsewhere). Without
  // a vocabulary it says so instead of numbers.
  // `planned`: the memory of a node the mesh is planned on and its ranks, instead of the nodes of
  // `world` (a plan in one process).
  std::string memory_report(MPI_Comm world, const NodeShare* planned = nullptr) const;

 private:
  Startup(const Config& cfg, const MeshShape& shape, RankCoords me);
  // Steps 1-5; with `mine` this rank's pieces too.
  void plan_stages(MPI_Comm world, bool mine);

  const Config* cfg_;
  MeshShape mesh_;
  RankCoords me_;
  int vocab_ = 0;
  std::string no_vocab_;  // rank 0: why the dataset's vocabulary could not be read
  std::optional<CheckedShapes> checked_;
  ModelCounts counts_;
  std::vector<MemoryPlan> stage_plans_;  // stage s's first rank (data and tensor rank 0)
  Placement placement_;
  std::optional<ShapeTable> table_;
  std::optional<MemoryPlan> plan_;
};

}  // namespace meshmoe
