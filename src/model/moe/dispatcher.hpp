// Local permutation between token order [N, M] and the expert buffers, driven by the router's
// (expert, slot, gate) triples (Tutel / Megatron style index form: the fast path). Every token
// dispatcher (token_dispatcher.hpp) permutes with it, through the local dispatcher's token side.
//
// The buffer is expert-major (GShard's EGCM order, Algorithm 2 line 3), so that splitting it over the
// expert dimension for an all-to-all is a contiguous split, and compact: only the filled slots have
// a row, in (expert, group, slot) order, rows[e] rows per expert. Slots of an (expert, group) are
// filled from 0 up (router.cpp), so a row is start(e, g) + slot; a slot left empty below the
// highest filled one (moe.declined_takes_slot) is a zero row that no token reads. The full [E, G, C, M] form of
// Algorithm 2 would add all-zero rows for the empty slots: under capacity routing at least a
// fifth of the rows at capacity factor 1.25, under dropless routing (C = S) most of them. The expert
// FFN has no biases, so an empty row's output is zero and leaving it out changes no result (only
// the blocking of the GEMMs' sums: the last bits).
// The layout may hold only the experts [e0, e0 + count) (expert_axis = tensor: this rank's
// experts); choices of other experts have no row. This class never communicates: a dispatcher that
// moves the buffers between ranks goes between dispatch() and the experts, and between the experts
// and combine().
#pragma once
#include <cstdint>
#include <vector>

#include "model/moe/router.hpp"
#include "tensor/device.hpp"

namespace meshmoe {

struct DispatchLayout {
  int e0 = 0, count = -1;  // experts held; count < 0: all from e0
};

template <typename T>
class IndexDispatcher {
 public:
  // Builds the row <-> choice maps of routing r in two parts: count_rows (device work: the rows of
  // each expert and group), then map_rows (a wait: the host sizes the maps from the counts; then
  // device work: the maps). The MoE layer reads the router's totals at that wait, between the two.
  // token_offset: global index of local token 0.
  void count_rows(const Routing<T>& r, DispatchLayout layout = {});
  void map_rows(const Routing<T>& r, uint64_t token_offset);
  // Room for `rows` rows in the maps, so that map_rows() does not reallocate below it.
  void reserve(size_t rows);

  // x [N, M] -> buf [rows, M] (overwritten); buf16 (optional): buf's bf16 copy, in the same pass
  void dispatch(const Routing<T>& r, const T* x, T* buf, int M, uint16_t* buf16 = nullptr) const;
  // dbuf [rows, M] -> dx [N, M] (added)
  void dispatch_backward(const Routing<T>& r, const T* dbuf, T* dx, int M) const;

  // out [rows, M] -> y [N, M] (overwritten): y[n] = sum over n's choices that have a row of
  // gate * out[row] (GShard Algorithm 2 line 8 in index form)
  void combine(const Routing<T>& r, const T* out, T* y, int M) const;
  // dy [N, M], out [rows, M] -> dout [rows, M] (overwritten), dgate [N*k] (overwritten;
  // dgate = <dy[n], out[row]>, 0 for a choice without a row)
  void combine_backward(const Routing<T>& r, const T* dy, const T* out, T* dout, T* dgate, int M) const;

  // The plan of the last forward (activation_stash.hpp).
  template <class F>
  void saved_state(F&& f) {
    f(slot_token_);
    f(slot_global_);
    f(slot_choice_);
    f(choice_row_);
    f(token_rows_);
    f(expert_rows_);
  }

  size_t rows() const { return slot_token_.size(); }
  // [experts held] rows of each expert, in buffer order.
  const std::vector<int>& expert_rows() const { return expert_rows_; }
  // [rows] global token index in each row, -1 for an empty slot (keys the expert dropout).
  const Buffer<int64_t>& slot_token_global() const { return slot_global_; }
  // Tests only: [rows] local token index in each row, -1 for an empty slot.
  const Buffer<int>& slot_token() const { return slot_token_; }
  // Tests only: [N*k] row of each choice, -1 when not dispatched or held elsewhere.
  const Buffer<int64_t>& choice_row() const { return choice_row_; }

 private:
  Buffer<int> slot_token_;
  Buffer<int64_t> slot_global_;
  Buffer<int64_t> slot_choice_;  // [rows] choice in each row, -1 for an empty slot
  Buffer<int64_t> choice_row_;
  Buffer<int64_t> token_rows_;   // [N, k] rows of each token's choices, ascending, -1 after the last
  std::vector<int> expert_rows_;
  // plan's scratch: first row and rows of (e, g) [experts held, G], each group's first bad choice
  // [G], and what the host reads (PlanStarts) [experts held + 2]
  Buffer<int64_t> start_, fill_, bad_, sizes_;
  int e0_ = 0, el_ = 0;  // count_rows' layout: experts [e0, e0 + el) held
};

}  // namespace meshmoe
