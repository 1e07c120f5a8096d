#include "tensor/step_scalars.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>

namespace meshmoe {

void StepScalars::defer(const void* p, size_t bytes, Read done) {
  if (!buffers_on_device()) return done(p);
  if (!collecting_) {
    std::vector<double> host((bytes + sizeof(double) - 1) / sizeof(double));
    if (bytes > 0) copy_to_host(host.data(), p, bytes);
    return done(host.data());
  }
  const size_t words = (bytes + sizeof(double) - 1) / sizeof(double);
  const size_t need = used_ / sizeof(double) + words;
  if (staged_.size() < need) {  // kept from step to step: after the first, no new storage
    if (need > staged_.capacity()) staged_.reserve(std::max(need, 2 * staged_.capacity()));
    staged_.resize(need);
  }
  if (bytes > 0) copy_buffer_bytes(reinterpret_cast<char*>(staged_.data()) + used_, p, bytes);  // queued on the device
  pending_.push_back({used_, std::move(done), {}});
  used_ += words * sizeof(double);
}

void StepScalars::then(std::function<void()> fn) {
  if (!collecting()) return fn();
  pending_.push_back({SIZE_MAX, {}, std::move(fn)});
}

void StepScalars::read() {
  if (!collecting_) return;
  collecting_ = false;
  host_.resize(used_ / sizeof(double));
  if (used_ > 0) copy_to_host(host_.data(), staged_.data(), used_);
  std::vector<Pending> pending = std::move(pending_);
  drop();
  for (const Pending& p : pending) {
    if (p.offset == SIZE_MAX) p.fn();
    else p.done(reinterpret_cast<const char*>(host_.data()) + p.offset);
  }
}

void StepScalars::drop() {
  pending_.clear();
  used_ = 0;
}

StepScalars::Collect::Collect(StepScalars& s) : s_(s) {
  if (s.collecting_) throw std::logic_error("StepScalars: a collection is already open");
  s.drop();
  s.collecting_ = true;
}

StepScalars::Collect::~Collect() {
  s_.collecting_ = false;
  s_.drop();
}

StepScalars& step_scalars() {
  static StepScalars* s = new StepScalars;  // never destroyed: its Buffer outlives no arena
  return *s;
}

}  // namespace meshmoe
