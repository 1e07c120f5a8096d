// The host threads of the element-wise loops and of attention's tasks (tensor/launch.hpp): a
// fork-join pool of run.threads - 1 workers beside the calling thread. Workers block on a condition
// variable between jobs and never spin: between two loops OpenBLAS's own threads run the GEMMs on
// the same cores, and a spinning worker (as OpenMP's default wait policy does) would take a core
// from them. The converse holds too: OpenBLAS's idle threads spin (sched_yield) for 2^28 cycles
// after each threaded GEMM unless OPENBLAS_THREAD_TIMEOUT says less, and OpenBLAS reads it once,
// when the library loads, before main() (bench/RESULTS.md "OpenBLAS idle threads").
#pragma once
#include <cstdint>
#include <functional>

namespace meshmoe {

// log2 of the cycles an idle OpenBLAS thread spins before it sleeps (OpenBLAS's minimum).
inline constexpr const char* kOpenblasThreadTimeout = "4";
// The first call of main(): when OPENBLAS_THREAD_TIMEOUT is unset, sets it to kOpenblasThreadTimeout
// and replaces the process by a fresh run of its own executable (same pid and arguments: before
// MPI_Init nothing is lost), whose OpenBLAS then loads with it. A value in the environment wins.
void ensure_openblas_thread_timeout(char** argv);

// Threads of the host loops, the caller included (run.threads, set by the trainer); 1 by default.
int host_loop_threads();
void set_host_loop_threads(int threads);

// The thread count run.threads asks for: `threads`, or for 0 OPENBLAS_NUM_THREADS (1 when unset).
int requested_run_threads(int64_t threads);

// run.threads (and bench-gemm --threads): this rank's BLAS and host-loop threads; 0 keeps
// OPENBLAS_NUM_THREADS, or 1 when it is unset (OpenBLAS would start one thread per core in every
// rank). Returns the count OpenBLAS reports afterwards.
int apply_run_threads(int64_t threads);

// Runs part(p) for every p in [0, parts), parts <= host_loop_threads(), part 0 on the calling
// thread, and returns when all are done. A part must not throw. Not reentrant: inside a part,
// in_host_parts() is true and loops run serially.
void run_host_parts(int parts, const std::function<void(int)>& part);
bool in_host_parts();

// OpenBLAS's thread count is global: for_each_task (tensor/launch.hpp) sets it to 1 while its
// tasks run.
void set_blas_threads_for_tasks(bool tasks_running);

// The host loops of for_each_index run backwards on one thread (the race check of
// tensor/launch.hpp).
bool host_loop_reversed();
// Tests only: the race check on or off.
void set_host_loop_reversed(bool reversed);

}  // namespace meshmoe
