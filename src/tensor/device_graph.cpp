#include "tensor/device_graph.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "tensor/device.hpp"

namespace meshmoe {

namespace {
// The capture in progress: its backend, the ranges its recorded zeroes and copies use, and what
// it refused that could not throw (a free).
struct Capture {
  const DeviceBackend* backend = nullptr;
  GraphUses uses;
  std::string refused;
};
Capture g_capture;
std::vector<GraphUses*> g_live;  // the live graphs' uses, for device_block_freed

const char* begin_of(const void* p) { return static_cast<const char*>(p); }
void add_range(GraphUses& u, const void* p, size_t bytes) {
  if (bytes > 0) u.ranges.emplace_back(begin_of(p), begin_of(p) + bytes);
}
void drop_capture() {
  if (!g_capture.backend) return;
  const DeviceBackend* b = g_capture.backend;
  g_capture = {};
  b->cancel_capture();
}
}  // namespace

bool device_graphs_supported() { return device_backend().begin_capture != nullptr; }
bool capturing() { return g_capture.backend != nullptr; }

void begin_capture() {
  if (!device_graphs_supported())
    throw std::logic_error(std::string("begin_capture: the ") + device_backend().name +
                           " backend runs its work at once: nothing to capture");
  if (capturing()) throw std::logic_error("begin_capture: a capture is already in progress");
  before_device_work();  // Buffers' zeroes still owed go ahead, outside the graph
  device_backend().begin_capture();
  g_capture.backend = &device_backend();
}

DeviceGraph end_capture() {
  if (!capturing()) throw std::logic_error("end_capture without begin_capture");
  if (g_capture.backend != &device_backend()) throw std::logic_error("end_capture under another device backend");
  before_device_work();  // zeroes of Buffers grown in place inside the capture are its work
  if (!g_capture.refused.empty()) {
    const std::string why = g_capture.refused;
    drop_capture();
    throw std::logic_error("device graph capture abandoned: " + why);
  }
  DeviceGraph g;
  g.backend_ = g_capture.backend;
  g.uses_ = std::make_unique<GraphUses>(std::move(g_capture.uses));
  g_capture = {};
  g.handle_ = g.backend_->end_capture();
  g_live.push_back(g.uses_.get());
  return g;
}

void cancel_capture() { drop_capture(); }

void launch(const DeviceGraph& g) {
  if (!g) throw std::logic_error("launch of an empty device graph");
  if (capturing()) throw std::logic_error("launch of a device graph inside a capture");
  if (g.backend_ != &device_backend()) throw std::logic_error("launch of a device graph under another device backend");
  if (!g.uses_->stale.empty()) throw std::logic_error("launch of a stale device graph: " + g.uses_->stale);
  before_device_work();
  g.backend_->launch_graph(g.handle_);
}

DeviceGraph::~DeviceGraph() {
  if (uses_) g_live.erase(std::find(g_live.begin(), g_live.end(), uses_.get()));
  if (handle_) backend_->destroy_graph(handle_);
}
DeviceGraph::DeviceGraph(DeviceGraph&& o) noexcept
    : backend_(std::exchange(o.backend_, nullptr)), handle_(std::exchange(o.handle_, nullptr)), uses_(std::move(o.uses_)) {}
DeviceGraph& DeviceGraph::operator=(DeviceGraph&& o) noexcept {
  if (this != &o) {
    DeviceGraph old(std::move(*this));
    backend_ = std::exchange(o.backend_, nullptr);
    handle_ = std::exchange(o.handle_, nullptr);
    uses_ = std::move(o.uses_);
  }
  return *this;
}

void DeviceGraph::uses(const void* p, size_t bytes) {
  if (!uses_) throw std::logic_error("DeviceGraph::uses on an empty graph");
  add_range(*uses_, p, bytes);
}

void refuse_in_capture(const char* what) {
  if (!capturing()) return;
  drop_capture();
  throw std::logic_error(std::string(what) + " inside a device graph's capture (the capture is abandoned)");
}

void device_block_freed(const void* p) noexcept {
  if (capturing() && g_capture.refused.empty()) g_capture.refused = "a device Buffer was freed inside it";
  const char* c = begin_of(p);
  for (GraphUses* u : g_live)
    if (u->stale.empty())
      for (const auto& [begin, end] : u->ranges)
        if (c >= begin && c < end) {
          u->stale = "a device Buffer it uses was freed or moved to new storage after its capture";
          break;
        }
}

void capture_uses(const void* p, size_t bytes) {
  if (capturing()) add_range(g_capture.uses, p, bytes);
}

}  // namespace meshmoe
