// SIGUSR1 / SIGTERM / SIGINT / SIGHUP: a flag set by the handler and read at the next step boundary
// (and between evaluation batches), where the ranks agree on it (all-reduce) and stop together with
// a checkpoint (exit code 75). Slurm sends SIGUSR1 before a time limit (`#SBATCH
// --signal=B:USR1@120`) and SIGTERM on preemption or scancel; mpirun forwards ^C (INT) and HUP.
// For `meshmoe train` and `distill` they are installed as the executable is loaded (its
// .preinit_array, before any shared library's initialiser or static constructor runs) and again by
// main() before MPI_Init, so a stop request is never fatal; a stop before the first step exits 75
// saying there was nothing to checkpoint (run/run_checkpoints.hpp).
#pragma once

namespace meshmoe {

// Installs the handlers (idempotent).
void install_stop_signal_handlers();
// The signal received since start-up, or 0.
int stop_signal_received();

}  // namespace meshmoe
