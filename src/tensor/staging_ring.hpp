// StagingRing: the room of a fixed staging area (the GPU backend's pinned host memory) handed out
// to copies that the device runs in the order they were queued. A copy from pageable host memory
// makes the host wait for the whole stream; from pinned memory it is queued like a kernel. So an
// upload copies the host's bytes into the ring and queues the device's copy from there; the room
// is reused only after the copies still reading it have finished (wait(ticket): the event recorded
// after that copy). Host code, so the tests check the bookkeeping without a GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <utility>

namespace meshmoe {

class StagingRing {
 public:
  static constexpr size_t kAlign = 256;

  // wait(ticket): returns once the copy issued under `ticket` has read its room.
  StagingRing(size_t capacity, std::function<void(uint64_t ticket)> wait)
      : capacity_(capacity), wait_(std::move(wait)) {}

  // The offset of `bytes` of room no queued copy still reads (waiting for the oldest copies where
  // the room is needed), or nullopt when the ring is smaller than `bytes` (copy another way).
  std::optional<size_t> take(size_t bytes) {
    const size_t need = (bytes + kAlign - 1) / kAlign * kAlign;
    if (need > capacity_ || need == 0) return std::nullopt;
    const size_t begin = head_ + need <= capacity_ ? head_ : 0;
    while (!in_flight_.empty() && overlaps_in_flight(begin, begin + need)) retire_oldest();
    head_ = begin + need;
    taken_ = {begin, begin + need};
    return begin;
  }
  // The copy that reads the room of the last take() was queued under `ticket`.
  void issued(uint64_t ticket) { in_flight_.push_back({taken_.first, taken_.second, ticket}); }
  // Every queued copy has finished (the device was waited for): the tickets are released.
  void all_done() {
    while (!in_flight_.empty()) retire_oldest();
  }
  size_t in_flight() const { return in_flight_.size(); }

 private:
  struct Range {
    size_t begin, end;
    uint64_t ticket;
  };
  bool overlaps_in_flight(size_t begin, size_t end) const {
    for (const Range& r : in_flight_)
      if (r.begin < end && begin < r.end) return true;
    return false;
  }
  void retire_oldest() {
    const uint64_t ticket = in_flight_.front().ticket;
    in_flight_.pop_front();
    wait_(ticket);
  }

  size_t capacity_, head_ = 0;
  std::pair<size_t, size_t> taken_{0, 0};
  std::deque<Range> in_flight_;  // oldest first
  std::function<void(uint64_t)> wait_;
};

}  // namespace meshmoe
