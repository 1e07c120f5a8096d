#include "run/memory_limit.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.hpp"
#include "core/sizes.hpp"
#include "mesh/agree.hpp"
#include "run/memory.hpp"

namespace meshmoe {

namespace {

// Limits at or above this are the kernel's spelling of "no limit" (v1: PAGE_COUNTER_MAX pages,
// 9223372036854771712 on x86-64).
constexpr double kUnlimited = double(int64_t(1) << 60);

std::optional<double> read_limit_file(const std::string& path) {
  std::ifstream f(path);
  std::string text;
  if (!(f >> text)) return std::nullopt;
  if (text == "max") return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || v <= 0 || v >= kUnlimited) return std::nullopt;
  return v;
}

// The smallest limit of `file_name` in dir and its ancestors down to `root` (inclusive).
std::optional<double> walk_up(const std::string& root, std::string rel, const std::string& file_name,
                              std::string* file) {
  std::optional<double> best;
  while (true) {
    while (!rel.empty() && rel.back() == '/') rel.pop_back();
    const std::string path = root + rel + "/" + file_name;
    if (const auto v = read_limit_file(path); v && (!best || *v < *best)) {
      best = v;
      if (file) *file = path;
    }
    if (rel.empty()) break;
    const size_t slash = rel.rfind('/');
    rel = slash == std::string::npos ? "" : rel.substr(0, slash);
  }
  return best;
}

std::optional<double> meminfo(const std::string& key) {
  std::ifstream f("/proc/meminfo");
  std::string k, unit;
  double kib = 0;
  while (f >> k >> kib >> unit)
    if (k == key + ":") return kib * 1024.0;
  return std::nullopt;
}

// Tests only (tests/scripts/memory_limits.sh): MESHMOE_TEST_MEMAVAILABLE="a,b,..." stands in for
// MemAvailable, in bytes, the n-th read of this process taking the n-th figure (the last repeats),
// as a node whose free memory changes between two reads.
std::optional<double> memavailable_read() {
  const char* env = std::getenv("MESHMOE_TEST_MEMAVAILABLE");
  if (!env || !*env) return meminfo("MemAvailable");
  static int reads = 0;
  std::stringstream list(env);
  std::string item, last;
  for (int i = 0; i <= reads && std::getline(list, item, ','); ++i) last = item;
  ++reads;
  return std::strtod(last.c_str(), nullptr);
}

// MemAvailable falls as this process and its neighbours allocate: it is read once per process, so
// that the memory check (before the model is built) and the report (after) judge the same figure.
std::optional<double> memavailable_once() {
  static const std::optional<double> v = memavailable_read();
  return v;
}

}  // namespace

std::optional<double> cgroup_memory_limit(const std::string& proc_cgroup, const std::string& cgroup_root,
                                          std::string* file) {
  std::istringstream in(proc_cgroup);
  std::string line;
  std::optional<double> best;
  std::string best_file;
  // Lines "hierarchy-id:controllers:path"; v2 is "0::path", v1 names the memory controller.
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::optional<double> v;
    std::string f;
    if (controllers.empty() && line.substr(0, a) == "0") {
      v = walk_up(cgroup_root, path, "memory.max", &f);
    } else {
      std::istringstream cs(controllers);
      std::string c;
      bool memory = false;
      while (std::getline(cs, c, ',')) memory = memory || c == "memory";
      if (!memory) continue;
      v = walk_up(cgroup_root + "/memory", path, "memory.limit_in_bytes", &f);
    }
    if (v && (!best || *v < *best)) best = v, best_file = f;
  }
  if (best && file) *file = best_file;
  return best;
}

MemoryLimit available_memory(const std::string& max_memory, const std::string& key) {
  MemoryLimit m;
  if (!max_memory.empty()) {
    std::string why;
    const auto v = parse_byte_size(max_memory, &why);
    if (!v) throw InputError(key + " = \"" + max_memory + "\": " + why);
    m.bytes = double(*v);
    m.source = key + " = \"" + max_memory + "\"";
    return m;
  }
  if (auto v = memavailable_once()) m.bytes = *v, m.source = "MemAvailable of /proc/meminfo";
  else if (auto t = meminfo("MemTotal")) m.bytes = *t, m.source = "MemTotal of /proc/meminfo";
  std::ifstream f("/proc/self/cgroup");
  std::stringstream text;
  text << f.rdbuf();
  std::string file;
  if (const auto c = cgroup_memory_limit(text.str(), "/sys/fs/cgroup", &file); c && (m.bytes == 0 || *c < m.bytes))
    m.bytes = *c, m.source = "cgroup limit " + file;
  return m;
}

