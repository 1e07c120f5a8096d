// Tests of the HDF5 layer (src/io/h5.hpp): serial round trips of every element type and attribute
// kind, HDF5's own text in our errors, extendible series, and collective sharded I/O with uneven
// (and empty) blocks, resharded read-back, Fletcher32 chunks, and sharded == serial files.
// All comparisons are exact (bitwise for floats): I/O must not change a single bit.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "io/h5.hpp"
#include "../test_util.hpp"
#include "../support/h5_support.hpp"

using namespace meshmoe;
using h5::Dims;

namespace {

// A file name in the scratch dir for one process (serial tests run on rank 0 only).
std::string tmp_file(const std::string& stem) {
  return test::scratch_dir() + "/h5_" + stem + "_" + std::to_string(static_cast<long>(getpid())) + ".h5";
}
// The same name on every rank (collective).
std::string shared_tmp_file(const std::string& stem) {
  long pid = static_cast<long>(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);  // rank 0's pid
  return test::scratch_dir() + "/h5_" + stem + "_np" + std::to_string(test::world_size()) + "_" +
         std::to_string(pid) + ".h5";
}

template <typename T>
std::vector<T> pattern(int64_t n, T scale, T bias) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<T>(static_cast<T>(i) * scale + bias);
  return v;
}

template <typename T>
void round_trip(h5::File& f, const std::string& name, const std::vector<T>& v, const Dims& shape) {
  f.write(name, v, shape);
  h5::Dataset d = f.dataset(name);
  CHECK(d.shape() == shape);
  CHECK(d.type_size() == sizeof(T));
  std::vector<T> back = f.read<T>(name);
  REQUIRE(back.size() == v.size());
  CHECK(std::memcmp(back.data(), v.data(), v.size() * sizeof(T)) == 0);  // bitwise
}

// Value of element (i, j) of the logical test arrays; exact in float and double.
float fval(int64_t i, int64_t j) { return static_cast<float>(i) * 64.0f + static_cast<float>(j) + 0.25f; }
// int64 values beyond 2^53 so that a pass through double would show.
int64_t ival(int64_t i) { return (int64_t{1} << 60) + i * 1000003 - 7; }

// Uneven row blocks over the ranks of the job: rank p holds 2p+1 rows, except that with more than
// one rank, rank 1 holds none (an empty block that is not the last one).
std::pair<int64_t, int64_t> uneven_rows(int np, int p, int64_t* total) {
  int64_t off = 0, mine = 0, mine_off = 0;
  for (int q = 0; q < np; ++q) {
    int64_t c = (np > 1 && q == 1) ? 0 : 2 * q + 1;
    if (q == p) mine_off = off, mine = c;
    off += c;
  }
  *total = off;
  return {mine_off, mine};
}

}  // namespace

TEST_CASE("h5: serial round trip of every element type", "[h5]") {
  if (test::world_rank() != 0) return;  // serial file: one process
  std::string path = tmp_file("types");
  {
    h5::File f = h5::File::create(path);
    Dims s{3, 5};
    round_trip<float>(f, "f32", {1.5f, -0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
                                 std::nanf(""), INFINITY, -INFINITY, 1e-30f, 3.14159274f, 2, 3, 4, 5, 6, 7},
                      s);
    round_trip<double>(f, "f64", pattern<double>(15, 0.1, -1e300), s);
    round_trip<int32_t>(f, "i32", pattern<int32_t>(15, -1000000, std::numeric_limits<int32_t>::max()), s);
    round_trip<int64_t>(f, "i64", pattern<int64_t>(15, (int64_t{1} << 55) + 1, std::numeric_limits<int64_t>::min()), s);
    round_trip<uint16_t>(f, "u16", pattern<uint16_t>(15, 4369, 0), s);
    round_trip<uint32_t>(f, "u32", pattern<uint32_t>(15, 286331153u, 1), s);
    round_trip<uint8_t>(f, "u8", pattern<uint8_t>(15, 17, 0), s);
    round_trip<float>(f, "deep/er/scalar3d", pattern<float>(24, 0.5f, 1.0f), Dims{2, 3, 4});
    round_trip<float>(f, "empty", std::vector<float>{}, Dims{0, 4});
    // Strings: scalar (fixed length), arrays (variable length), empty and non-ASCII.
    f.write_string("text", "line 1\nline \"2\" = 'x'\n");
    f.write_string("empty_text", "");
    f.write_strings("names", {"alpha", "", "βeta ✓", std::string(300, 'z')});
    f.write_strings("no_names", {});
  }
  h5::File f = h5::File::open(path);
  CHECK(f.read<uint8_t>("u8")[14] == 238);
  CHECK(test::read_string(f, "text") == "line 1\nline \"2\" = 'x'\n");
  CHECK(test::read_string(f, "empty_text").empty());
  CHECK(f.read_strings("names") == std::vector<std::string>{"alpha", "", "βeta ✓", std::string(300, 'z')});
  CHECK(f.read_strings("no_names").empty());
  // HDF5 converts between numeric types on read (int32 -> double here): documented behaviour.
  CHECK(f.read<double>("i32")[0] == static_cast<double>(std::numeric_limits<int32_t>::max()));
  std::remove(path.c_str());
}

