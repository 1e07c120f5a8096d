// Which data rank owns each parameter's optimizer state with optim.shard_state (ZeRO stage 1,
// Rajbhandari et al. 2020, section 5.1; docs/ARCHITECTURE.md "Sharded optimizer state"). The
// data ranks of one (pipe, tensor) group hold the same data-replicated parameters; each of those is
// owned by one of them, which alone keeps its state, sums its gradient (reduce-scatter) and updates
// it (then all-gathers it). Ownership is by WHOLE parameters, in contiguous runs of the flat buffer in
// data-rank order, so that the Optimizer's owned entries, Adafactor's factored accumulators and the
// checkpoint's per-parameter state tensors stay as they are, and one reduce-scatter / all-gather per
// contiguous run of the flat buffer moves every rank's part. Parameters split over data (experts
// with moe.expert_axis = data) are owned by every data rank, each its own block, as without sharding.
#pragma once
#include <cstddef>
#include <span>
#include <vector>

#include "model/params.hpp"

namespace meshmoe {

// Cuts `sizes` (element counts, in order) into `parts` contiguous runs, run r for part r, so that
// the largest run is as small as possible (whole entries: at least the largest entry), and the
// others near an equal share of the rest. Returns the part of each entry.
std::vector<int> partition_whole_entries(std::span<const size_t> sizes, int parts);

// The owning data rank of each entry of `store` among `data_size` data ranks: the partition of
// the data-replicated entries (by local size), or kEveryDataRank for an entry split over data.
inline constexpr int kEveryDataRank = -1;
std::vector<int> state_owners(const ParamStore<float>& store, int data_size);

// The entries whose state data rank `data_rank` keeps (owners from state_owners), in store order.
std::vector<size_t> owned_entries(std::span<const int> owners, int data_rank);

}  // namespace meshmoe
