// The per-step scalars read in one copy (docs/ARCHITECTURE.md "Device work and transfer points").
// A training step's host figures that come from device values (the cross-entropy's per-token
// losses, the MoE routers' totals, the finite scans' flags, the gradient norm's chunk sums) are
// not read where they are made: while the trainer collects (StepScalars::Collect), defer() queues a
// copy of each into one device buffer, in order with the device's work, and keeps what the host
// does with it (a callback); read() takes the buffer to the host in one copy and runs the callbacks
// in the order they were deferred, so the host does the same arithmetic on the same values in the
// same order as when each was read at once (the same bits), only later. A callback that reads host
// state another deferred callback sets is registered with then(), after it. Outside a collection
// (evaluation, decoding, tests) and on the host path every defer() reads (or, on the host, passes
// its memory) at once and every then() runs at once.
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

#include "tensor/device.hpp"

namespace meshmoe {

class StepScalars {
 public:
  using Read = std::function<void(const void* host)>;

  // `bytes` of the Buffer memory at p: done(host copy) at the read, or at once outside a collection.
  void defer(const void* p, size_t bytes, Read done);
  // fn() after the callbacks deferred so far, or at once outside a collection.
  void then(std::function<void()> fn);
  // One copy of everything deferred to the host (a transfer point: the step's one wait for its
  // scalars), then the callbacks in order; ends the collection.
  void read();
  // Whether defer() and then() wait for the read: in a collection, where Buffers live on a device.
  bool collecting() const { return collecting_ && buffers_on_device(); }

  // A training step's collection, from construction to the read (or, when the step ends without
  // one, to the destructor, which drops what was deferred unread).
  class Collect {
   public:
    explicit Collect(StepScalars& s);
    ~Collect();
    Collect(const Collect&) = delete;
    Collect& operator=(const Collect&) = delete;

   private:
    StepScalars& s_;
  };

 private:
  struct Pending {
    size_t offset = 0;  // into staged_; SIZE_MAX for a then()
    Read done;
    std::function<void()> fn;
  };
  void drop();
  bool collecting_ = false;
  Buffer<double> staged_;  // the deferred bytes, each piece from a multiple of 8 bytes
  size_t used_ = 0;        // bytes of staged_ in use
  std::vector<Pending> pending_;
  std::vector<double> host_;
};

// The process's collector (the trainer's step; the layers defer into it).
StepScalars& step_scalars();

}  // namespace meshmoe