TEST_CASE("h5: attributes on files, groups and datasets", "[h5]") {
  if (test::world_rank() != 0) return;
  std::string path = tmp_file("attrs");
  {
    h5::File f = h5::File::create(path);
    f.set_attr("title", std::string("meshmoe run"));
    f.set_attr("seed", int64_t{1234567890123});
    f.set_attr("lr", 3e-4);
    f.set_attr("shape", std::vector<int64_t>{4, -2, 8});
    h5::Group g = f.create_group("moe/layer1");
    g.set_attr("experts", 8);  // int -> stored as int64
    g.set_attr("capacity", std::vector<float>{1.25f, 2.0f});
    g.set_attr("units", "1");
    h5::Dataset d = g.write<float>("w", {1, 2, 3, 4}, {2, 2});
    d.set_attr("units", std::string("nats/token"));
    d.set_attr("axes", std::vector<uint8_t>{0, 255});
    d.set_attr("units", std::string("s"));  // replaces
    d.set_attr("count", uint32_t{7});
  }
  h5::File f = h5::File::open(path);
  CHECK(f.attr<std::string>("title") == "meshmoe run");
  CHECK(f.attr<int64_t>("seed") == 1234567890123);
  CHECK(f.attr<double>("lr") == 3e-4);
  CHECK(f.attr<std::vector<int64_t>>("shape") == std::vector<int64_t>{4, -2, 8});
  CHECK(f.has_attr("lr"));
  CHECK_FALSE(f.has_attr("nope"));
  CHECK(f.attr_names() == std::vector<std::string>{"lr", "seed", "shape", "title"});
  h5::Group g = f.group("moe/layer1");
  CHECK(g.path() == "/moe/layer1");
  CHECK(g.attr<int64_t>("experts") == 8);
  CHECK(g.attr<std::vector<float>>("capacity") == std::vector<float>{1.25f, 2.0f});
  CHECK(g.attr<std::string>("units") == "1");
  h5::Dataset d = f.dataset("/moe/layer1/w");
  CHECK(d.attr<std::string>("units") == "s");
  CHECK(d.attr<std::vector<uint8_t>>("axes") == std::vector<uint8_t>{0, 255});
  CHECK(d.attr<uint32_t>("count") == 7);
  CHECK(d.attr<double>("count") == 7.0);
  CHECK_THROWS_WITH(d.attr<int64_t>("axes"), Catch::Contains("is an array"));
  CHECK_THROWS_WITH(d.attr<double>("missing"), Catch::Contains("H5Aopen") && Catch::Contains("missing"));
  std::remove(path.c_str());
}

