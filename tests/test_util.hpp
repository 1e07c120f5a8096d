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
#include "tensor/blas.hpp"
#include "tensor/deferred_device.hpp"
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

// RAII: the deferred host device while it lives (tensor/deferred_device.hpp: launches and GEMMs wait for
// device_synchronize, and a host access to a Buffer without it stops the test with SIGSEGV).
struct DeferredHostDevice {
  explicit DeferredHostDevice(DeviceAccess access = DeviceAccess::AfterWait) { set_deferred_host_device(true, access); }
  ~DeferredHostDevice() { set_deferred_host_device(false); }
  DeferredHostDevice(const DeferredHostDevice&) = delete;
  DeferredHostDevice& operator=(const DeferredHostDevice&) = delete;
};

// RAII: the GEMM precision (tensor/blas.hpp) while it lives, the previous one after.
class GemmPrecisionScope {
 public:
  explicit GemmPrecisionScope(Precision p) : saved_(gemm_precision()) { set_gemm_precision(p); }
  ~GemmPrecisionScope() { set_gemm_precision(saved_); }
  GemmPrecisionScope(const GemmPrecisionScope&) = delete;
  GemmPrecisionScope& operator=(const GemmPrecisionScope&) = delete;

 private:
  Precision saved_;
};

// RAII: host Buffers come from `arena` while it lives (tensor/device.hpp).
struct HostBufferArena {
  explicit HostBufferArena(Arena* arena) { set_host_buffer_arena(arena); }
  ~HostBufferArena() { set_host_buffer_arena(nullptr); }
  HostBufferArena(const HostBufferArena&) = delete;
  HostBufferArena& operator=(const HostBufferArena&) = delete;
};

// Cuts `rows` sequences of `T` tokens into packed examples at random places (from `seed`; a new
// example starts at a token with probability 1 / new_one_in), as the batcher marks them: segment
// (example within the sequence) and position (within the example) of every token.
inline void random_packing(int rows, int T, uint32_t seed, int new_one_in, std::vector<int32_t>& segment,
                           std::vector<int32_t>& position) {
  std::mt19937 cuts(seed ^ 0x5e9u);
  segment.clear();
  position.clear();
  for (int i = 0; i < rows * T; ++i) {
    const bool starts = i % T == 0 || cuts() % unsigned(new_one_in) == 0;
    segment.push_back(i % T == 0 ? 0 : segment.back() + int32_t(starts));
    position.push_back(starts ? 0 : position.back() + 1);
  }
}

// `rows` sequences of `T` random tokens and targets below `V` (language 0), from `seed`; about one
// target in `masked_one_in` is masked out; packed examples of about 4 tokens.
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
  random_packing(rows, T, seed, 4, b.segment, b.position);
  return b;
}

}  // namespace meshmoe::test
