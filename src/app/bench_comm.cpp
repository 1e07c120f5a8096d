// `meshmoe bench-comm`: see bench_comm.hpp.
#include "app/bench_comm.hpp"

#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <span>

#include "core/error.hpp"
#include "mesh/agree.hpp"
#include "io/h5.hpp"
#include "io/output_file.hpp"
#include "mesh/mesh.hpp"
#include "tensor/device.hpp"
#include "run/memory_limit.hpp"
#include "run/select_device.hpp"

namespace meshmoe {

namespace {

constexpr int64_t kMaxSize = int64_t(1) << 30;  // 1 GiB per buffer: beyond that, a typo more likely than a wish
constexpr double kAdaptiveSeconds = 0.05;       // adaptive mode: time at least this long ...
constexpr int64_t kAdaptiveMaxIters = 100;      // ... or this many calls, whichever comes first
constexpr int kWarmup = 2;

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t end = s.find(sep, start);
    out.push_back(trim(s.substr(start, end == std::string::npos ? std::string::npos : end - start)));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "1 KiB", "64 KiB", "16 MiB", "1000 B"
std::string human_bytes(int64_t b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && b >= 1024 && b % 1024 == 0) b /= 1024, ++u;
  return std::to_string(b) + " " + unit[u];
}

MeshShape parse_mesh(const std::string& text, Axis axis, int world) {
  if (text.empty()) {  // the whole world along the timed axis
    MeshShape s;
    if (axis == Axis::Pipe) s.pipe = world;
    else if (axis == Axis::Data) s.data = world;
    else s.tensor = world;
    return s;
  }
  const std::string hint = "bench-comm: --mesh '" + text + "': expected PxDxT (pipe x data x tensor), e.g. 1x2x2";
  std::vector<std::string> parts = split(lower(text), 'x');
  if (parts.size() != 3) throw InputError(hint);
  int v[3];
  for (int i = 0; i < 3; ++i) {
    const std::string& p = parts[size_t(i)];
    if (p.empty() || p.size() > 6 || !std::all_of(p.begin(), p.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      throw InputError(hint);
    v[i] = std::stoi(p);
    if (v[i] < 1) throw InputError(hint + " (every extent >= 1)");
  }
  return MeshShape{v[0], v[1], v[2]};
}

Axis parse_axis(const std::string& text) {
  const std::string a = lower(trim(text));
  if (a == "data") return Axis::Data;
  if (a == "tensor") return Axis::Tensor;
  if (a == "pipe") return Axis::Pipe;
  throw InputError("bench-comm: --axis '" + text + "': expected one of data, tensor, pipe");
}

std::vector<std::string> parse_ops(const std::string& text) {
  if (trim(text).empty()) return bench_ops();
  std::vector<std::string> ops;
  for (const std::string& o : split(text, ',')) {
    if (std::find(bench_ops().begin(), bench_ops().end(), o) == bench_ops().end()) {
      std::string known;
      for (const auto& k : bench_ops()) known += (known.empty() ? "" : ", ") + k;
      throw InputError("bench-comm: --ops: unknown op '" + o + "'; known: " + known);
    }
    if (std::find(ops.begin(), ops.end(), o) == ops.end()) ops.push_back(o);
  }
  return ops;
}

// Rank 0 runs `work`; an Error or InputError there becomes an InputError on every rank.
void on_rank0_or_input_error(int rank, const std::function<void()>& work) {
  std::string error;
  if (rank == 0) {
    try {
      work();
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "bench-comm: failed on rank 0";
    }
  }
  error = broadcast_string(error, 0, MPI_COMM_WORLD);
  if (!error.empty()) throw InputError(error);
}

// A value that names (block tag, index) exactly in float: tag < 4096, index pattern < 4093 (a
// prime, so a shift by any whole number of blocks of a power-of-two size shows), total < 2^24.
float pattern(int64_t tag, int64_t i) { return float((tag % 4096) * 4096 + i % 4093); }

// One op at one size on one axis: buffers, a correctness check against the expected values, and
// the call that is timed. The check writes its pattern into a and b and reads the result there;
// the call moves a and b themselves, or with Buffers on a device (--device cuda, as the trainer's)
// their device copies, which the check uploads before the op and downloads after it.
struct OpRun {
  int64_t bytes = 0;            // bytes of the largest per-rank buffer actually used
  std::function<void()> call;   // one collective
  std::function<int64_t()> check;  // runs the op once on patterned data; returns wrong elements
  Comm* comm = nullptr;
  std::span<float> a, b;        // the host's view of the buffers
  float *pa = nullptr, *pb = nullptr;  // what the call moves
  std::vector<float> a_host, b_host;   // a's and b's memory (a's unless resident)
  Buffer<float> da, db;                // the device copies
  // --shm resident: all_reduce's buffer in node-shared memory (Comm::node_shared_alloc), as the
  // trainer's gradients; freed (collectively) with the run.
  std::span<float> resident;
  Comm* owner = nullptr;
  OpRun() = default;
  OpRun(const OpRun&) = delete;
  OpRun& operator=(const OpRun&) = delete;
  ~OpRun() {
    if (owner) owner->node_shared_free(resident.data());
  }
  // a (the resident buffer if there is one) and b of these sizes, zero.
  void allocate(size_t na, size_t nb) {
    if (!owner) a_host.assign(na, 0.f);
    b_host.assign(nb, 0.f);
    a = owner ? resident : std::span<float>(a_host), b = b_host;
    pa = a.data(), pb = b.data();
    if (buffers_on_device() && !owner) {
      da = Buffer<float>(na), db = Buffer<float>(nb);
      pa = da.data(), pb = db.data();
    }
  }
  bool copies() const { return pa != a.data(); }
  void upload() {
    if (copies()) copy_from_host(pa, a.data(), a.size_bytes());
  }
  void download() {
    if (!copies()) return;
    copy_to_host(a.data(), pa, a.size_bytes());
    if (!b.empty()) copy_to_host(b.data(), pb, b.size_bytes());
  }
};

void setup_op(OpRun& r, const std::string& op, int64_t size, Comm& comm, bool resident) {
  const int n = comm.size(), me = comm.rank();
  const int64_t elems = size / 4;
  r.comm = &comm;
  if (op == "all_reduce") {
    // a [elems], in place
    if (float* p = resident ? static_cast<float*>(comm.node_shared_alloc(size_t(elems) * sizeof(float))) : nullptr)
      r.resident = std::span<float>(p, size_t(elems)), r.owner = &comm;
    r.allocate(size_t(elems), 0);
    r.bytes = 4 * elems;
    r.call = [&r, &comm] { comm.all_reduce(r.pa, r.a.size(), Op::Sum); };
    r.check = [&r, &comm, n, me] {
      const std::span<float> a = r.a;
      for (size_t i = 0; i < a.size(); ++i) a[i] = float(me + 1 + int(i % 5));
      r.upload();
      comm.all_reduce(r.pa, a.size(), Op::Sum);
      r.download();
      int64_t bad = 0;
      for (size_t i = 0; i < a.size(); ++i) bad += a[i] != float(n * int(i % 5) + n * (n + 1) / 2);
      std::fill(a.begin(), a.end(), 0.f);  // timed calls then sum zeros: no growth, no denormals
      r.upload();
      return bad;
    };
  } else if (op == "all_to_all") {
    // a [n, blk] -> b [n, blk]: block j of a goes to rank j
    const int64_t blk = elems / n;
    r.allocate(size_t(blk * n), size_t(blk * n));
    r.bytes = 4 * blk * n;
    r.call = [&r, &comm, blk] { comm.all_to_all(r.pa, r.pb, size_t(blk)); };
    r.check = [&r, &comm, n, me, blk] {
      for (int j = 0; j < n; ++j)
        for (int64_t i = 0; i < blk; ++i) r.a[size_t(j * blk + i)] = pattern(int64_t(me) * n + j, i);
      r.upload();
      comm.all_to_all(r.pa, r.pb, size_t(blk));
      r.download();
      int64_t bad = 0;
      for (int j = 0; j < n; ++j)  // block j came from rank j, its block `me`
        for (int64_t i = 0; i < blk; ++i) bad += r.b[size_t(j * blk + i)] != pattern(int64_t(j) * n + me, i);
      return bad;
    };
  } else if (op == "all_gather") {
    // a [blk] -> b [n, blk]
    const int64_t blk = elems / n;
    r.allocate(size_t(blk), size_t(blk * n));
    r.bytes = 4 * blk * n;
    r.call = [&r, &comm, blk] { comm.all_gather(r.pa, size_t(blk), r.pb); };
    r.check = [&r, &comm, n, me, blk] {
      for (int64_t i = 0; i < blk; ++i) r.a[size_t(i)] = pattern(me, i);
      r.upload();
      comm.all_gather(r.pa, size_t(blk), r.pb);
      r.download();
      int64_t bad = 0;
      for (int j = 0; j < n; ++j)
        for (int64_t i = 0; i < blk; ++i) bad += r.b[size_t(j * blk + i)] != pattern(j, i);
      return bad;
    };
  } else if (op == "permute") {
    // a [elems] -> rank+1; b [elems] <- rank-1 (GShard's CollectivePermute as a ring shift)
    const int dest = (me + 1) % n, source = (me + n - 1) % n;
    r.allocate(size_t(elems), size_t(elems));
    r.bytes = 4 * elems;
    r.call = [&r, &comm, dest, source] { comm.permute(r.pa, r.pb, r.a.size(), dest, source); };
    r.check = [&r, &comm, me, dest, source] {
      for (size_t i = 0; i < r.a.size(); ++i) r.a[i] = pattern(me, int64_t(i));
      r.upload();
      comm.permute(r.pa, r.pb, r.a.size(), dest, source);
      r.download();
      int64_t bad = 0;
      for (size_t i = 0; i < r.b.size(); ++i) bad += r.b[i] != pattern(source, int64_t(i));
      return bad;
    };
  } else {
    throw Error("bench-comm: no setup for op " + op);
  }
}

struct Timing {
  double time_s = 0;  // per call: max over ranks of the mean
  int64_t iters = 0;
};

// Barrier on the world before each timed batch, so every axis group starts together (on a mesh,
// all groups of the axis run at once, as they would in a training step).
Timing time_op(OpRun& r, Comm& world, int fixed_iters) {
  for (int i = 0; i < kWarmup; ++i) r.call();
  r.comm->synchronize();
  double local = 0;  // this rank's total time in timed calls
  int64_t done = 0;
  if (fixed_iters > 0) {
    world.barrier();
    const double t0 = MPI_Wtime();
    for (int i = 0; i < fixed_iters; ++i) r.call();
    r.comm->synchronize();  // NCCL's calls are queued: the time is the device's
    local = MPI_Wtime() - t0;
    done = fixed_iters;
  } else {
    // Batches of 1, 2, 4, ... calls until the slowest rank has spent kAdaptiveSeconds or
    // kAdaptiveMaxIters calls are done; the decision uses the max over ranks, so all agree.
    int64_t batch = 1;
    while (true) {
      world.barrier();
      const double t0 = MPI_Wtime();
      for (int64_t i = 0; i < batch; ++i) r.call();
      r.comm->synchronize();
      local += MPI_Wtime() - t0;
      done += batch;
      double slowest = local;
      world.all_reduce(&slowest, 1, Op::Max);
      if (slowest >= kAdaptiveSeconds || done >= kAdaptiveMaxIters) break;
      batch = std::min(batch * 2, kAdaptiveMaxIters - done);
    }
  }
  double mean = local / double(done);
  world.all_reduce(&mean, 1, Op::Max);
  return Timing{mean, done};
}

std::vector<std::string> gather_hostnames(Comm& world) {
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  const size_t n = size_t(world.size());
  std::vector<char> all(n * MPI_MAX_PROCESSOR_NAME);
  world.all_gather(host, MPI_MAX_PROCESSOR_NAME, all.data());
  std::vector<std::string> out;
  for (size_t r = 0; r < n; ++r) {
    const char* h = all.data() + r * MPI_MAX_PROCESSOR_NAME;
    out.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
  }
  return out;
}

}  // namespace

const std::vector<std::string>& bench_ops() {
  static const std::vector<std::string> ops = {"all_reduce", "all_to_all", "all_gather", "permute"};
  return ops;
}

double bus_factor(const std::string& op, int n) {
  // NCCL-tests' PERFORMANCE.md: the traffic per link of a bandwidth-optimal algorithm.
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_to_all" || op == "all_gather") return double(n - 1) / n;
  if (op == "permute") return 1.0;
  throw InputError("bench-comm: unknown op '" + op + "'");
}

std::vector<int64_t> default_sizes() {
  std::vector<int64_t> s;
  for (int64_t b = 1024; b <= (int64_t(16) << 20); b *= 4) s.push_back(b);
  return s;
}

std::vector<int64_t> parse_sizes(const std::string& text) {
  if (trim(text).empty()) throw InputError("bench-comm: --sizes is empty; give bytes per rank, e.g. 1K,64K,1M");
  std::vector<int64_t> out;
  for (const std::string& item : split(text, ',')) {
    if (item.empty()) throw InputError("bench-comm: --sizes '" + text + "' has an empty entry; give e.g. 1K,64K,1M");
    const std::string bad = "bench-comm: --sizes: '" + item + "' ";
    size_t digits = 0;
    while (digits < item.size() && std::isdigit(static_cast<unsigned char>(item[digits]))) ++digits;
    if (digits == 0 || digits > 12)
      throw InputError(bad + "is not a size: give a whole number of bytes with an optional K, M or G suffix (1024, 64K, 1M)");
    const std::string suffix = lower(trim(item.substr(digits)));
    int shift = 0;
    if (suffix == "" || suffix == "b") shift = 0;
    else if (suffix == "k" || suffix == "kib" || suffix == "kb") shift = 10;
    else if (suffix == "m" || suffix == "mib" || suffix == "mb") shift = 20;
    else if (suffix == "g" || suffix == "gib" || suffix == "gb") shift = 30;
    else if (suffix == "t" || suffix == "tib" || suffix == "tb") shift = 40;
    else throw InputError(bad + "has an unknown suffix '" + suffix + "': use K, M, G or T (powers of 1024)");
    const int64_t v = std::stoll(item.substr(0, digits));
    if (v == 0) throw InputError(bad + "is zero: sizes must be positive");
    if (v > (kMaxSize >> shift)) throw InputError(bad + "is above the limit of 1 GiB per buffer");
    const int64_t bytes = v << shift;
    if (bytes % 4 != 0)
      throw InputError(bad + "= " + std::to_string(bytes) + " bytes is not a multiple of 4 (the ops move float32)");
    out.push_back(bytes);
  }
  return out;
}

// More timed calls than this only make a run take hours (1 GiB buffers at 1e6 calls).
constexpr int kMaxIters = 1000000;

int bench_comm_main(const BenchCommOptions& opt) {
  int world_size = 1, world_rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);

  // Every rank parses the same options, so every rank throws alike before any collective.
  const Axis axis = parse_axis(opt.axis);
  const MeshShape shape = parse_mesh(opt.mesh, axis, world_size);
  const std::vector<int64_t> sizes = opt.sizes.empty() ? default_sizes() : parse_sizes(opt.sizes);
  const std::vector<std::string> ops = parse_ops(opt.ops);
  if (opt.iters < 0 || opt.iters > kMaxIters)
    throw InputError("bench-comm: --iters " + std::to_string(opt.iters) + ": must be in [0, " + std::to_string(kMaxIters) +
                     "] (timed calls per size; 0: adaptive)");
  if (opt.shm != "on" && opt.shm != "off" && opt.shm != "resident")
    throw InputError("bench-comm: --shm '" + opt.shm + "': give on, off or resident");
  if (opt.device != "cpu" && opt.device != "cuda")
    throw InputError("bench-comm: --device '" + opt.device + "': give cpu or cuda");
  const bool cuda = opt.device == "cuda";
  if (cuda && opt.shm == "resident")
    throw InputError("bench-comm: --shm resident puts all_reduce's buffer in host memory; not with --device cuda");
  Mesh mesh(MPI_COMM_WORLD, shape.pipe, shape.data, shape.tensor);  // InputError when it does not fit the job
  // Every rank on a GPU of its node, or every rank stops with the first failing rank's reason.
  const std::string device_line = select_device(cuda ? Device::Cuda : Device::Cpu, Precision::Fp32, MPI_COMM_WORLD);
  ShmSettings shm;
  shm.enabled = opt.shm != "off" && !cuda;
  mesh.set_shm(shm);
#ifdef MESHMOE_CUDA
  if (cuda) mesh.enable_device();
  Comm& comm = cuda ? mesh.device_axis(axis) : mesh.axis(axis);
#else
  Comm& comm = mesh.axis(axis);  // select_device refused cuda above
#endif
  // Collective: whether all_reduce of >= 256 KiB takes the shared-memory window (mesh/mpi_comm.hpp).
  const bool shm_used = !cuda && static_cast<MpiComm&>(comm).shm_active();
  // Collective: whether it is hierarchical instead (the group spans nodes, mesh/node_hierarchy.hpp).
  const bool hierarchical = !cuda && !shm_used && static_cast<MpiComm&>(comm).hierarchy() != nullptr;
  Comm& world = mesh.world_comm();
  const int n = comm.size();
  for (const std::string& op : ops)
    if (op == "all_to_all" || op == "all_gather")
      for (int64_t s : sizes)
        if (s < 4 * int64_t(n))
          throw InputError("bench-comm: size " + std::to_string(s) + " bytes is less than one float per rank for " + op +
                           " over " + std::to_string(n) + " ranks; use sizes >= " + std::to_string(4 * n));

  // The largest buffers one rank holds at once (one op at one size): all_reduce S, all_gather S/n + S,
  // all_to_all and permute 2 S; the ranks of a node together must fit in its available memory.
  double peak = 0;
  for (const std::string& op : ops)
    for (int64_t s : sizes) peak = std::max(peak, (op == "all_reduce" ? 1.0 : op == "all_gather" ? 1.0 + 1.0 / n : 2.0) * double(s));
  check_node_memory(peak, "bench-comm --sizes " + (opt.sizes.empty() ? std::string("(default)") : opt.sizes), opt.max_memory,
                    "use smaller --sizes, fewer ranks per node, or --max-memory to override", MPI_COMM_WORLD,
                    "--max-memory");

  // The output file is created first, so a bad -o costs nothing.
  // It replaces only an earlier bench-comm result, through a temporary file (src/io/output_file.hpp).
  h5::File file;
  ReplacingFile out;  // rank 0's
  on_rank0_or_input_error(world_rank, [&] {
    check_output_path(opt.output, {"bench-comm", "-o", {}, {"meshmoe bench-comm"}});
    out = ReplacingFile(opt.output);
    try {
      file = h5::File::create(out.temporary());
    } catch (const std::exception& e) {
      throw InputError("bench-comm: cannot create the output file " + opt.output + " (" + e.what() + ")");
    }
  });
  const std::vector<std::string> hosts = gather_hostnames(world);

  const std::string mesh_text =
      std::to_string(shape.pipe) + "x" + std::to_string(shape.data) + "x" + std::to_string(shape.tensor);
  const bool rank0 = world_rank == 0;
  if (rank0 && !opt.quiet) {
    std::printf("# meshmoe bench-comm: mesh %s, %s axis: %d group(s) of %d rank(s), float32, %s, all_reduce %s\n",
                shape.str().c_str(), axis_name(axis), world_size / n, n,
                opt.iters > 0 ? (std::to_string(opt.iters) + " timed calls per size").c_str()
                              : "adaptive (>= 0.05 s or 100 calls)",
                cuda                     ? "by NCCL on the GPUs"
                : hierarchical           ? "from 256 KiB hierarchical: shared memory inside each node, MPI between nodes"
                : !shm_used              ? "by MPI"
                : opt.shm == "resident" ? "from 256 KiB in place in node-shared memory (--shm resident)"
                                        : "from 256 KiB through shared memory (--shm on)");
    std::printf("# %s\n", device_line.c_str());
    if (n == 1) std::printf("# note: the %s axis has 1 rank: nothing crosses the wire\n", axis_name(axis));
    std::printf("%12s  %-10s  %12s  %12s  %12s  %6s\n", "size", "op", "time (us)", "algbw (GB/s)", "busbw (GB/s)",
                "iters");
    std::fflush(stdout);
  }

  const size_t S = sizes.size();
  struct Series {
    std::vector<double> time_s, algbw, busbw;
    std::vector<int64_t> bytes, iters;
  };
  std::vector<Series> series(ops.size());
  for (size_t si = 0; si < S; ++si) {
    for (size_t oi = 0; oi < ops.size(); ++oi) {
      const std::string& op = ops[oi];
      OpRun r;
      setup_op(r, op, sizes[si], comm, opt.shm == "resident");
      int64_t bad = r.check();
      world.all_reduce(&bad, 1, Op::Max);
      if (bad > 0)
        throw Error("bench-comm: " + op + " of " + std::to_string(sizes[si]) + " bytes over the " + comm.name() +
                    " returned " + std::to_string(bad) + " wrong elements on some rank");
      const Timing t = time_op(r, world, opt.iters);
      const double algbw = double(r.bytes) / t.time_s / 1e9;
      Series& s = series[oi];
      s.time_s.push_back(t.time_s);
      s.algbw.push_back(algbw);
      s.busbw.push_back(algbw * bus_factor(op, n));
      s.bytes.push_back(r.bytes);
      s.iters.push_back(t.iters);
      if (rank0 && !opt.quiet) {
        std::printf("%12s  %-10s  %12.2f  %12.3f  %12.3f  %6lld\n", human_bytes(sizes[si]).c_str(), op.c_str(),
                    t.time_s * 1e6, algbw, s.busbw.back(), static_cast<long long>(t.iters));
        std::fflush(stdout);
      }
    }
  }

  std::string error;
  if (rank0) try {
    std::string host_list;
    for (const auto& h : hosts) host_list += (host_list.empty() ? "" : ",") + h;
    file.set_attr("created_by", std::string("meshmoe bench-comm"));
    file.set_attr("ranks", int64_t(world_size));
    file.set_attr("mesh", mesh_text);
    file.set_attr("mesh_description", shape.str());
    file.set_attr("axis", std::string(axis_name(axis)));
    file.set_attr("axis_ranks", int64_t(n));
    file.set_attr("axis_groups", int64_t(world_size / n));
    file.set_attr("hostnames", host_list);
    file.set_attr("dtype", std::string("float32"));
    file.set_attr("iters_mode", std::string(opt.iters > 0 ? "fixed" : "adaptive"));
    file.set_attr("shm_collectives", std::string(shm_used ? opt.shm : "off"));
    file.set_attr("device", opt.device);
    file.set_attr("backend", std::string(cuda ? "nccl" : "mpi"));
    file.set_attr("description",
                  std::string("collective time against message size over one mesh axis; all groups of the axis run "
                              "at once; size = bytes of one rank's largest buffer (NCCL-tests convention); time per "
                              "call = max over world ranks of the mean over the timed calls, after a barrier and " +
                              std::to_string(kWarmup) + " warm-up calls"));
    auto sz = file.write<int64_t>("sizes", sizes);
    sz.set_attr("units", std::string("bytes"));
    sz.set_attr("description", std::string("requested message size per rank (row index of every /<op>/* dataset)"));
    for (size_t oi = 0; oi < ops.size(); ++oi) {
      const std::string& op = ops[oi];
      const Series& s = series[oi];
      h5::Group g = file.create_group(op);
      g.set_attr("busbw_factor", bus_factor(op, n));
      auto put = [&](const char* name, auto& data, const char* units, const std::string& what) {
        auto d = g.write(name, data);
        d.set_attr("units", std::string(units));
        d.set_attr("description", what);
      };
      put("time_s", s.time_s, "s", "time per call: max over ranks of the mean over timed calls");
      put("algbw", s.algbw, "GB/s", "algorithm bandwidth bytes/time_s, GB = 1e9 bytes");
      put("busbw", s.busbw, "GB/s", "bus bandwidth algbw * busbw_factor, GB = 1e9 bytes");
      put("bytes", s.bytes, "bytes", "bytes of the largest per-rank buffer actually moved (blocks rounded down to whole floats)");
      put("iters", s.iters, "1", "timed calls");
    }
    file.close();
    out.commit();
    if (!opt.quiet) std::printf("# wrote %s\n", opt.output.c_str());
  } catch (const std::exception& e) {
    error = "bench-comm: cannot write " + opt.output + ": " + e.what();
  }
  if (const std::string why = first_error(error, MPI_COMM_WORLD); !why.empty()) throw AgreedFailure(why);
  return kExitOk;
}

}  // namespace meshmoe