TEST_CASE("h5: groups, paths and existence", "[h5]") {
  if (test::world_rank() != 0) return;
  std::string path = tmp_file("groups");
  h5::File f = h5::File::create(path);
  h5::Group g = f.create_group("a/b/c");
  CHECK(g.path() == "/a/b/c");
  CHECK(f.create_group("a/b").path() == "/a/b");  // existing: opened
  g.write<int32_t>("x", {1, 2});
  CHECK(f.exists("a"));
  CHECK(f.exists("/a/b/c/x"));
  CHECK(f.group("a").exists("b/c"));
  CHECK_FALSE(f.exists("a/nope/c"));
  CHECK_FALSE(f.exists("a/b/c/x/y"));  // through a dataset
  CHECK(f.is_group("a/b"));
  CHECK(f.is_dataset("a/b/c/x"));
  CHECK_FALSE(f.is_dataset("a/b"));
  CHECK_FALSE(f.is_dataset("zzz"));
  f.write<float>("a/d", {1});
  CHECK(f.group("a").children() == std::vector<std::string>{"b", "d"});
  f.remove("a/d");
  CHECK_FALSE(f.exists("a/d"));
  std::remove(path.c_str());
}

TEST_CASE("h5: errors carry HDF5's message and our context", "[h5]") {
  if (test::world_rank() != 0) return;
  std::string missing = test::scratch_dir() + "/no_such_dir_meshmoe/missing.h5";
  try {
    h5::File::open(missing);
    FAIL("opening a missing file did not throw");
  } catch (const Error& e) {
    std::string m = e.what();
    INFO(m);
    CHECK(m.find(missing) != std::string::npos);  // our context
    CHECK(m.find("H5Fopen") != std::string::npos);  // HDF5's failing function
    CHECK(m.find("unable to open file") != std::string::npos);  // HDF5's description
  }
  std::string path = tmp_file("errors");
  h5::File f = h5::File::create(path);
  f.write<float>("grp/x", {1, 2, 3});
  try {
    f.read<float>("grp/y");
    FAIL("reading a missing dataset did not throw");
  } catch (const Error& e) {
    std::string m = e.what();
    INFO(m);
    CHECK(m.find(path) != std::string::npos);
    CHECK(m.find("grp/y") != std::string::npos);
    CHECK(m.find("H5Dopen2") != std::string::npos);
    CHECK(m.find("doesn't exist") != std::string::npos);  // HDF5: "object 'y' doesn't exist"
  }
  // Creating an existing dataset: HDF5's "already exists".
  CHECK_THROWS_WITH(f.write<float>("grp/x", {1}), Catch::Contains("already exists") && Catch::Contains("grp/x"));
  // Our own checks: out-of-range blocks and wrong sizes.
  float buf[4] = {};
  CHECK_THROWS_WITH(f.dataset("grp/x").read_block(Dims{2}, Dims{2}, buf), Catch::Contains("outside shape [3]"));
  CHECK_THROWS_WITH(f.dataset("grp/x").write(std::vector<float>{1, 2}), Catch::Contains("2 elements"));
  CHECK_THROWS_WITH(f.write<float>("z", {1, 2, 3}, Dims{2, 2}), Catch::Contains("do not fill"));
  // After a failure the error stack is clean: the next call works and reports nothing stale.
  CHECK(f.read<float>("grp/x") == std::vector<float>{1, 2, 3});
  CHECK(h5::error_stack().empty());
  std::remove(path.c_str());
}

