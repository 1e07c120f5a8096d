// `meshmoe train`: the training loop. Reads the dataset, builds the model on this rank's part of
// the mesh, trains run.steps optimizer steps, evaluates, and writes runs/<name>/ (DESIGN.md
// "Files a run writes").
#pragma once
#include "deck/deck.hpp"
#include "mesh/mesh.hpp"

namespace meshmoe {

// Returns the process exit code: kExitOk when the run finished, kExitCheckpointed when a signal or
// run.max_walltime stopped it with a checkpoint, kExitFailure after run.max_bad_steps non-finite steps
// or when a checkpoint is due and the parameters or optimizer state are not finite (none written).
int train_main(const Deck& deck, Mesh& mesh, const std::string& version);

}  // namespace meshmoe
