// The step's scalars read in one copy (tensor/step_scalars.hpp), on the deferred host device.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "../test_util.hpp"
#include "tensor/device.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/step_scalars.hpp"

using namespace meshmoe;

namespace {
std::string values(const void* host, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += " " + std::to_string(static_cast<const double*>(host)[i]);
  return s;
}
}  // namespace

TEST_CASE("step scalars: a collection reads every deferred value in one copy, the callbacks in order",
          "[device][deferred]") {
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  Buffer<double> a(3), b(2);
  fill_with(a.data(), 3, 1.5);
  fill_with(b.data(), 2, 2.0);
  std::vector<std::string> seen;
  StepScalars& scalars = step_scalars();
  HostWaits w0 = host_waits();
  {
    StepScalars::Collect collect(scalars);
    scalars.defer(a.data(), 3 * sizeof(double), [&](const void* h) { seen.push_back("a" + values(h, 3)); });
    fill_with(a.data(), 3, 9.0);  // after the defer: its copy holds the values queued before
    scalars.then([&] { seen.push_back("then"); });
    scalars.defer(b.data(), 2 * sizeof(double), [&](const void* h) { seen.push_back("b" + values(h, 2)); });
    scalars.defer(b.data(), sizeof(double), [&](const void* h) { seen.push_back("b0" + values(h, 1)); });
    CHECK(seen.empty());
    CHECK((host_waits() - w0).total() == 0);
    scalars.read();
    CHECK((host_waits() - w0).copies == 1);
    CHECK((host_waits() - w0).synchronize == 0);
    CHECK(seen == std::vector<std::string>{"a 1.500000 1.500000 1.500000", "then", "b 2.000000 2.000000", "b0 2.000000"});
    CHECK_FALSE(scalars.collecting());
  }
  // Outside a collection each reads at once: a copy each.
  seen.clear();
  w0 = host_waits();
  scalars.defer(a.data(), 3 * sizeof(double), [&](const void* h) { seen.push_back("a" + values(h, 3)); });
  scalars.then([&] { seen.push_back("then"); });
  CHECK(seen == std::vector<std::string>{"a 9.000000 9.000000 9.000000", "then"});
  CHECK((host_waits() - w0).copies == 1);
  // A collection that ends unread (a step that throws) drops what it deferred.
  seen.clear();
  {
    StepScalars::Collect collect(scalars);
    scalars.defer(a.data(), 3 * sizeof(double), [&](const void*) { seen.push_back("dropped"); });
  }
  CHECK_FALSE(scalars.collecting());
  scalars.read();
  CHECK(seen.empty());
}

TEST_CASE("step scalars: on the host path a collection waits for nothing, every callback at once", "[device]") {
  Buffer<double> a(2, 3.0);
  std::vector<std::string> seen;
  StepScalars::Collect collect(step_scalars());
  CHECK_FALSE(step_scalars().collecting());
  step_scalars().defer(a.data(), 2 * sizeof(double), [&](const void* h) { seen.push_back("a" + values(h, 2)); });
  step_scalars().then([&] { seen.push_back("then"); });
  CHECK(seen == std::vector<std::string>{"a 3.000000 3.000000", "then"});
}
