// `meshmoe bench-comm`: time the collectives a sharded MoE step uses (all_reduce, all_to_all,
// all_gather, permute) against the message size, over one mesh axis (GShard figure 9 analogue),
// through MPI on host buffers or (--device cuda) through NCCL on device buffers, as a GPU run's
// data and tensor axes move them.
//
// Size convention (as NCCL-tests): the size S of a row is the bytes of one rank's largest buffer:
//   all_reduce  in-place buffer of S bytes (float, sum)
//   all_to_all  send and receive buffers of S bytes, S/n to and from each of the n ranks
//   all_gather  receive buffer of S bytes, S/n contributed by each rank
//   permute     S bytes sent to rank+1 and S bytes received from rank-1 (ring shift)
// algbw = S / time; busbw = algbw * factor, factor 2(n-1)/n (all_reduce), (n-1)/n (all_to_all,
// all_gather), 1 (permute): the per-link traffic of the optimal algorithm, comparable across n.
// Elements are float; when S/n is not a whole number of floats the blocks are rounded down and
// the bytes actually moved are used for the bandwidths (and written as /<op>/bytes).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace meshmoe {

struct BenchCommOptions {
  std::string sizes;                    // "1K,64K,1M" (K/M/G = 2^10/2^20/2^30); "" = 1 KiB, 4 KiB, ..., 16 MiB
  std::string ops;                      // "all_reduce,permute"; "" = all four
  std::string mesh;                     // "PxDxT"; "" = the whole world along --axis
  std::string axis = "data";            // data | tensor | pipe
  int iters = 0;                        // timed calls per size; 0 = adaptive (>= 0.05 s or 100 calls)
  std::string output = "bench-comm.h5"; // written by rank 0
  bool quiet = false;                   // no table on stdout
  std::string max_memory;               // "8G": memory per node for the buffers; "" = detect (train/memory_limit.hpp)
  std::string shm = "on";               // on | off | resident: the shared-memory sums of a group on one node
                                        // (run.shm_collectives); resident: all_reduce's buffer node-shared
  std::string device = "cpu";           // cpu: host buffers, MPI; cuda: one GPU per rank, device buffers, NCCL
};

// Collective over MPI_COMM_WORLD (call on every rank). Returns an exit code; bad options raise
// InputError on every rank alike.
int bench_comm_main(const BenchCommOptions& opt);

// ---- pieces, exposed for the tests ---------------------------------------------------------------

// "1024,64K,1M" -> {1024, 65536, 1048576}. InputError naming the bad entry for anything but a
// positive whole number of bytes with an optional K|M|G|T suffix (also KiB/MiB/GiB, case-insensitive),
// a multiple of 4 (float elements) and at most 1 GiB.
std::vector<int64_t> parse_sizes(const std::string& text);
// Powers of 4 from 1 KiB to 16 MiB.
std::vector<int64_t> default_sizes();
// The busbw factor of an op over n ranks (see above); InputError for an unknown op.
double bus_factor(const std::string& op, int n);
// The ops bench-comm knows, in table order.
const std::vector<std::string>& bench_ops();

}  // namespace meshmoe
