// Helpers shared by the tests.
#pragma once
#include <mpi.h>

#include <cstdlib>
#include <string>

#include "tensor/launch.hpp"

namespace meshmoe::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
// A scratch directory shared by all ranks of this test job (created by rank 0).
inline std::string scratch_dir() {
  const char* d = std::getenv("MESHMOE_TEST_TMPDIR");
  return d ? d : "/tmp";
}

// RAII: the host loops of for_each_index run backwards (or not) while it lives, and forwards
// again afterwards, also when a REQUIRE throws (tensor/launch.hpp: the race check).
struct HostLoopsReversed {
  explicit HostLoopsReversed(bool reversed = true) { set_host_loop_reversed(reversed); }
  ~HostLoopsReversed() { set_host_loop_reversed(false); }
  HostLoopsReversed(const HostLoopsReversed&) = delete;
  HostLoopsReversed& operator=(const HostLoopsReversed&) = delete;
};

}  // namespace meshmoe::test
