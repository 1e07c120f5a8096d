// Checkpoint files (src/io/checkpoint.hpp): write on one mesh, read on another (resharding), the
// optimizer state round trip, attributes, atomic commit, retention, and corruption handling.
//
// The oracle is the logical index: every element of every tensor holds value(name, logical index),
// so whatever block a rank reads, it knows exactly what it must get (exact float comparison: the
// values are small multiples of 1/4, copied bit for bit, no arithmetic). Replicas that must not
// be written (not the lowest rank holding that block) are filled with a poison value, so a file
// written by the wrong replica, or by two, fails the comparison.
#include <catch2/catch.hpp>
#include <hdf5.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>

#include "../test_util.hpp"
#include "../support/h5_support.hpp"
#include "support/h5_mutate.hpp"
#include "../support/mesh_support.hpp"
#include "core/error.hpp"
#include "checkpoint/checkpoint.hpp"
#include "io/h5.hpp"
#include "mesh/mesh.hpp"

namespace meshmoe {
namespace {

namespace fs = std::filesystem;

constexpr float kPoison = -1.0f;
constexpr int kLayers = 4;

// Exactly representable: salt * 100 + idx / 4 with idx < 2^20.
float value(const std::string& name, uint64_t idx) {
  unsigned salt = 0;
  for (unsigned char c : name) salt += c;
  return float(salt % 97) * 100.0f + float(idx) * 0.25f;
}

uint64_t logical_index(const std::vector<int64_t>& logical, const std::vector<int64_t>& offset,
                       const std::vector<int64_t>& local, size_t i) {
  std::vector<int64_t> coord(local.size());
  for (size_t d = local.size(); d-- > 0;) {
    coord[d] = int64_t(i % size_t(local[d])) + offset[d];
    i /= size_t(local[d]);
  }
  uint64_t idx = 0;
  for (size_t d = 0; d < coord.size(); ++d) idx = idx * uint64_t(logical[d]) + uint64_t(coord[d]);
  return idx;
}

// A model laid out the way the sharded trainer lays it out, on mesh `sh` at rank `rank`:
//  embed.wte [7, 3]               tied: first and last pipeline stage, replicated
//  blocks.l.attn.w [8, 6]         column blocks over tensor (Megatron), layers split over pipe
//  blocks.l.moe.w1 [4, 3, 6]      experts over data, expert hidden over tensor (Switch 5.5)
//  blocks.l.ln.g [6]              replicated
//  final.ln.g [6]                 last stage
// `whole`: every rank holds every parameter of every stage whole (the single-block decomposition).
// Optimizer state: "<param>/exp_avg" (same block) and "moe.w1/v_row" [4, 3] (experts over data,
// replicated over tensor: Adafactor's factored row accumulator of a column-split weight).
struct Model {
  ParamStore<float> store;
  std::deque<Buffer<float>> state_data;
  std::vector<StateTensor> state;
};

void build(Model& m, const MeshShape& sh, int rank, bool whole, bool fill, bool poison) {
  const auto c = sh.coords(rank);
  const int p = c[size_t(Axis::Pipe)], d = c[size_t(Axis::Data)], t = c[size_t(Axis::Tensor)];
  struct Def {
    std::string name;
    std::vector<int64_t> logical, offset, local;
    bool canonical;  // the copy the lowest rank holding this block has
  };
  std::vector<Def> defs;
  auto add = [&](std::string name, std::vector<int64_t> logical, std::vector<int64_t> offset, std::vector<int64_t> local,
                 bool canonical) {
    if (whole) offset.assign(logical.size(), 0), local = logical, canonical = true;
    defs.push_back({std::move(name), std::move(logical), std::move(offset), std::move(local), canonical});
  };
  const auto [l0, nl] = test::even_split(kLayers, sh.pipe, p);
  const auto [c0, nc] = test::even_split(6, sh.tensor, t);
  const auto [e0, ne] = test::even_split(4, sh.data, d);
  if (whole || p == 0 || p == sh.pipe - 1) add("embed.wte", {7, 3}, {0, 0}, {7, 3}, p == 0 && d == 0 && t == 0);
  for (int64_t l = 0; l < kLayers; ++l) {
    if (!whole && (l < l0 || l >= l0 + nl)) continue;
    const std::string b = "blocks." + std::to_string(l);
    add(b + ".attn.w", {8, 6}, {0, c0}, {8, nc}, d == 0);
    add(b + ".moe.w1", {4, 3, 6}, {e0, 0, c0}, {ne, 3, nc}, true);
    add(b + ".ln.g", {6}, {0}, {6}, d == 0 && t == 0);
  }
  if (whole || p == sh.pipe - 1) add("final.ln.g", {6}, {0}, {6}, d == 0 && t == 0);

  for (const auto& df : defs) m.store.add_block(df.name, df.logical, df.local, df.offset, InitKind::Zeros, 1, nullptr);
  m.store.allocate();
  auto fill_block = [&](const std::string& name, const std::vector<int64_t>& logical, const std::vector<int64_t>& offset,
                        const std::vector<int64_t>& local, bool canonical, float* out, size_t n) {
    for (size_t i = 0; i < n; ++i)
      out[i] = !fill ? 0.0f : (poison && !canonical) ? kPoison : value(name, logical_index(logical, offset, local, i));
  };
  for (size_t i = 0; i < defs.size(); ++i) {
    const auto& info = m.store.infos()[i];
    fill_block(info.name, info.logical_shape, info.offset, info.local_shape, defs[i].canonical,
               m.store.weights() + info.flat_offset, info.size);
  }
  auto add_state = [&](std::string name, std::vector<int64_t> logical, std::vector<int64_t> offset,
                       std::vector<int64_t> local, bool canonical) {
    size_t n = 1;
    for (auto x : local) n *= size_t(x);
    auto& buf = m.state_data.emplace_back(n);
    fill_block(name, logical, offset, local, canonical, buf.data(), n);
    m.state.push_back({std::move(name), std::move(logical), std::move(local), std::move(offset), &buf});
  };
  for (const auto& df : defs) {
    add_state(df.name + "/exp_avg", df.logical, df.offset, df.local, df.canonical);
    if (df.name.find("moe.w1") != std::string::npos)
      add_state(df.name + "/v_row", {4, 3}, {df.offset[0], 0}, {df.local[0], 3}, df.canonical && (whole || t == 0));
  }
}

// Number of elements that differ from value(name, logical index); 0 = exact.
size_t mismatches(const Model& m) {
  size_t bad = 0;
  for (const auto& p : m.store.infos())
    for (size_t i = 0; i < p.size; ++i)
      bad += m.store.weights()[p.flat_offset + i] != value(p.name, logical_index(p.logical_shape, p.offset, p.local_shape, i));
  for (const auto& s : m.state)
    for (size_t i = 0; i < s.data->size(); ++i)
      bad += (*s.data)[i] != value(s.name, logical_index(s.logical_shape, s.offset, s.local_shape, i));
  return bad;
}

// A fresh directory shared by the ranks (rank 0 makes it).
std::string fresh_dir(const std::string& name) {
  const std::string dir = test::scratch_dir() + "/meshmoe_ckpt_" + name + "_np" + std::to_string(test::world_size());
  if (test::world_rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

CheckpointMeta sample_meta(int64_t step) {
  CheckpointMeta m;
  m.step = step;
  m.update_count = step - 1;
  m.seed = 0xfedcba9876543210ull;  // above 2^63: stored bit for bit
  m.data_cursor = {3, 12345};
  m.optimizer = "adamw";
  m.version = "test-1.2.3";
  m.deck = "[model]\n# " + std::string(100000, 'x') + "\nlayers = 4\n";  // > 64 KiB: attribute on the heap
  m.counters = {{"bad_steps", 2}, {"tokens", 1 << 20}};
  return m;
}

// Flips one byte in the middle of the first chunk of dataset `dset` (serial, this process).
// Returns false when the chunk cannot be found (the caller makes every rank agree, so a failure
// here cannot leave the other ranks waiting).
bool corrupt_chunk(const std::string& path, const std::string& dset) {
  haddr_t addr = 0;
  hsize_t size = 0;
  {
    h5::File f = h5::File::open(path);
    h5::Dataset d = f.dataset(dset);
    unsigned mask = 0;
    std::vector<hsize_t> off(d.shape().size());
    hid_t space = H5Dget_space(d.id());
    const herr_t rc = H5Dget_chunk_info(d.id(), space, 0, off.data(), &mask, &addr, &size);
    H5Sclose(space);
    if (rc < 0 || size <= 8) return false;
  }
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(std::streamoff(addr + size / 2));
  char b = 0;
  io.read(&b, 1);
  b = char(b ^ 0x5a);
  io.seekp(std::streamoff(addr + size / 2));
  io.write(&b, 1);
  return bool(io);
}

bool any_contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x.find(s) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("checkpoint: write on every mesh, read back whole and on another mesh, exactly", "[checkpoint][mpi]") {
  const int world = test::world_size(), rank = test::world_rank();
  const auto shapes = test::all_mesh_shapes(world);
  const std::string dir = fresh_dir("reshard");
  for (size_t i = 0; i < shapes.size(); ++i) {
    const MeshShape& a = shapes[i];
    const MeshShape& b = shapes[(i + 1) % shapes.size()];
    INFO("written on " << a.str() << ", read on " << b.str());
    Mesh mesh(MPI_COMM_WORLD, a.pipe, a.data, a.tensor);
    Model src;
    build(src, a, rank, false, true, true);
    const std::string path = write_checkpoint(dir + "/" + std::to_string(i), src.store, src.state, sample_meta(10 + int64_t(i)), mesh);
    CHECK(fs::path(path).filename() == "step_000000" + std::to_string(10 + i) + ".h5");

    Model whole;
    build(whole, a, rank, true, false, false);
    CheckpointMeta m = read_checkpoint(path, whole.store, whole.state, MPI_COMM_WORLD);
    CHECK(mismatches(whole) == 0);
    CHECK(m.step == 10 + int64_t(i));
    CHECK(m.mesh == a);

    Model other;
    build(other, b, rank, false, false, false);
    read_checkpoint(path, other.store, other.state, MPI_COMM_WORLD);
    CHECK(mismatches(other) == 0);
  }
}

TEST_CASE("checkpoint: attributes round trip", "[checkpoint][mpi]") {
  const int world = test::world_size(), rank = test::world_rank();
  const MeshShape sh = test::all_mesh_shapes(world).back();
  Mesh mesh(MPI_COMM_WORLD, sh.pipe, sh.data, sh.tensor);
  Model src;
  build(src, sh, rank, false, true, false);
  const CheckpointMeta in = sample_meta(42);
  const std::string path = write_checkpoint(fresh_dir("meta"), src.store, src.state, in, mesh);
  Model dst;
  build(dst, sh, rank, false, false, false);
  const CheckpointMeta out = read_checkpoint(path, dst.store, dst.state, MPI_COMM_WORLD);
  CHECK(out.step == 42);
  CHECK(out.update_count == 41);
  CHECK(out.seed == in.seed);
  CHECK(out.data_cursor == in.data_cursor);
  CHECK(out.optimizer == "adamw");
  CHECK(out.version == in.version);
  CHECK(out.deck == in.deck);
  CHECK(out.counters == in.counters);
  CHECK(out.mesh == sh);
  CHECK(out.world_size == world);
  CHECK(out.param_count == 7 * 3 + kLayers * (8 * 6 + 4 * 3 * 6 + 6) + 6);
  const CheckpointMeta quick = read_checkpoint_meta(path);
  CHECK(quick.step == 42);
  CHECK(quick.deck == in.deck);
  // The file is self-describing: Fletcher32 on every tensor dataset.
  if (rank == 0) {
    h5::File f = h5::File::open(path);
    h5::Dataset d = f.dataset("/params/blocks.0.moe.w1");
    hid_t dcpl = H5Dget_create_plist(d.id());
    unsigned flags = 0, filter_config = 0;
    size_t nelmts = 0;
    CHECK(H5Pget_nfilters(dcpl) == 1);
    CHECK(H5Pget_filter2(dcpl, 0, &flags, &nelmts, nullptr, 0, nullptr, &filter_config) == H5Z_FILTER_FLETCHER32);
    H5Pclose(dcpl);
  }
}

TEST_CASE("checkpoint: a checkpoint of another model is refused on every rank", "[checkpoint][mpi]") {
  const int world = test::world_size(), rank = test::world_rank();
  const MeshShape sh = test::all_mesh_shapes(world).front();
  Mesh mesh(MPI_COMM_WORLD, sh.pipe, sh.data, sh.tensor);
  Model src;
  build(src, sh, rank, false, true, false);
  const std::string path = write_checkpoint(fresh_dir("compat"), src.store, src.state, sample_meta(5), mesh);

  auto expect_refused = [&](ParamStore<float>& store, std::vector<StateTensor>& state, const std::string& what) {
    std::string msg;
    try {
      read_checkpoint(path, store, state, MPI_COMM_WORLD);
    } catch (const InputError& e) {
      msg = e.what();
    }
    INFO(msg);
    CHECK(msg.find("checkpoint from an incompatible model") != std::string::npos);
    CHECK(msg.find(what) != std::string::npos);
  };
  SECTION("a parameter of another shape, on the last rank only") {
    // The other ranks read fine; all of them must still throw (no rank left waiting).
    Model m;
    build(m, sh, rank, true, false, false);
    ParamStore<float> store;
    for (const auto& p : m.store.infos())
      store.add(p.name, rank == world - 1 && p.name == "blocks.0.ln.g" ? std::vector<int64_t>{7} : p.logical_shape,
                InitKind::Zeros, 1, nullptr);
    store.allocate();
    std::vector<StateTensor> none;
    expect_refused(store, none, "'blocks.0.ln.g' is [6] in the checkpoint, [7] in this model");
  }
  SECTION("a parameter the checkpoint lacks") {
    Model m;
    build(m, sh, rank, true, false, false);
    ParamStore<float> store;
    for (const auto& p : m.store.infos()) store.add(p.name, p.logical_shape, InitKind::Zeros, 1, nullptr);
    store.add("blocks.9.attn.w", {8, 6}, InitKind::Zeros, 1, nullptr);
    store.allocate();
    std::vector<StateTensor> none;
    expect_refused(store, none, "'blocks.9.attn.w' [8, 6] is not in the checkpoint");
  }
  SECTION("a checkpoint of a bigger model") {
    ParamStore<float> store;
    store.add("embed.wte", {7, 3}, InitKind::Zeros, 1, nullptr);
    store.allocate();
    std::vector<StateTensor> none;
    expect_refused(store, none, "holds parameter 'blocks.0.attn.w', which this model does not have");
  }
  SECTION("optimizer state of another optimizer") {
    Model m;
    build(m, sh, rank, true, false, false);
    Buffer<float> buf(6);
    std::vector<StateTensor> st{{"final.ln.g/v", {6}, {6}, {0}, &buf}};
    expect_refused(m.store, st, "optimizer state 'final.ln.g/v' [6] is not in the checkpoint");
  }
}

TEST_CASE("checkpoint: atomic commit, LATEST, and what resume picks", "[checkpoint][mpi]") {
  const int world = test::world_size(), rank = test::world_rank();
  const MeshShape sh = test::all_mesh_shapes(world).back();
  Mesh mesh(MPI_COMM_WORLD, sh.pipe, sh.data, sh.tensor);
  Model src;
  build(src, sh, rank, false, true, false);
  const std::string dir = fresh_dir("atomic") + "/run/ckpt";  // created by the write
  CHECK(find_resume_checkpoint(dir, MPI_COMM_WORLD).path.empty());
  write_checkpoint(dir, src.store, src.state, sample_meta(1), mesh);
  const std::string p2 = write_checkpoint(dir, src.store, src.state, sample_meta(2), mesh);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"LATEST", "step_00000001.h5", "step_00000002.h5"});
  std::ifstream latest(dir + "/LATEST");
  std::string line;
  std::getline(latest, line);
  CHECK(line == "step_00000002.h5");

  ResumeChoice c = find_resume_checkpoint(dir, MPI_COMM_WORLD);
  CHECK(c.path == p2);
  CHECK(c.warnings.empty());

  // A write killed half way leaves only a .tmp (and maybe LATEST.tmp): ignored, reported.
  MPI_Barrier(MPI_COMM_WORLD);  // every rank has listed the directory
  if (rank == 0) {
    std::ofstream(dir + "/step_00000003.h5.tmp") << "half a file";
    std::ofstream(dir + "/LATEST.tmp") << "step_00000003.h5";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  c = find_resume_checkpoint(dir, MPI_COMM_WORLD);
  CHECK(c.path == p2);
  CHECK(any_contains(c.warnings, "step_00000003.h5.tmp"));
  CHECK(any_contains(c.warnings, "LATEST.tmp"));

  // Killed after the rename, before LATEST was replaced: the newer complete file wins.
  if (rank == 0) std::ofstream(dir + "/LATEST") << "step_00000001.h5\n";
  MPI_Barrier(MPI_COMM_WORLD);
  c = find_resume_checkpoint(dir, MPI_COMM_WORLD);
  CHECK(c.path == p2);
  CHECK(any_contains(c.warnings, "stopped before LATEST was updated"));

  // The next write truncates its own .tmp and commits; LATEST follows.
  write_checkpoint(dir, src.store, src.state, sample_meta(3), mesh);
  CHECK(!fs::exists(dir + "/step_00000003.h5.tmp"));
  std::ifstream latest3(dir + "/LATEST");
  std::getline(latest3, line);
  CHECK(line == "step_00000003.h5");
  VerifyResult v3 = verify_checkpoint(dir + "/step_00000003.h5");
  INFO(v3.message);
  CHECK(v3.ok);
}

TEST_CASE("checkpoint: retention keeps keep_last newest and multiples of keep_every", "[checkpoint][mpi]") {
  const int world = test::world_size(), rank = test::world_rank();
  const MeshShape sh = test::all_mesh_shapes(world).front();
  Mesh mesh(MPI_COMM_WORLD, sh.pipe, sh.data, sh.tensor);
  Model src;
  build(src, sh, rank, false, true, false);
  auto steps_in = [](const std::string& d) {
    std::vector<int64_t> s;
    for (const auto& [step, path] : list_checkpoints(d)) s.push_back(step);
    return s;
  };
  const std::string dir = fresh_dir("retain");
  for (int64_t s = 1; s <= 10; ++s) {
    write_checkpoint(dir, src.store, src.state, sample_meta(s), mesh, RetentionPolicy{3, 4, ""});
    // Never fewer than what the policy promises, the newest always there.
    CHECK(steps_in(dir).back() == s);
  }
  CHECK(steps_in(dir) == std::vector<int64_t>{4, 8, 9, 10});
  write_checkpoint(dir, src.store, src.state, sample_meta(11), mesh, RetentionPolicy{1, 0, ""});
  CHECK(steps_in(dir) == std::vector<int64_t>{11});
  // Re-writing an older step (a resumed run redoing steps) keeps the one just written.
  write_checkpoint(dir, src.store, src.state, sample_meta(5), mesh, RetentionPolicy{1, 0, ""});
  CHECK(steps_in(dir) == std::vector<int64_t>{5, 11});
  // Pruning touches only the writer's lineage: another run's checkpoints in the same directory
  // stay, however many the policy would remove.
  const std::string shared = fresh_dir("retain-lineage");
  for (int64_t s = 1; s <= 3; ++s) {
    CheckpointMeta m = sample_meta(s);
    m.lineage = "first";
    write_checkpoint(shared, src.store, src.state, m, mesh, RetentionPolicy{1, 0, "first"});
  }
  CHECK(steps_in(shared) == std::vector<int64_t>{3});
  for (int64_t s = 10; s <= 12; ++s) {
    CheckpointMeta m = sample_meta(s);
    m.lineage = "second";
    write_checkpoint(shared, src.store, src.state, m, mesh, RetentionPolicy{1, 0, "second"});
  }
  CHECK(steps_in(shared) == std::vector<int64_t>{3, 12});
  if (rank == 0) {
    CHECK(checkpoint_lineage(shared + "/" + checkpoint_file_name(3)) == "first");
    CHECK(checkpoint_lineage(shared + "/" + checkpoint_file_name(12)) == "second");
  }
}

TEST_CASE("checkpoint: corrupt, truncated and partial checkpoints are detected and skipped", "[checkpoint][mpi]") {
  const int world = test::world_size(), rank = test::world_rank();
  const MeshShape sh = test::all_mesh_shapes(world).back();
  Mesh mesh(MPI_COMM_WORLD, sh.pipe, sh.data, sh.tensor);
  Model src;
  build(src, sh, rank, false, true, false);
  const std::string dir = fresh_dir("corrupt");
  std::string paths[4];
  for (int i = 1; i <= 3; ++i) paths[i] = write_checkpoint(dir, src.store, src.state, sample_meta(10 * i), mesh);
  for (int i = 1; i <= 3; ++i) {
    VerifyResult ok = verify_checkpoint(paths[i]);
    INFO(ok.message);
    CHECK(ok.ok);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // everyone has verified before rank 0 breaks them

  // A flipped byte in a data chunk of the newest.
  int corrupted = rank == 0 ? int(corrupt_chunk(paths[3], "/params/blocks.0.attn.w")) : 0;
  MPI_Bcast(&corrupted, 1, MPI_INT, 0, MPI_COMM_WORLD);
  REQUIRE(corrupted == 1);  // every rank alike
  VerifyResult v = verify_checkpoint(paths[3]);
  INFO(v.message);
  CHECK(!v.ok);
  CHECK(v.message.find("Fletcher32") != std::string::npos);
  ResumeChoice c = find_resume_checkpoint(dir, MPI_COMM_WORLD);
  CHECK(c.path == paths[2]);
  CHECK(any_contains(c.warnings, "skipping bad checkpoint " + paths[3]));
  // Loading it anyway fails on every rank (only the ranks holding that block see the bad chunk).
  Model dst;
  build(dst, sh, rank, false, false, false);
  CHECK_THROWS_AS(read_checkpoint(paths[3], dst.store, dst.state, MPI_COMM_WORLD), InputError);

  // Truncate the next one; leave a stale .tmp newer than all.
  if (rank == 0) {
    fs::resize_file(paths[2], fs::file_size(paths[2]) / 2);
    std::ofstream(dir + "/step_00000040.h5.tmp") << "partial";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(!verify_checkpoint(paths[2]).ok);
  c = find_resume_checkpoint(dir, MPI_COMM_WORLD);
  CHECK(c.path == paths[1]);
  CHECK(any_contains(c.warnings, "skipping bad checkpoint " + paths[3]));
  CHECK(any_contains(c.warnings, "skipping bad checkpoint " + paths[2]));
  CHECK(any_contains(c.warnings, "step_00000040.h5.tmp"));
  CHECK_THROWS_AS(read_checkpoint(paths[2], dst.store, dst.state, MPI_COMM_WORLD), InputError);
  CHECK_THROWS_AS(read_checkpoint(dir + "/missing.h5", dst.store, dst.state, MPI_COMM_WORLD), InputError);

  // The good one still loads, exactly.
  read_checkpoint(c.path, dst.store, dst.state, MPI_COMM_WORLD);
  CHECK(mismatches(dst) == 0);

  // Nothing usable at all: an empty choice, every file named.
  if (rank == 0) fs::resize_file(paths[1], 100);
  MPI_Barrier(MPI_COMM_WORLD);
  c = find_resume_checkpoint(dir, MPI_COMM_WORLD);
  CHECK(c.path.empty());
  CHECK(any_contains(c.warnings, "no usable checkpoint"));
}

TEST_CASE("checkpoint: inconsistent blocks are refused before anything is written", "[checkpoint][mpi]") {
  const int world = test::world_size(), rank = test::world_rank();
  Mesh mesh(MPI_COMM_WORLD, 1, 1, world);
  const std::string dir = fresh_dir("tiling");
  ParamStore<float> store;
  // Every rank claims the first half only: half of the tensor would be lost.
  store.add_block("w", {4, 2}, {2, 2}, {0, 0}, InitKind::Zeros, 1, nullptr);
  store.allocate();
  std::vector<StateTensor> none;
  std::string msg;
  try {
    write_checkpoint(dir, store, none, sample_meta(1), mesh);
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("cover 4 of its 8 elements") != std::string::npos);
  CHECK(list_checkpoints(dir).empty());
  (void)rank;
}

TEST_CASE("checkpoint: a non-finite state is never written, verify and resume reject one", "[checkpoint][mpi]") {
  const int world = test::world_size(), rank = test::world_rank();
  const MeshShape sh = test::all_mesh_shapes(world).back();
  Mesh mesh(MPI_COMM_WORLD, sh.pipe, sh.data, sh.tensor);
  Model src;
  build(src, sh, rank, false, true, false);
  const std::string dir = fresh_dir("nonfinite");
  const std::string good = write_checkpoint(dir, src.store, src.state, sample_meta(10), mesh);
  auto latest = [&] {
    std::ifstream in(dir + "/LATEST");
    std::string line;
    std::getline(in, line);
    return line;
  };
  auto refused = [&](int64_t step) {  // the message of NonFiniteState, "" when the write went through
    try {
      write_checkpoint(dir, src.store, src.state, sample_meta(step), mesh);
    } catch (const NonFiniteState& e) {
      return std::string(e.what());
    }
    return std::string();
  };

  // An infinite weight on the last rank (in a block it writes): every rank throws, nothing is written.
  float* w = nullptr;
  for (const auto& p : src.store.infos())
    if (!w && p.name.find("moe.w1") != std::string::npos && p.size > 1) w = src.store.weights() + p.flat_offset + 1;
  REQUIRE(w != nullptr);
  const float saved = *w;
  if (rank == world - 1) *w = std::numeric_limits<float>::infinity();
  std::string msg = refused(20);
  INFO(msg);
  CHECK(msg.find("the parameters at step 20 are not finite (blocks.") != std::string::npos);
  CHECK(msg.find("moe.w1 [") != std::string::npos);
  CHECK(msg.find("= inf") != std::string::npos);
  CHECK(msg.find("no checkpoint written; the newest good checkpoint is " + dir + "/LATEST -> step_00000010.h5") !=
        std::string::npos);
  *w = saved;
  CHECK(list_checkpoints(dir).size() == 1);
  CHECK(!fs::exists(dir + "/step_00000020.h5.tmp"));
  CHECK(latest() == "step_00000010.h5");

  // A negative second moment (v_row, written by rank 0) is refused too; a negative first moment is not.
  Buffer<float>* v_row = nullptr;
  Buffer<float>* exp_avg = nullptr;
  for (auto& t : src.state) {
    if (!v_row && is_second_moment_state(t.name) && !t.data->empty()) v_row = t.data;
    if (!exp_avg && !is_second_moment_state(t.name) && !t.data->empty()) exp_avg = t.data;
  }
  REQUIRE(v_row != nullptr);
  REQUIRE(exp_avg != nullptr);
  const float saved_v = (*v_row)[0];
  if (rank == 0) (*v_row)[0] = -0.5f;
  msg = refused(30);
  CHECK(msg.find("the optimizer state at step 30 is not valid (") != std::string::npos);
  CHECK(msg.find("/v_row [") != std::string::npos);
  CHECK(msg.find("= -0.5, a second moment must be >= 0") != std::string::npos);
  CHECK(latest() == "step_00000010.h5");
  (*v_row)[0] = saved_v;
  if (rank == 0) (*exp_avg)[0] = -0.5f;
  CHECK(refused(40).empty());
  CHECK(latest() == "step_00000040.h5");
  CHECK(is_second_moment_state("blocks.0.attn.wq/exp_avg_sq"));
  CHECK(is_second_moment_state("blocks.0.mlp.w1/v_col"));
  CHECK(is_second_moment_state("final.ln.g/v"));
  CHECK(!is_second_moment_state("blocks.0.attn.wq/exp_avg"));

  // Files made bad after the write: verify names the tensor and the value, resume skips them.
  const std::string p50 = dir + "/step_00000050.h5", p60 = dir + "/step_00000060.h5";
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    fs::copy_file(good, p50);
    fs::copy_file(good, p60);
    const float nan = std::numeric_limits<float>::quiet_NaN(), neg = -2.0f;
    h5::File f50 = h5::File::open(p50, h5::Access::ReadWrite);
    f50.dataset("/params/blocks.0.attn.w").write_block({1, 2}, {1, 1}, &nan);
    f50.close();
    h5::File f60 = h5::File::open(p60, h5::Access::ReadWrite);
    f60.dataset("/optim/blocks.0.moe.w1/v_row").write_block({2, 1}, {1, 1}, &neg);
    f60.close();
    std::ofstream(dir + "/LATEST") << "step_00000060.h5\n";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  VerifyResult v = verify_checkpoint(p50);
  INFO(v.message);
  CHECK(!v.ok);
  CHECK(v.message.find("non-finite value: /params/blocks.0.attn.w [1, 2] = nan") != std::string::npos);
  v = verify_checkpoint(p60);
  INFO(v.message);
  CHECK(!v.ok);
  CHECK(v.message.find("negative second moment: /optim/blocks.0.moe.w1/v_row [2, 1] = -2") != std::string::npos);
  CHECK(verify_checkpoint(good).ok);
  ResumeChoice c = find_resume_checkpoint(dir, MPI_COMM_WORLD);
  CHECK(c.path == dir + "/step_00000040.h5");
  CHECK(any_contains(c.warnings, "skipping bad checkpoint " + p60));
  CHECK(any_contains(c.warnings, "skipping bad checkpoint " + p50));
}

// Written for tests/scripts/ckpt_cli.sh: $MESHMOE_TEST_TMPDIR/ckpt_cli/run/ckpt/step_00000007.h5.
// Every reader of a checkpoint the user hands in (verify, the attributes, a resume's read) answers
// each structural change of a valid file (tests/support/h5_mutate.hpp: every dataset, group and
// attribute removed, made 0-d, reshaped, retyped, set negative, huge or NaN) with its result or a
// clean error: never a crash, never another exception (docs/ARCHITECTURE.md "Principles" item 6).
// The fixed set of mutations of the fuzz target tests/fuzz/h5_readers_fuzz.cpp.
TEST_CASE("checkpoint: every structural mutation of a valid file is read or refused cleanly", "[checkpoint]") {
  if (test::world_rank() != 0) return;
  Mesh mesh(MPI_COMM_SELF, 1, 1, 1);
  const MeshShape one{1, 1, 1};
  Model src;
  build(src, one, 0, false, true, false);
  const std::string dir = test::scratch_dir() + "/meshmoe_ckpt_mutations";
  fs::remove_all(dir);
  CheckpointMeta meta = sample_meta(3);
  meta.lang_tokens = {5, 7};
  const std::string good = write_checkpoint(dir + "/ckpt", src.store, src.state, meta, mesh);
  REQUIRE(verify_checkpoint(good).ok);
  const std::string path = dir + "/mutated.h5";
  int mutated = 0, refused = 0;
  for (const test::H5Site& site : test::h5_sites(good)) {
    // Blocks 1 to 3 hold what block 0 holds: their mutations would only repeat its.
    if (site.object.find("blocks.") != std::string::npos && site.object.find("blocks.0") == std::string::npos) continue;
    for (int k = 0; k < int(test::H5Mutation::kCount); ++k) {
      const auto m = test::H5Mutation(k);
      fs::copy_file(good, path, fs::copy_options::overwrite_existing);
      INFO(site.object << (site.attribute.empty() ? "" : " attribute " + site.attribute) << ": " << test::h5_mutation_name(m));
      if (!test::h5_mutate(path, site, m)) continue;
      ++mutated;
      const VerifyResult v = verify_checkpoint(path);
      CHECK((v.ok || !v.message.empty()));
      try {
        read_checkpoint_meta(path);
      } catch (const InputError& e) {
        CHECK_THAT(std::string(e.what()), Catch::Contains(path));
      }
      Model dst;
      build(dst, one, 0, false, false, false);
      std::string refusal;
      try {
        read_checkpoint(path, dst.store, dst.state, MPI_COMM_SELF);
      } catch (const InputError& e) {
        refusal = e.what();
        ++refused;
        CHECK_THAT(refusal, Catch::Contains(path));
      }
      // What verify finds good, a resume reads unless it is another model's (verify reads the file
      // alone; it also checks the tensor counts, which a resume does not need).
      if (v.ok && !refusal.empty()) CHECK_THAT(refusal, Catch::StartsWith(kIncompatibleModel));
    }
  }
  CHECK(mutated > 300);
  CHECK(refused > mutated / 3);
  // The two of docs/user-guide.md "Faults": a 0-d parameter, a negative step.
  fs::copy_file(good, path, fs::copy_options::overwrite_existing);
  REQUIRE(test::h5_mutate(path, {test::H5Site::Dataset, "/params/final.ln.g", ""}, test::H5Mutation::Scalar));
  CHECK_FALSE(verify_checkpoint(path).ok);
  fs::copy_file(good, path, fs::copy_options::overwrite_existing);
  REQUIRE(test::h5_mutate(path, {test::H5Site::Attribute, "/", "step"}, test::H5Mutation::Negative));
  const VerifyResult negative = verify_checkpoint(path);
  CHECK_FALSE(negative.ok);
  CHECK_THAT(negative.message, Catch::Contains("step = -5: expected an integer >= 0"));
  CHECK_THROWS_AS(read_checkpoint_meta(path), InputError);
}

TEST_CASE("checkpoint: export one for the command-line test", "[.ckpt-export]") {
  const int world = test::world_size(), rank = test::world_rank();
  const MeshShape sh = test::all_mesh_shapes(world).back();
  Mesh mesh(MPI_COMM_WORLD, sh.pipe, sh.data, sh.tensor);
  Model src;
  build(src, sh, rank, false, true, true);
  CheckpointMeta m = sample_meta(7);
  m.deck = "[model]\nlayers = 4\n";
  write_checkpoint(test::scratch_dir() + "/ckpt_cli/run/ckpt", src.store, src.state, m, mesh);
}

}  // namespace meshmoe
