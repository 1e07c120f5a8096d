// Tests of the metrics file (src/io/metrics.hpp): rows, NaN gaps, 2-D series, units attributes,
// resume truncation, errors, and h5py reading the file while it is open for writing.
// Values are compared exactly: the file must hold the bits the trainer passed.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "../test_util.hpp"
#include "../support/h5_support.hpp"
#include "io/h5.hpp"
#include "io/metrics.hpp"

using namespace meshmoe;

namespace {
std::string metrics_path(const std::string& stem) {
  return test::scratch_dir() + "/metrics_" + stem + "_" + std::to_string(static_cast<long>(getpid())) + ".h5";
}
double loss_at(int64_t step) { return 10.0 / static_cast<double>(step + 1) + 1e-17 * static_cast<double>(step); }
std::vector<double> load_at(int64_t step) {
  return {0.25 + 0.01 * static_cast<double>(step), 0.25, 0.5 - 0.01 * static_cast<double>(step), 0.0};
}
// Logs steps [from, to]: loss/lr/time every step, eval/loss every 3rd, expert_load per step.
void log_steps(MetricsFile& m, int64_t from, int64_t to) {
  for (int64_t s = from; s <= to; ++s) {
    m.append(s, {{"loss", loss_at(s)}, {"lr", 1e-3 * static_cast<double>(s)}, {"time/forward", 0.5}});
    m.append_row("moe/1/expert_load", load_at(s));
    if (s % 3 == 0) m.append(s, {{"eval/loss", -loss_at(s)}});  // same step: same row
  }
}
}  // namespace

TEST_CASE("metrics: rows, gaps, 2-D series and units", "[metrics]") {
  if (test::world_rank() != 0) return;  // rank 0 writes metrics
  std::string path = metrics_path("basic");
  const std::string deck = "[model]\nd_model = 8\n# comment \"quoted\"\n";
  {
    MetricsFile m(path, deck, {{"run_name", "unit"}, {"mesh", "1x1x1"}});
    m.describe("my/custom", "widgets", "a caller-described metric");
    log_steps(m, 1, 7);
    m.append(7, {{"my/custom", 3.0}});
    CHECK(m.rows() == 7);
    CHECK(m.last_step() == 7);
  }
  h5::File f = h5::File::open(path);
  CHECK(f.read<int64_t>("step") == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7});
  auto loss = f.read<double>("loss");
  REQUIRE(loss.size() == 7);
  for (int s = 1; s <= 7; ++s) CHECK(loss[s - 1] == loss_at(s));
  CHECK(f.read<double>("time/forward") == std::vector<double>(7, 0.5));
  // eval/loss: NaN where not logged, padded to the length of /step on close.
  auto ev = f.read<double>("eval/loss");
  REQUIRE(ev.size() == 7);
  for (int s = 1; s <= 7; ++s) {
    if (s % 3 == 0)
      CHECK(ev[s - 1] == -loss_at(s));
    else
      CHECK(std::isnan(ev[s - 1]));
  }
  auto custom = f.read<double>("my/custom");
  REQUIRE(custom.size() == 7);
  CHECK(std::isnan(custom[0]));
  CHECK(custom[6] == 3.0);
  h5::Dataset load = f.dataset("moe/1/expert_load");
  CHECK(load.shape() == h5::Dims{7, 4});
  auto lv = load.read<double>();
  for (int s = 1; s <= 7; ++s)
    for (int e = 0; e < 4; ++e) CHECK(lv[(s - 1) * 4 + e] == load_at(s)[e]);
  // Units and descriptions on every dataset.
  CHECK(f.dataset("step").attr<std::string>("units") == "1");
  CHECK(f.dataset("loss").attr<std::string>("units") == "nats/token");
  CHECK(f.dataset("lr").attr<std::string>("units") == "1");
  CHECK(f.dataset("time/forward").attr<std::string>("units") == "s");
  CHECK(f.dataset("eval/loss").attr<std::string>("units") == "nats/token");
  CHECK(load.attr<std::string>("units") == "1");
  CHECK_FALSE(load.attr<std::string>("description").empty());
  CHECK(f.dataset("my/custom").attr<std::string>("units") == "widgets");
  CHECK(f.dataset("my/custom").attr<std::string>("description") == "a caller-described metric");
  CHECK(test::read_string(f, "deck") == deck);
  CHECK(f.attr<std::string>("run_name") == "unit");
  CHECK(f.attr<std::string>("mesh") == "1x1x1");
  f.close();
  std::remove(path.c_str());
}

