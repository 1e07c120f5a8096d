// Helpers shared by the tests.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>

#include "data/batcher.hpp"
#include "deck/options.hpp"
#include "tensor/launch.hpp"

namespace meshmoe {
// Catch prints an option's value by its deck name.
template <DeckOption E>
std::ostream& operator<<(std::ostream& os, E value) {
  return os << option_name(value);
}
}  // namespace meshmoe

namespace meshmoe::test {

// The value of option E that a deck name spells (src/deck/options.hpp), for cases named by strings.
template <class E>
E option(const std::string& name) {
  const auto v = parse_option<E>(name);
  if (!v) throw std::invalid_argument("not a name of this option: " + name);
  return *v;
}

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

// `rows` sequences of `T` random tokens and targets below `V` (language 0), from `seed`; about one
// target in `masked_one_in` is masked out.
inline Batch random_batch(int rows, int T, int V, uint32_t seed, int masked_one_in) {
  std::mt19937 rng(seed);
  Batch b;
  b.rows = rows;
  b.seq_len = T;
  for (int i = 0; i < rows * T; ++i) {
    b.inputs.push_back(int32_t(rng() % V));
    b.targets.push_back(int32_t(rng() % V));
    b.lang.push_back(0);
    b.mask.push_back(rng() % masked_one_in == 0 ? 0.f : 1.f);
  }
  return b;
}

}  // namespace meshmoe::test
