#include "parallel/state_shards.hpp"

#include <algorithm>
#include <numeric>

namespace meshmoe {

namespace {
// Parts the greedy fill needs when no part may exceed `cap` (cap >= every size).
int parts_needed(std::span<const size_t> sizes, size_t cap) {
  int parts = 1;
  size_t fill = 0;
  for (size_t s : sizes) {
    if (fill + s > cap) ++parts, fill = 0;
    fill += s;
  }
  return parts;
}
}  // namespace

std::vector<int> partition_whole_entries(std::span<const size_t> sizes, int parts) {
  std::vector<int> part(sizes.size(), 0);
  if (sizes.empty() || parts <= 1) return part;
  // The smallest cap that fits in `parts` runs (binary search: parts_needed falls as cap grows).
  size_t lo = *std::max_element(sizes.begin(), sizes.end());
  size_t hi = std::max(lo, std::accumulate(sizes.begin(), sizes.end(), size_t(0)));
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (parts_needed(sizes, mid) <= parts) hi = mid;
    else lo = mid + 1;
  }
  // Then each part in turn, up to about its share of what is left (an entry goes where its middle
  // falls), never above the cap, and closing a part only while the rest still fits the later ones.
  int p = 0;
  size_t fill = 0, left = std::accumulate(sizes.begin(), sizes.end(), size_t(0));  // parts >= p
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (fill > 0 && p + 1 < parts) {
      const double share = double(left) / double(parts - p);
      const bool over = fill + sizes[i] > lo || double(fill) + 0.5 * double(sizes[i]) > share;
      if (over && parts_needed(sizes.subspan(i), lo) <= parts - p - 1) ++p, left -= fill, fill = 0;
    }
    fill += sizes[i];
    part[i] = p;
  }
  return part;
}

std::vector<int> state_owners(const ParamStore<float>& store, int data_size) {
  const auto& infos = store.infos();
  std::vector<size_t> replicated, sizes;
  for (size_t e = 0; e < infos.size(); ++e)
    if (!(infos[e].sharded_over & kShardData)) replicated.push_back(e), sizes.push_back(infos[e].size);
  std::vector<int> owner(infos.size(), kEveryDataRank);
  const std::vector<int> part = partition_whole_entries(sizes, data_size);
  for (size_t i = 0; i < replicated.size(); ++i) owner[replicated[i]] = part[i];
  return owner;
}

std::vector<size_t> owned_entries(std::span<const int> owners, int data_rank) {
  std::vector<size_t> out;
  for (size_t e = 0; e < owners.size(); ++e)
    if (owners[e] == kEveryDataRank || owners[e] == data_rank) out.push_back(e);
  return out;
}

}  // namespace meshmoe
