#include "tensor/arena.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace meshmoe {

Arena::Arena(Backend backend, size_t chunk_bytes, size_t alignment)
    : backend_(std::move(backend)), chunk_bytes_(chunk_bytes), alignment_(alignment) {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0)
    throw std::logic_error("Arena: alignment " + std::to_string(alignment) + " is not a power of two");
  chunk_bytes_ = round_up(std::max<size_t>(chunk_bytes_, alignment_));
}

Arena::~Arena() {
  for (const auto& [start, bytes] : chunks_) backend_.free(start);
}

void Arena::add_chunk(size_t bytes) {
  bytes = std::max(round_up(bytes), chunk_bytes_);
  char* start = static_cast<char*>(backend_.alloc(bytes));
  if (reinterpret_cast<uintptr_t>(start) % alignment_ != 0) {
    backend_.free(start);
    throw std::logic_error("Arena: the backend returned memory not aligned to " + std::to_string(alignment_));
  }
  chunks_.emplace(start, bytes);
  free_.emplace(start, bytes);
  stats_.reserved += bytes;
  stats_.chunks += 1;
}

char* Arena::take(size_t bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    char* start = it->first;
    const size_t rest = it->second - bytes;
    free_.erase(it);
    if (rest > 0) free_.emplace(start + bytes, rest);
    busy_.emplace(start, bytes);
    return start;
  }
  return nullptr;
}

void Arena::reserve(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  bytes = round_up(std::max<size_t>(bytes, 1));
  for (const auto& [start, size] : free_)
    if (size >= bytes) return;
  add_chunk(bytes);
}

void* Arena::allocate(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  bytes = round_up(std::max<size_t>(bytes, 1));
  char* p = take(bytes);
  if (!p) {
    add_chunk(bytes);
    p = take(bytes);
  }
  stats_.in_use += bytes;
  stats_.high_water = std::max(stats_.high_water, stats_.in_use);
  stats_.allocations += 1;
  return p;
}

void Arena::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  char* p = static_cast<char*>(ptr);
  const auto busy = busy_.find(p);
  if (busy == busy_.end()) throw std::logic_error("Arena: deallocate of a pointer this arena did not give out");
  size_t bytes = busy->second;
  busy_.erase(busy);
  stats_.in_use -= bytes;
  // Coalesce with the free blocks on either side, never across a chunk boundary (chunks go back to
  // the backend one by one).
  auto next = free_.lower_bound(p);
  if (next != free_.end() && next->first == p + bytes && !chunks_.count(p + bytes)) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == p && !chunks_.count(p)) {
      prev->second += bytes;
      return;
    }
  }
  free_.emplace(p, bytes);
}

bool Arena::owns(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return busy_.count(static_cast<char*>(const_cast<void*>(ptr))) != 0;
}

bool Arena::contains(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const char* p = static_cast<const char*>(ptr);
  auto it = chunks_.upper_bound(const_cast<char*>(p));
  if (it == chunks_.begin()) return false;
  --it;
  return p < it->first + it->second;
}

Arena::Stats Arena::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats s = stats_;
  for (const auto& [start, bytes] : free_) s.largest_free = std::max(s.largest_free, bytes);
  return s;
}

}  // namespace meshmoe
