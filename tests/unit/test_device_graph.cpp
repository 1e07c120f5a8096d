// Device graphs (tensor/device_graph.hpp) on the deferred host device, which records the work
// items of a capture and queues copies of them at each launch, as a CUDA graph replays its kernels:
//  - the captured work does not run at the capture; each launch runs it again, reading the
//    Buffers' contents as they are then, with the arguments it had at the capture (a value passed
//    by value stays the captured one);
//  - inside a capture a host wait, a copy to or from the host and a device allocation are refused
//    (the capture abandoned), a free fails end_capture(); a graph whose Buffer was freed or moved
//    refuses its launch; the host's backend has nothing to capture;
//  - AdamW's update as a graph (run.cuda_graphs) gives the same bits as without, over steps whose
//    learning rate, bias corrections and clipping factor all change.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <vector>

#include "../test_util.hpp"
#include "optim/adamw.hpp"
#include "tensor/device.hpp"
#include "tensor/device_graph.hpp"
#include "tensor/elementwise.hpp"
#include "tensor/launch.hpp"

using namespace meshmoe;
using Catch::Matchers::Contains;

namespace {
// dst[i] = dst[i] * k + src[i]: k passed by value, src read when the work runs.
struct ScaleAdd {
  const float* src;
  float* dst;
  float k;
  void operator()(int64_t i) const { dst[i] = dst[i] * k + src[i]; }
};
// ScaleAdd over 3 indices as the deferred host device's launch: queued host work (a body of the
// tests only, so run_host_work rather than for_each_index, which a CUDA build instantiates as a kernel).
void scale_add(const float* src, float* dst, float k) {
  run_host_work([body = ScaleAdd{src, dst, k}] {
    for (int64_t i = 0; i < 3; ++i) body(i);
  });
}
std::vector<float> values(std::initializer_list<float> v) { return std::vector<float>(v); }
}  // namespace

TEST_CASE("device graph: a launch replays the recording, reading the Buffers as they are then", "[device][deferred][graph]") {
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  Buffer<float> src{1, 2, 3}, dst(3), copy(3);
  device_synchronize();
  float k = 2.f;
  begin_capture();
  CHECK(capturing());
  scale_add(src.data(), dst.data(), k);
  copy_buffer_bytes(copy.data(), dst.data(), 3 * sizeof(float));
  const DeviceGraph g = end_capture();
  CHECK(!capturing());
  CHECK(deferred_host_work_queued() == 0);  // recorded, not queued
  CHECK(download(dst) == values({0, 0, 0}));
  k = 10.f;  // after the capture: the graph keeps k = 2
  launch(g);
  CHECK(deferred_host_work_queued() == 2);
  CHECK(download(dst) == values({1, 2, 3}));
  upload(src, values({5, 6, 7}).data(), 3);  // new contents, the same storage
  launch(g);
  launch(g);
  CHECK(download(dst) == values({(1 * 2 + 5) * 2 + 5, (2 * 2 + 6) * 2 + 6, (3 * 2 + 7) * 2 + 7}));
  CHECK(download(copy) == download(dst));
}

TEST_CASE("device graph: host waits, copies, allocations and frees inside a capture are refused", "[device][deferred][graph]") {
  {
    Buffer<float> host(3);  // the host's backend runs its work at once
    CHECK(!device_graphs_supported());
    REQUIRE_THROWS_WITH(begin_capture(), Contains("nothing to capture"));
  }
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  CHECK(device_graphs_supported());
  Buffer<float> a{1, 2, 3}, b(3);
  const std::vector<float> host = values({4, 5, 6});
  device_synchronize();
  const auto refused = [&](auto&& what, const char* named) {
    begin_capture();
    scale_add(a.data(), b.data(), 1.f);
    REQUIRE_THROWS_WITH(what(), Contains(named) && Contains("inside a device graph's capture"));
    CHECK(!capturing());  // abandoned: its work never runs
  };
  refused([&] { return download(b); }, "a copy to the host");
  refused([&] { device_synchronize(); }, "a host wait");
  refused([&] { upload(b, host.data(), 3); }, "a copy from the host");
  refused([&] { b.resize(1000); }, "a device Buffer allocated");
  CHECK(b.size() == 3);
  CHECK(download(b) == values({0, 0, 0}));
  {
    auto doomed = std::make_unique<Buffer<float>>(3);
    device_synchronize();
    begin_capture();
    doomed.reset();
    REQUIRE_THROWS_WITH(end_capture(), Contains("freed inside it"));
    CHECK(!capturing());
  }
  SECTION("a graph whose Buffer moved to new storage refuses its launch") {
    begin_capture();
    scale_add(a.data(), b.data(), 1.f);
    DeviceGraph g = end_capture();
    g.uses(a.data(), 3 * sizeof(float));
    g.uses(b.data(), 3 * sizeof(float));
    launch(g);
    CHECK(download(b) == values({1, 2, 3}));
    a.resize(100000);  // new storage: the graph's pointer is the freed block
    REQUIRE_THROWS_WITH(launch(g), Contains("stale device graph"));
  }
  SECTION("and one whose Buffer was freed") {
    auto c = std::make_unique<Buffer<float>>(3);
    device_synchronize();
    begin_capture();
    fill_with(c->data(), 3, 1.f);
    copy_buffer_bytes(b.data(), c->data(), 3 * sizeof(float));  // a captured copy declares its ranges
    DeviceGraph g = end_capture();
    c.reset();
    REQUIRE_THROWS_WITH(launch(g), Contains("freed or moved"));
  }
}

TEST_CASE("device graph: AdamW's update as a graph gives the bits of the update without one", "[device][deferred][graph][optim]") {
  test::DeferredHostDevice guard(DeviceAccess::Copies);
  const auto store = [] {
    auto s = std::make_unique<ParamStore<float>>();
    s->add("w", {300, 5000}, InitKind::TruncNormal, 300, nullptr);  // 1.5M elements: many pieces, host threads
    s->add("b", {7}, InitKind::Zeros, 1, nullptr).no_weight_decay = true;
    s->allocate();
    s->init(3, 1.0);
    return s;
  };
  auto plain = store(), graphed = store();
  const AdamWOptions opt{0.9, 0.95, 1e-8, 0.1};
  AdamW a(*plain, all_entries(*plain), opt), b(*graphed, all_entries(*graphed), opt);
  REQUIRE(b.set_update_graph(true));
  for (int64_t t = 1; t <= 4; ++t) {  // lr, bias corrections and clipping factor new at each step
    for (ParamStore<float>* s : {plain.get(), graphed.get()}) fill_with(s->grads(), s->size(), float(t) - 2.5f);
    const double lr = 1e-2 / double(t), scale = 1.0 / double(t + 1);
    a.step(*plain, lr, t, scale);
    b.step(*graphed, lr, t, scale);
  }
  const auto weights = [](ParamStore<float>& s) {
    std::vector<float> w(s.size());
    copy_to_host(w.data(), s.weights(), w.size() * sizeof(float));
    return w;
  };
  const auto differ = [](const std::vector<float>& x, const std::vector<float>& y) {  // elements, not printed
    size_t n = 0;
    for (size_t i = 0; i < x.size(); ++i) n += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
    return n;
  };
  const std::vector<float> wa = weights(*plain);
  CHECK(differ(wa, weights(*graphed)) == 0);
  CHECK(differ(wa, weights(*store())) == wa.size());  // the updates moved every weight
  REQUIRE(a.state().size() == b.state().size());
  for (size_t i = 0; i < a.state().size(); ++i) CHECK(differ(download(*a.state()[i].data), download(*b.state()[i].data)) == 0);
}