TEST_CASE("metrics: resume truncates the rows after the checkpoint step", "[metrics]") {
  if (test::world_rank() != 0) return;
  std::string path = metrics_path("resume");
  {
    MetricsFile m(path, "deck 1");
    log_steps(m, 1, 8);
  }
  {
    MetricsFile m(path, "deck 2, longer than the first", {{"resumed", "yes"}}, int64_t{6});
    CHECK(m.rows() == 6);
    CHECK(m.last_step() == 6);
    CHECK_THROWS_WITH(m.append(5, {{"loss", 1.0}}), Catch::Contains("step 5 logged after step 6"));
    m.append(7, {{"loss", 700.0}});
    m.append_row("moe/1/expert_load", {7, 7, 7, 7});
  }
  h5::File f = h5::File::open(path);
  CHECK(f.read<int64_t>("step") == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7});
  auto loss = f.read<double>("loss");
  REQUIRE(loss.size() == 7);
  CHECK(loss[5] == loss_at(6));
  CHECK(loss[6] == 700.0);
  auto lr = f.read<double>("lr");  // not logged after the resume: NaN at step 7
  REQUIRE(lr.size() == 7);
  CHECK(lr[5] == 6e-3);
  CHECK(std::isnan(lr[6]));
  auto ev = f.read<double>("eval/loss");
  REQUIRE(ev.size() == 7);
  CHECK(ev[5] == -loss_at(6));
  CHECK(std::isnan(ev[6]));  // old step 8's row is gone, step 7 had none
  auto lv = f.read<double>("moe/1/expert_load");
  REQUIRE(lv.size() == 28);
  CHECK(lv[20] == load_at(6)[0]);
  CHECK(lv[24] == 7.0);
  CHECK(test::read_string(f, "deck") == "deck 2, longer than the first");
  CHECK(f.attr<std::vector<int64_t>>("resumed_after_steps") == std::vector<int64_t>{6});
  CHECK(f.attr<std::string>("resumed") == "yes");
  CHECK(f.dataset("loss").attr<std::string>("units") == "nats/token");
  f.close();
  // Resume before the first step: empty series; resume of a missing file: a new file.
  {
    MetricsFile m(path, "deck 3", {}, int64_t{0});
    CHECK(m.rows() == 0);
    CHECK_FALSE(m.last_step().has_value());
  }
  CHECK(h5::File::open(path).dataset("moe/1/expert_load").shape() == h5::Dims{0, 4});
  std::remove(path.c_str());
  {
    MetricsFile m(path, "deck 4", {}, int64_t{100});
    CHECK(m.rows() == 0);
    m.append(101, {{"loss", 1.0}});
  }
  CHECK(h5::File::open(path).read<int64_t>("step") == std::vector<int64_t>{101});
  std::remove(path.c_str());
}

TEST_CASE("metrics: the root attribute rows counts the rows whose datasets are all written", "[metrics]") {
  if (test::world_rank() != 0) return;
  std::string path = metrics_path("rows");
  {
    MetricsFile m(path, "deck");
    CHECK(h5::File::open(path).attr<int64_t>("rows") == 0);
    m.append(1, {{"loss", 1.0}});
    m.append_row("moe/1/expert_load", {1, 1});
    CHECK(h5::File::open(path).attr<int64_t>("rows") == 0);  // step 1 is not published yet
    m.publish_rows();
    CHECK(h5::File::open(path).attr<int64_t>("rows") == 1);
    m.append(2, {{"loss", 2.0}});
    m.publish_rows();
  }
  {
    // A resume (in place, after a copy that it removes): the kept steps, `rows` of them.
    MetricsFile m(path, "deck", {}, int64_t{1});
    CHECK(h5::File::open(path).attr<int64_t>("rows") == 1);
    CHECK(h5::File::open(path).read<int64_t>("step") == std::vector<int64_t>{1});
  }
  namespace fs = std::filesystem;
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    CHECK(e.path().string().rfind(path + ".tmp", 0) != 0);  // no temporary left
  std::remove(path.c_str());
}

TEST_CASE("metrics: user mistakes give clear errors", "[metrics]") {
  if (test::world_rank() != 0) return;
  std::string path = metrics_path("errors");
  {
    MetricsFile m(path, "");
    CHECK_THROWS_WITH(m.append_row("moe/0/expert_load", {1, 2}), Catch::Contains("before any append"));
    m.append(1, {{"loss", 1.0}});
    m.append_row("moe/0/expert_load", {1, 2});
    CHECK_THROWS_WITH(m.append_row("moe/0/expert_load", {1, 2, 3}), Catch::Contains("a row of 2, now as a row of 3"));
    CHECK_THROWS_WITH(m.append(1, {{"moe/0/expert_load", 1.0}}), Catch::Contains("now as a scalar"));
    CHECK_THROWS_WITH(m.append(2, {{"step", 1.0}}), Catch::Contains("cannot be used as a metric name"));
    CHECK_THROWS_WITH(m.append_row("x", {}), Catch::Contains("empty row"));
  }
  {  // not a metrics file
    h5::File f = h5::File::create(path);
    f.write<double>("loss", {1.0});
  }
  CHECK_THROWS_WITH(MetricsFile(path, "", {}, int64_t{3}), Catch::Contains("not a meshmoe metrics file"));
  std::remove(path.c_str());
}