TEST_CASE("h5: extendible 1-D and 2-D series", "[h5]") {
  if (test::world_rank() != 0) return;
  std::string path = tmp_file("series");
  {
    h5::File f = h5::File::create(path);
    h5::Dataset s1 = f.create_series<double>("loss", {}, 4);
    h5::Dataset s2 = f.create_series<float>("moe/l0/load", {3}, 2);
    for (int i = 0; i < 10; ++i) {
      s1.append(std::vector<double>{1.0 / (i + 1)});
      s2.append(std::vector<float>{float(i), float(i) + 0.5f, -float(i)});
    }
    CHECK(s1.shape() == Dims{10});
    CHECK(s1.max_dims() == Dims{-1});
    CHECK(s2.shape() == Dims{10, 3});
    CHECK(s2.max_dims() == Dims{-1, 3});
    CHECK_THROWS_WITH(s2.append(std::vector<float>{1, 2}), Catch::Contains("a row has 3"));
    s1.resize({7});  // truncate (resume)
    s1.append(std::vector<double>{42});
    f.flush();
  }
  h5::File f = h5::File::open(path, h5::Access::ReadWrite);
  auto l = f.read<double>("loss");
  REQUIRE(l.size() == 8);
  for (int i = 0; i < 7; ++i) CHECK(l[i] == 1.0 / (i + 1));
  CHECK(l[7] == 42);
  auto m = f.read<float>("moe/l0/load");
  REQUIRE(m.size() == 30);
  for (int i = 0; i < 10; ++i) {
    CHECK(m[3 * i] == float(i));
    CHECK(m[3 * i + 1] == float(i) + 0.5f);
    CHECK(m[3 * i + 2] == -float(i));
  }
  f.dataset("loss").append(std::vector<double>{43});  // appending after reopen
  CHECK(f.read<double>("loss").back() == 43);
  std::remove(path.c_str());
}

TEST_CASE("h5: Fletcher32 detects a corrupted chunk", "[h5]") {
  if (test::world_rank() != 0) return;
  std::string path = tmp_file("fletcher");
  std::vector<float> v = pattern<float>(64, 1.0f, 0.0f);
  haddr_t addr = 0;
  {
    h5::File f = h5::File::create(path);
    h5::CreateOptions opt;
    opt.chunk = {8, 8};
    opt.fletcher32 = true;
    h5::Dataset d = f.write("x", v, {8, 8}, opt);
    f.flush();
    hsize_t off[2] = {0, 0}, size = 0;
    unsigned mask = 0;
    REQUIRE(H5Dget_chunk_info_by_coord(d.id(), off, &mask, &addr, &size) >= 0);
    CHECK(size == 64 * 4 + 4);  // data + 4-byte checksum
  }
  CHECK(h5::File::open(path).read<float>("x") == v);
  {  // flip one byte of the stored chunk
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(addr + 17));
    char c = 0;
    io.read(&c, 1);
    c ^= 0x40;
    io.seekp(static_cast<std::streamoff>(addr + 17));
    io.write(&c, 1);
  }
  CHECK_THROWS_WITH(h5::File::open(path).read<float>("x"), Catch::Contains("H5Dread"));
  std::remove(path.c_str());
}

TEST_CASE("h5: even_split", "[h5]") {
  int64_t total = 0;
  for (int p = 0; p < 3; ++p) {
    auto [o, c] = test::even_split(10, 3, p);
    CHECK(o == total);
    CHECK(c == (p == 0 ? 4 : 3));
    total += c;
  }
  CHECK(test::even_split(2, 4, 3) == std::pair<int64_t, int64_t>{2, 0});
}

