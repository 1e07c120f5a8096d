// Test helpers over src/mesh: mesh shapes to sweep, and the Comm calls only the tests make.
#pragma once
#include <cstddef>
#include <vector>

#include "mesh/comm.hpp"
#include "mesh/mesh.hpp"

namespace meshmoe::test {

// Every shape with pipe * data * tensor == world_size.
inline std::vector<MeshShape> all_mesh_shapes(int world_size) {
  std::vector<MeshShape> out;
  for (int p = 1; p <= world_size; ++p)
    for (int d = 1; d <= world_size; ++d)
      if (world_size % (p * d) == 0) out.push_back({p, d, world_size / (p * d)});
  return out;
}

inline const char* op_name(Op op) {
  switch (op) {
    case Op::Sum: return "sum";
    case Op::Max: return "max";
    case Op::Min: return "min";
  }
  return "?";
}

// Comm::reduce_scatter_raw, typed: send [size * n_per_rank] -> recv [n_per_rank], rank r's block r
// reduced over all ranks.
template <class T>
void reduce_scatter(Comm& c, const T* send, T* recv, size_t n_per_rank, Op op = Op::Sum) {
  c.reduce_scatter_raw(send, recv, n_per_rank, dtype_of<T>(), op);
}

// Comm::permute_raw, typed, with different counts each way.
template <class T>
void send_recv(Comm& c, const T* send, size_t n_send, int dest, T* recv, size_t n_recv, int source) {
  c.permute_raw(send, n_send, dest, recv, n_recv, source, dtype_of<T>());
}

}  // namespace meshmoe::test