TEST_CASE("metrics: built-in units table", "[metrics]") {
  CHECK(MetricsFile::default_info("/loss").units == "nats/token");
  CHECK(MetricsFile::default_info("tokens_per_s").units == "tokens/s");
  CHECK(MetricsFile::default_info("time/all_to_all").units == "s");
  CHECK(MetricsFile::default_info("moe/11/dropped_fraction").units == "1");
  CHECK(MetricsFile::default_info("eval/loss").units == "nats/token");
  CHECK(MetricsFile::default_info("moe/layer1/router_entropy").units == "nats");
  CHECK(MetricsFile::default_info("moe/layer1/capacity").units == "slots");
  CHECK(MetricsFile::default_info("moe/1/2/dropped_fraction").units.empty());  // '*' is one component
  CHECK(MetricsFile::default_info("unknown").units.empty());
}

// The run keeps the file open while a post-processing script reads it: no lock, rows flushed.
TEST_CASE("metrics: h5py reads the file while it is open for writing", "[metrics]") {
  if (test::world_rank() != 0) return;
  if (std::system("/usr/bin/python3 -c 'import h5py' >/dev/null 2>&1") != 0) {
    WARN("/usr/bin/python3 with h5py not available: h5py live read not tested");
    return;
  }
  std::string path = metrics_path("live");
  std::string script = path + ".py";
  {
    std::ofstream py(script);
    py << "import sys, h5py, numpy as np\n"
          "with h5py.File(sys.argv[1], 'r') as f:\n"
          "    n = int(sys.argv[2])\n"
          "    ok = f['step'].shape == (n,) and list(f['step'][()]) == list(range(1, n + 1))\n"
          "    ok = ok and f['loss'][n - 1] == 10.0 / (n + 1) + 1e-17 * n\n"
          "    ok = ok and f['moe/1/expert_load'].shape == (n, 4)\n"
          "    ok = ok and f['loss'].attrs['units'] == 'nats/token'\n"
          "    ok = ok and f['deck'][()] == b'live deck'\n"
          "sys.exit(0 if ok else 1)\n";
  }
  MetricsFile m(path, "live deck");
  log_steps(m, 1, 4);
  CHECK(std::system(("/usr/bin/python3 " + script + " " + path + " 4").c_str()) == 0);
  log_steps(m, 5, 6);
  CHECK(std::system(("/usr/bin/python3 " + script + " " + path + " 6").c_str()) == 0);
  CHECK(std::system(("/usr/bin/python3 " + script + " " + path + " 5 2>/dev/null").c_str()) != 0);  // can fail
  std::remove(script.c_str());
  std::remove(path.c_str());
}

TEST_CASE("metrics: root attributes that are arrays of strings and of floats, also over an older text one", "[metrics]") {
  if (test::world_rank() != 0) return;
  std::string path = metrics_path("arrays");
  const std::vector<std::string> langs{"de", "pt_BR", "sr@latin", "\xc3\xa9t\xc3\xa9"};  // UTF-8 kept as is
  const std::vector<double> p{0.5, 0.25, 0.125 + 1e-17, 0.125};
  {
    // An older file: the languages as comma-joined text.
    MetricsFile m(path, "deck", {{"languages", "de,pt_BR"}});
    log_steps(m, 1, 2);
  }
  {
    MetricsFile m(path, "deck", {}, int64_t{2}, MetricsArrayAttrs{.strings = {{"languages", langs}}, .numbers = {{"p", p}}});
    log_steps(m, 3, 3);
  }
  h5::File f = h5::File::open(path);
  CHECK(f.attr<std::vector<std::string>>("languages") == langs);
  CHECK(f.attr<std::vector<double>>("p") == p);
  CHECK_THROWS(f.attr<std::string>("languages"));  // an array, no longer a scalar string
  h5::File g = h5::File::create(metrics_path("empty_list"));
  g.set_attr("none", std::vector<std::string>{});
  CHECK(g.attr<std::vector<std::string>>("none").empty());
  std::remove(path.c_str());
  std::remove(metrics_path("empty_list").c_str());
}