namespace {
// Writes the logical arrays X [rows, 64] float (fval) and I [rows] int64 (ival) sharded by rows
// with uneven blocks (one empty) from every rank, plus attributes and a string; returns the
// number of rows. With `fletcher32`, both datasets are chunked and checksummed, the chunks of X
// [3, 16] straddling the rank blocks.
int64_t write_sharded_arrays(const std::string& path, bool fletcher32) {
  int np = test::world_size(), me = test::world_rank();
  int64_t rows = 0;
  auto [r0, nr] = uneven_rows(np, me, &rows);
  const int64_t cols = 64;
  std::vector<float> x(static_cast<size_t>(nr * cols));
  std::vector<int64_t> ix(static_cast<size_t>(nr));
  for (int64_t i = 0; i < nr; ++i) {
    for (int64_t j = 0; j < cols; ++j) x[static_cast<size_t>(i * cols + j)] = fval(r0 + i, j);
    ix[static_cast<size_t>(i)] = ival(r0 + i);
  }
  h5::CreateOptions ox, oi;
  if (fletcher32) {
    ox.chunk = {3, 16};
    ox.fletcher32 = oi.fletcher32 = true;  // oi: default chunking
  }
  h5::File f = h5::File::create(path, MPI_COMM_WORLD);
  f.set_attr("writer_ranks", int64_t{np});
  h5::Dataset dx = test::write_sharded(f, "data/x", {rows, cols}, {r0, 0}, {nr, cols}, x.data(), ox);
  CHECK(h5::last_io_mode() != H5D_MPIO_NO_COLLECTIVE);  // stayed one collective write
  dx.set_attr("units", std::string("1"));
  dx.set_attr("formula", std::string("x[i,j] = 64 i + j + 0.25"));
  test::write_sharded(f, "data/ids", {rows}, {r0}, {nr}, ix.data(), oi);
  CHECK(h5::last_io_mode() != H5D_MPIO_NO_COLLECTIVE);
  f.write_string("deck", "[model]\nd_model = 64\n");
  f.flush();
  return rows;
}

void check_sharded_arrays(const std::string& path, int64_t rows) {
  int np = test::world_size(), me = test::world_rank();
  const int64_t cols = 64;
  h5::File f = h5::File::open(path, MPI_COMM_WORLD);
  REQUIRE(f.dataset("data/x").shape() == Dims{rows, cols});
  // Resharded read 1: columns split evenly, every row.
  auto [c0, nc] = test::even_split(cols, np, me);
  std::vector<float> xc(static_cast<size_t>(rows * nc), -1.0f);
  test::read_sharded(f, "data/x", {0, c0}, {rows, nc}, xc.data());
  CHECK(h5::last_io_mode() != H5D_MPIO_NO_COLLECTIVE);
  int bad = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < nc; ++j) bad += xc[static_cast<size_t>(i * nc + j)] != fval(i, c0 + j);
  CHECK(bad == 0);
  // Resharded read 2: rows split evenly in reverse rank order; the int64 array too.
  auto [q0, nq] = test::even_split(rows, np, np - 1 - me);
  std::vector<float> xr(static_cast<size_t>(nq * cols));
  std::vector<int64_t> ir(static_cast<size_t>(nq));
  test::read_sharded(f, "data/x", {q0, 0}, {nq, cols}, xr.data());
  test::read_sharded(f, "data/ids", {q0}, {nq}, ir.data());
  bad = 0;
  for (int64_t i = 0; i < nq; ++i) {
    bad += ir[static_cast<size_t>(i)] != ival(q0 + i);
    for (int64_t j = 0; j < cols; ++j) bad += xr[static_cast<size_t>(i * cols + j)] != fval(q0 + i, j);
  }
  CHECK(bad == 0);
  CHECK(f.attr<int64_t>("writer_ranks") == np);
  CHECK(f.dataset("data/x").attr<std::string>("units") == "1");
  CHECK(test::read_string(f, "deck") == "[model]\nd_model = 64\n");
}
}  // namespace

TEST_CASE("h5: collective sharded write with uneven and empty blocks, resharded read", "[h5][mpi]") {
  std::string path = shared_tmp_file("sharded");
  int64_t rows = write_sharded_arrays(path, false);
  check_sharded_arrays(path, rows);
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) std::remove(path.c_str());
}

