// tensor/cuda_profile.hpp: CUDA events around each launch, read after the host's waits.
#include <cuda_runtime_api.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/timers.hpp"
#include "tensor/cuda_check.hpp"
#include "tensor/cuda_profile.hpp"

namespace meshmoe {

namespace {
struct Launch {
  std::string what;
  double flops;
  cudaEvent_t begin, end;
};
struct Total {
  int64_t count = 0;
  double ms = 0, flops = 0;
};
std::vector<cudaEvent_t> g_free_events;
std::vector<Launch> g_launches;
cudaEvent_t g_open = nullptr;
std::map<std::string, Total> g_totals;
double g_first_launch = 0, g_last_collect = 0;

cudaEvent_t take_event() {
  if (g_free_events.empty()) {
    cudaEvent_t e;
    cuda_check(cudaEventCreate(&e), "profile: cudaEventCreate");
    return e;
  }
  cudaEvent_t e = g_free_events.back();
  g_free_events.pop_back();
  return e;
}

// Kernel bodies are named by their type: "meshmoe::LayerNormForwardRow<float>".
std::string readable(const std::string& what) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(what.c_str(), nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && d ? d.get() : what;
  for (size_t p; (p = s.find("meshmoe::")) != std::string::npos;) s.erase(p, 9);
  return s;
}

void report() {
  if (g_totals.empty()) return;
  std::vector<std::pair<std::string, Total>> rows(g_totals.begin(), g_totals.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double busy = 0;
  int64_t launches = 0;
  for (const auto& [_, t] : rows) busy += t.ms, launches += t.count;
  const double wall_ms = (g_last_collect - g_first_launch) * 1e3;
  std::fprintf(stderr, "meshmoe device profile (after the first step): %lld launches, device busy %.1f ms of %.1f ms wall (%.0f%%)\n",
               (long long)launches, busy, wall_ms, wall_ms > 0 ? 100 * busy / wall_ms : 0.0);
  std::fprintf(stderr, "%10s %8s %10s %6s %8s  %s\n", "ms", "count", "us/launch", "%busy", "TFLOP/s", "what");
  for (const auto& [what, t] : rows) {
    char rate[16] = "";
    if (t.flops > 0) std::snprintf(rate, sizeof rate, "%.1f", t.flops / (t.ms * 1e-3) / 1e12);
    std::fprintf(stderr, "%10.2f %8lld %10.1f %6.2f %8s  %s\n", t.ms, (long long)t.count, 1e3 * t.ms / double(t.count),
                 100 * t.ms / busy, rate, readable(what).c_str());
  }
}
}  // namespace

bool cuda_profiling() {
  static const bool on = [] {
    const char* v = std::getenv("MESHMOE_DEVICE_PROFILE");
    const bool set = v && *v && std::string(v) != "0";
    if (set) std::atexit(report);
    return set;
  }();
  return on;
}

void cuda_profile_begin() {
  if (g_first_launch == 0) g_first_launch = wall_seconds();
  g_open = take_event();
  cuda_check(cudaEventRecord(g_open, cuda_stream()), "profile: cudaEventRecord");
}

void cuda_profile_end(std::string what, double flops) {
  cudaEvent_t end = take_event();
  cuda_check(cudaEventRecord(end, cuda_stream()), "profile: cudaEventRecord");
  g_launches.push_back({std::move(what), flops, g_open, end});
  g_open = nullptr;
  if (g_launches.size() >= 8192) {  // bound the events held: wait for these and add them up
    cuda_check(cudaEventSynchronize(end), "profile: cudaEventSynchronize");
    cuda_profile_collect();
  }
}

void cuda_profile_collect() {
  for (Launch& l : g_launches) {
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, l.begin, l.end), "profile: cudaEventElapsedTime");
    Total& t = g_totals[l.what];
    ++t.count, t.ms += ms, t.flops += l.flops;
    g_free_events.push_back(l.begin);
    g_free_events.push_back(l.end);
  }
  g_launches.clear();
  g_last_collect = wall_seconds();
}

void cuda_profile_restart() {
  if (!cuda_profiling()) return;
  cuda_check(cudaDeviceSynchronize(), "profile: wait before the restart");
  cuda_profile_collect();
  g_totals.clear();
  g_first_launch = wall_seconds();
}

std::string gemm_profile_name(const char* kind, bool trans_a, bool trans_b, int M, int N, int K, int count) {
  std::string s = std::string(kind) + " " + (trans_a ? "T" : "N") + (trans_b ? "T" : "N") + " " + std::to_string(M) +
                  "x" + std::to_string(N) + "x" + std::to_string(K);
  if (count > 1) s += " (x" + std::to_string(count) + ")";
  return s;
}

}  // namespace meshmoe
