// Device graphs (docs/ARCHITECTURE.md "Device graphs"): device work recorded once and launched
// again as one piece, CUDA graphs' model. begin_capture() starts recording the work queued on the
// device (launches, GEMMs, Buffer zeroing and copies); end_capture() returns it as a DeviceGraph
// instead of having run it; launch(graph) queues the recorded work again, in order with the rest.
// A launch repeats the recorded work with the arguments it had at the capture (kernel arguments,
// pointers, sizes, values read on the host): whatever changes from one launch to the next must be
// read by the work from a Buffer written before the launch.
//  - on the GPU (tensor/cuda_device.cu): stream capture of the rank's stream in thread-local mode,
//    instantiated once, cudaGraphLaunch on the stream;
//  - on the deferred host device (tensor/deferred_device.hpp): the queued work items are recorded
//    instead of queued, and a launch queues copies of them (their arguments baked, as a GPU
//    graph's are);
//  - on the host nothing is queued, so nothing can be captured (device_graphs_supported()).
// Inside a capture the host may not wait for the device or copy to or from it (a copy from the host
// goes through pinned staging on the GPU, whose room the capture would not own), nor allocate or
// free device memory: each is a std::logic_error that abandons the capture (a free, which cannot
// throw, is reported by end_capture()). A graph refuses a launch once a Buffer it was told it uses
// (uses()) has been freed or moved to new storage since the capture.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/device_backend.hpp"

namespace meshmoe {

// The ranges a graph uses, and why it is stale (refuses its launch; empty: it is not).
struct GraphUses {
  std::vector<std::pair<const char*, const char*>> ranges;  // [begin, end)
  std::string stale;
};

class DeviceGraph {
 public:
  DeviceGraph() = default;
  ~DeviceGraph();
  DeviceGraph(DeviceGraph&& o) noexcept;
  DeviceGraph& operator=(DeviceGraph&& o) noexcept;
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;

  explicit operator bool() const { return handle_ != nullptr; }
  // The recorded work reads or writes [p, p + bytes), p a Buffer's first element: freeing the block
  // at p (or one starting inside the range) makes every later launch an error. The captured zeroes
  // and copies of Buffers are declared by the capture itself.
  void uses(const void* p, size_t bytes);

 private:
  friend DeviceGraph end_capture();
  friend void launch(const DeviceGraph& g);
  const DeviceBackend* backend_ = nullptr;
  void* handle_ = nullptr;  // the backend's graph
  std::unique_ptr<GraphUses> uses_;
};

bool device_graphs_supported();  // the backend queues its work, so it can record it
bool capturing();                // between begin_capture() and end_capture()

// Not nested. std::logic_error where the backend runs its work at once (the host's).
void begin_capture();
// The recorded work (not run); std::logic_error, the capture abandoned, where something was refused
// inside it (a Buffer freed).
DeviceGraph end_capture();
// Drops a capture in progress (after an exception inside it); nothing where none is.
void cancel_capture();
// Queues the graph's work on the device (it runs at the next wait, as any queued work).
void launch(const DeviceGraph& g);

// For device.cpp: inside a capture, `what` is abandoned with the capture and std::logic_error
// names it; a device block freed at p (the capture's refusal, and the graphs that used it stale);
// a Buffer's zeroing or copy recorded in the capture uses its range.
void refuse_in_capture(const char* what);
void device_block_freed(const void* p) noexcept;
void capture_uses(const void* p, size_t bytes);

}  // namespace meshmoe