// Parallel HDF5 >= 1.10.2 writes filtered (chunked) datasets, with collective I/O only.
TEST_CASE("h5: collective sharded write, chunked with Fletcher32", "[h5][mpi]") {
  std::string path = shared_tmp_file("sharded_f32");
  int64_t rows = write_sharded_arrays(path, true);
  check_sharded_arrays(path, rows);
  if (test::world_rank() == 0) {  // the filter is really on both datasets
    h5::File f = h5::File::open(path);
    for (std::string name : {"data/x", "data/ids"}) {
      h5::Dataset d = f.dataset(name);
      h5::Handle dcpl(H5Dget_create_plist(d.id()));
      REQUIRE(dcpl.valid());
      CHECK(H5Pget_layout(dcpl.id()) == H5D_CHUNKED);
      REQUIRE(H5Pget_nfilters(dcpl.id()) == 1);
      unsigned flags = 0, cd[1];
      size_t ncd = 0;
      CHECK(H5Pget_filter2(dcpl.id(), 0, &flags, &ncd, cd, 0, nullptr, nullptr) == H5Z_FILTER_FLETCHER32);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) std::remove(path.c_str());
}

TEST_CASE("h5: a file written sharded equals the serial write of the same array", "[h5][mpi]") {
  std::string sharded = shared_tmp_file("eq_sharded"), serial = shared_tmp_file("eq_serial");
  int64_t rows = write_sharded_arrays(sharded, false);
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) {
    std::vector<float> x(static_cast<size_t>(rows * 64));
    std::vector<int64_t> ix(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      ix[static_cast<size_t>(i)] = ival(i);
      for (int64_t j = 0; j < 64; ++j) x[static_cast<size_t>(i * 64 + j)] = fval(i, j);
    }
    {
      h5::File f = h5::File::create(serial);
      f.write("data/x", x, {rows, 64});
      f.write("data/ids", ix);
    }
    h5::File a = h5::File::open(sharded), b = h5::File::open(serial);
    for (std::string name : {"data/x", "data/ids"}) {
      h5::Dataset da = a.dataset(name), db = b.dataset(name);
      CHECK(da.shape() == db.shape());
      CHECK(da.type_class() == db.type_class());
      CHECK(da.type_size() == db.type_size());
    }
    auto xa = a.read<float>("data/x"), xb = b.read<float>("data/x");
    CHECK(xa.size() == xb.size());
    CHECK(std::memcmp(xa.data(), xb.data(), xa.size() * 4) == 0);
    CHECK(a.read<int64_t>("data/ids") == b.read<int64_t>("data/ids"));
    std::remove(serial.c_str());
    std::remove(sharded.c_str());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("h5: parallel file, whole-dataset writes, series and attributes from every rank", "[h5][mpi]") {
  std::string path = shared_tmp_file("par_misc");
  int np = test::world_size();
  {
    h5::File f = h5::File::create(path, MPI_COMM_WORLD);
    h5::Group g = f.create_group("meta/mesh");
    g.set_attr("axes", std::vector<int32_t>{1, np, 1});
    g.set_attr("name", std::string("data"));
    f.write<double>("meta/w", {1.5, 2.5, 3.5});  // every rank passes the same data
    h5::Dataset s = f.create_series<int64_t>("meta/steps", {2}, 8);
    for (int64_t i = 0; i < 5; ++i) s.append(std::vector<int64_t>{i, 10 * i});
    f.flush();
  }
  h5::File f = h5::File::open(path, MPI_COMM_WORLD);
  CHECK(f.group("meta/mesh").attr<std::vector<int32_t>>("axes") == std::vector<int32_t>{1, np, 1});
  CHECK(f.group("meta/mesh").attr<std::string>("name") == "data");
  CHECK(f.read<double>("meta/w") == std::vector<double>{1.5, 2.5, 3.5});
  CHECK(f.read<int64_t>("meta/steps") == std::vector<int64_t>{0, 0, 1, 10, 2, 20, 3, 30, 4, 40});
  f.close();
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) std::remove(path.c_str());
}

TEST_CASE("h5: a dataset outliving its parallel File handle keeps the file usable", "[h5][mpi]") {
  std::string path = shared_tmp_file("outlive");
  std::vector<float> v{1, 2, 3, 4};
  h5::Dataset d;
  {
    h5::File f = h5::File::create(path, MPI_COMM_WORLD);
    d = f.create_dataset<float>("a", {4});
  }
  d.write(v);  // rank 0's data is written
  d = h5::Dataset();  // the file closes here
  CHECK(h5::File::open(path, MPI_COMM_WORLD).read<float>("a") == v);
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) std::remove(path.c_str());
}

// Hidden from normal runs; tests/scripts/h5_sharded_readback.sh runs it on 4 ranks and checks the
// file with h5py (tests/scripts/h5_readback.py).
TEST_CASE("h5: export a sharded file for the h5py read-back", "[.h5-export]") {
  write_sharded_arrays(test::scratch_dir() + "/sharded.h5", false);
  write_sharded_arrays(test::scratch_dir() + "/sharded_fletcher32.h5", true);
}
