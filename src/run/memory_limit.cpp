#include "run/memory_limit.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.hpp"
#include "core/sizes.hpp"
#include "io/h5.hpp"
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
  if (auto v = meminfo("MemAvailable")) m.bytes = *v, m.source = "MemAvailable of /proc/meminfo";
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

void check_memory_plan(const Config& cfg, const MeshShape& mesh, MPI_Comm world) {
  if (cfg.run.device != Device::Cpu) return;
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  int vocab = int(cfg.model.vocab_size);
  if (vocab == 0 && rank == 0) {
    // Only the attribute: the tokens are not read here (the trainer loads them after the check).
    try {
      std::error_code ec;
      if (std::filesystem::is_regular_file(cfg.data.path, ec)) {
        h5::File f = h5::File::open(cfg.data.path);
        if (f.has_attr("vocab_size")) vocab = int(std::clamp<int64_t>(f.attr<int64_t>("vocab_size"), 0, INT32_MAX));
      }
    } catch (const std::exception&) {
      vocab = 0;  // the trainer says what is wrong with the data
    }
  }
  MPI_Bcast(&vocab, 1, MPI_INT, 0, world);
  if (vocab <= 0) return;
  // Every rank plans every stage (deterministic, no communication), so an overflow or a deck that
  // does not split is raised by all ranks together.
  std::vector<MemoryPlan> plans;
  for (int s = 0; s < mesh.pipe; ++s) plans.push_back(plan_memory(cfg, vocab, mesh, s, 0, 0));
  const int stage = mesh.coords(rank)[size_t(Axis::Pipe)];
  check_node_memory(double(plans[size_t(stage)].total_bytes()), "the plan", cfg.run.max_memory,
                    cfg.run.max_memory.empty()
                        ? "see `meshmoe plan`; use more nodes, smaller micro-batches or a smaller model, or set "
                          "run.max_memory to override"
                        : "see `meshmoe plan`; raise run.max_memory if the node has more",
                    world);
}

}  // namespace meshmoe
