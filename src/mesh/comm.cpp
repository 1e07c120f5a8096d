// Backend-independent pieces of Comm.
#include "mesh/comm.hpp"

namespace meshmoe {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U64: return 8;
    case DType::U8: return 1;
  }
  throw Error("dtype_size: unknown DType");
}

std::string Comm::broadcast_string(std::string s, int root) {
  if (device_memory()) throw Error(name() + ": broadcast_string needs host memory");
  return broadcast_sized(std::move(s), [&](void* p, size_t n) { broadcast_raw(p, n, DType::U8, root); });
}

void Comm::reduce_scatterv_in_place_raw(void*, const size_t*, DType, Op) {
  throw Error(name() + ": reduce_scatterv is not supported by this backend");
}

void Comm::all_gatherv_in_place_raw(void*, const size_t*, DType) {
  throw Error(name() + ": all_gatherv is not supported by this backend");
}

void Comm::check_rank(int r, const char* what, bool allow_none) const {
  if (allow_none && r == kNoRank) return;
  if (r < 0 || r >= size())
    throw Error(name() + ": " + what + " rank " + std::to_string(r) + " is outside the group (0.." +
                std::to_string(size() - 1) + ")");
}

}  // namespace meshmoe
