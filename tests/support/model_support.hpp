// Test helpers over src/model: a parameter by name and where an element of a rank's block lies in
// the whole parameter; the router's and the index dispatcher's two-part forward stages in one call
// (the MoE layer calls the parts apart, around its one wait).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/context.hpp"
#include "model/moe/dispatcher.hpp"
#include "model/moe/router.hpp"
#include "model/param_init_bodies.hpp"
#include "model/params.hpp"

namespace meshmoe::test {

// The entry of parameter `name` (nullptr when the store has none).
template <typename T>
const ParamInfo* find_param(const ParamStore<T>& store, const std::string& name) {
  for (const ParamInfo& p : store.infos())
    if (p.name == name) return &p;
  return nullptr;
}

// Logical (row-major, unsharded) index of local element `local` of parameter p.
inline uint64_t logical_index(const ParamInfo& p, size_t local) {
  return logical_element_index(int(p.local_shape.size()), p.local_shape.data(), p.offset.data(),
                               p.logical_shape.data(), int64_t(local));
}

// The router's forward: x [N, M] -> routing() and the host's copy of its totals.
template <typename T>
void route_and_read_totals(Router<T>& router, const StepContext& ctx, const T* x, int N) {
  router.route(ctx, x, N);
  router.read_totals();
}

// The row <-> choice maps of routing r (token_offset: global index of local token 0).
template <typename T>
void plan_rows(IndexDispatcher<T>& d, const Routing<T>& r, uint64_t token_offset, DispatchLayout layout = {}) {
  d.count_rows(r, layout);
  d.map_rows(r, token_offset);
}

}  // namespace meshmoe::test
