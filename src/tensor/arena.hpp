// A pooled allocator for a device's memory (docs/ARCHITECTURE.md "Device memory"): large chunks
// from a backend (cudaMalloc-family on the GPU, aligned host memory in the tests), carved into
// aligned blocks first-fit by address, freed blocks coalesced with their free neighbours inside a
// chunk. A block is never value-initialised. The chunks go back to the backend only when the
// arena is destroyed, so a run that reserves its planned bytes up front (`reserve`, from the memory
// plan's table) makes one backend call for its whole model.
//
// Thread-safe (one mutex): host task loops may allocate scratch concurrently.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace meshmoe {

class Arena {
 public:
  struct Backend {
    std::function<void*(size_t)> alloc;       // throws on failure
    std::function<void(void*)> free;          // noexcept in spirit: called from the destructor
  };
  struct Stats {
    size_t in_use = 0;          // bytes of live blocks (rounded to the alignment)
    size_t high_water = 0;      // most in_use so far
    size_t reserved = 0;        // bytes held from the backend (all chunks)
    int64_t chunks = 0;         // backend allocations so far
    int64_t allocations = 0;    // allocate() calls so far
    size_t largest_free = 0;    // the biggest block allocate() could return without a new chunk
  };

  // New chunks are at least chunk_bytes; blocks start at multiples of `alignment` (a power of two)
  // from their chunk's start, which the backend must align at least as much.
  Arena(Backend backend, size_t chunk_bytes, size_t alignment = 256);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Makes sure a block of `bytes` can be had without a further backend call.
  void reserve(size_t bytes);
  // A block of at least `bytes` (a zero-byte request gets a block of one alignment unit).
  void* allocate(size_t bytes);
  // p must come from allocate() of this arena and not be freed yet (checked: std::logic_error).
  void deallocate(void* p);
  bool owns(const void* p) const;
  bool contains(const void* p) const;  // p lies in one of the chunks (a block's start or inside it)

  Stats stats() const;  // Tests only: the arena's use so far

 private:
  size_t round_up(size_t bytes) const { return (bytes + alignment_ - 1) & ~(alignment_ - 1); }
  void add_chunk(size_t bytes);  // with the mutex held
  char* take(size_t bytes);      // with the mutex held: first fit, or nullptr

  Backend backend_;
  size_t chunk_bytes_, alignment_;
  mutable std::mutex mutex_;
  std::map<char*, size_t> chunks_;            // start -> bytes
  std::map<char*, size_t> free_;              // start -> bytes, never two adjacent in one chunk
  std::unordered_map<char*, size_t> busy_;    // start -> bytes
  Stats stats_;
};

}  // namespace meshmoe