void check_node_memory(double bytes_here, const std::string& what, const std::string& max_memory,
                       const std::string& hint, MPI_Comm world, const std::string& key) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  // Every rank parses the same text: an InputError here is raised by all of them alike.
  const MemoryLimit here = available_memory(max_memory, key);
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int node_size = 1, node_rank = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_rank(node, &node_rank);
  double need = bytes_here, have = here.bytes > 0 ? here.bytes : 1e300;
  MPI_Allreduce(MPI_IN_PLACE, &need, 1, MPI_DOUBLE, MPI_SUM, node);
  MPI_Allreduce(MPI_IN_PLACE, &have, 1, MPI_DOUBLE, MPI_MIN, node);
  // The per-rank amounts of this node, for the message ("2 ranks: 2.65 GiB each" or a list).
  std::vector<double> each(static_cast<size_t>(node_size));
  MPI_Allgather(&bytes_here, 1, MPI_DOUBLE, each.data(), 1, MPI_DOUBLE, node);
  // The node's source: that of its lowest rank with the smallest figure.
  struct {
    double v;
    int r;
  } mine{here.bytes > 0 ? here.bytes : 1e300, node_rank}, least{};
  MPI_Allreduce(&mine, &least, 1, MPI_DOUBLE_INT, MPI_MINLOC, node);
  const std::string source = broadcast_string(here.source, least.r, node);
  MPI_Comm_free(&node);

  // The worst node over the world: the largest need / have; its lowest rank tells the story.
  struct {
    double v;
    int r;
  } ratio{need / have, rank}, worst{};
  MPI_Allreduce(&ratio, &worst, 1, MPI_DOUBLE_INT, MPI_MAXLOC, world);
  if (worst.v <= 1.0) return;
  std::string msg;
  if (rank == worst.r) {
    std::string per;
    if (std::all_of(each.begin(), each.end(), [&](double b) { return b == each[0]; }))
      per = format_bytes(each[0]) + " each";
    else
      for (size_t i = 0; i < each.size(); ++i) per += (i ? ", " : "") + format_bytes(each[i]);
    msg = what + " needs " + format_bytes(need) + " per node (" + std::to_string(node_size) +
          (node_size == 1 ? " rank: " : " ranks: ") + per + "), more than the " + format_bytes(have) +
          " available (" + source + "); " + hint;
  }
  throw InputError(broadcast_string(msg, worst.r, world));
}

void check_memory_plan(const Config& cfg, const MemoryPlan& stage_plan, MPI_Comm world) {
  if (cfg.run.device != Device::Cpu) return;
  check_node_memory(double(stage_plan.total_bytes()), "the plan", cfg.run.max_memory,
                    cfg.run.max_memory.empty()
                        ? "see `meshmoe plan`; use more nodes, smaller micro-batches or a smaller model, or set "
                          "run.max_memory to override"
                        : "see `meshmoe plan`; raise run.max_memory if the node has more",
                    world);
}

std::string measured_memory_line(double peak_pss, double planned, MPI_Comm world) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &ranks);
  const double mine[2] = {peak_pss, planned};
  std::vector<double> all(2 * size_t(ranks));
  MPI_Gather(mine, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, 0, world);
  if (rank != 0) return "";
  std::string line = "memory measured (peak Pss per rank):";
  char buf[128];
  for (int r = 0; r < ranks; ++r) {
    const double pss = all[2 * size_t(r)], plan = all[2 * size_t(r) + 1];
    std::snprintf(buf, sizeof buf, "%s rank %d %.1f MiB (plan %.1f MiB, %+.1f%%)", r ? ";" : "", r, pss / 1048576.0,
                  plan / 1048576.0, pss > 0 ? 100.0 * (plan - pss) / pss : 0.0);
    line += buf;
  }
  if (all[0] <= 0) line += " (no /proc/self/smaps_rollup: not measured)";
  return line + "\n";
}

NodeShare node_share(const std::string& max_memory, MPI_Comm world) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  // The memory available to this process (cgroup limit, MemAvailable, or run.max_memory).
  MemoryLimit avail;
  try {
    avail = available_memory(max_memory);
  } catch (const InputError&) {
  }
  // Ranks on this node share its memory.
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local = 1;
  MPI_Comm_size(node, &local);
  double node_bytes = avail.bytes > 0 ? avail.bytes : 1e300;
  MPI_Allreduce(MPI_IN_PLACE, &node_bytes, 1, MPI_DOUBLE, MPI_MIN, node);  // the node's tightest rank
  MPI_Comm_free(&node);
  struct {
    double v;
    int r;
  } mine{node_bytes / local, rank}, least{};
  MPI_Allreduce(&mine, &least, 1, MPI_DOUBLE_INT, MPI_MINLOC, world);  // the tightest node
  // Every rank learns where the tightest node's figure came from.
  NodeShare share;
  share.source = avail.source;
  int len = int(share.source.size());
  share.ranks = local;
  MPI_Bcast(&len, 1, MPI_INT, least.r, world);
  MPI_Bcast(&share.ranks, 1, MPI_INT, least.r, world);
  share.source.resize(size_t(len));
  MPI_Bcast(share.source.data(), len, MPI_CHAR, least.r, world);
  share.per_rank = least.v < 1e299 ? least.v : 0;
  return share;
}

}  // namespace meshmoe
