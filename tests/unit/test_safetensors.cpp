// The safetensors layout (src/io/safetensors.hpp) against its published specification: the 8-byte
// little-endian header size, the JSON header padded with spaces to a multiple of 8, offsets
// relative to the byte buffer, the buffer tiled without holes; the bytes compared with a header
// written out by hand; round trips bitwise (NaN payloads, signed zeros, subnormals); the refusals
// of a reader (truncated, other dtypes, holes, overlaps, bad JSON).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "../test_util.hpp"

using namespace meshmoe;

namespace {

std::string tmp_file(const std::string& stem) {
  return test::scratch_dir() + "/st_" + stem + "_" + std::to_string(static_cast<long>(getpid())) + ".safetensors";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// A file of the given JSON header (padded as the specification wants) and buffer bytes.
std::string file_of(std::string json, const std::string& buffer) {
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int b = 0; b < 8; ++b) out[size_t(b)] = char((n >> (8 * b)) & 0xFF);  // little-endian, by hand
  return out + json + buffer;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

TEST_CASE("safetensors: the bytes are the specification's layout", "[safetensors]") {
  const std::string path = tmp_file("layout");
  const std::vector<SafeTensor> tensors = {{"a.w", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"b", {1}, {-0.5f}}};
  write_safetensors(path, tensors, {{"deck", "[model]\nd_model = \"x\""}});
  const std::string want_json =
      R"({"__metadata__":{"deck":"[model]\nd_model = \"x\""},"a.w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[24,28]}})";
  std::string buffer;
  for (float v : {1.f, 2.f, 3.f, 4.f, 5.f, 6.f, -0.5f}) {
    const uint32_t u = bits(v);
    for (int b = 0; b < 4; ++b) buffer += char((u >> (8 * b)) & 0xFF);
  }
  const std::string got = slurp(path);
  CHECK(got == file_of(want_json, buffer));
  CHECK((got.size() - buffer.size()) % 8 == 0);  // the buffer starts 8-byte aligned
  CHECK(is_safetensors_file(path));
  std::remove(path.c_str());
}

TEST_CASE("safetensors: round trip bitwise, metadata escapes, empty tensors", "[safetensors]") {
  const std::string path = tmp_file("roundtrip");
  std::vector<float> odd = {std::numeric_limits<float>::quiet_NaN(), -0.0f, std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::infinity(), 1e-38f, 3.25f};
  uint32_t payload = 0x7FC12345;
  std::memcpy(&odd[0], &payload, 4);
  const std::vector<SafeTensor> tensors = {{"blocks.10.moe.router/selection_bias", {6}, odd},
                                           {"empty", {0, 4}, {}},
                                           {"m", {2, 1, 2}, {1, 2, 3, 4}}};
  const std::map<std::string, std::string> meta = {{"quote\"back\\slash", "tab\there\nline \x01 \xc3\xa9"}, {"e", ""}};
  write_safetensors(path, tensors, meta);
  const SafeTensorsFile f = read_safetensors(path);
  REQUIRE(f.tensors.size() == 3);
  CHECK(f.metadata == meta);
  for (const SafeTensor& t : tensors) {
    const SafeTensor* r = f.find(t.name);
    REQUIRE(r != nullptr);
    CHECK(r->shape == t.shape);
    REQUIRE(r->data.size() == t.data.size());
    for (size_t i = 0; i < t.data.size(); ++i) CHECK(bits(r->data[i]) == bits(t.data[i]));
  }
  CHECK_THROWS_AS(write_safetensors(path, {{"x", {2}, {1}}}, {}), Error);            // 1 value for [2]
  CHECK_THROWS_AS(write_safetensors(path, {{"x", {1}, {1}}, {"x", {1}, {2}}}, {}), Error);  // a name twice
  std::remove(path.c_str());
}

TEST_CASE("safetensors: a reader refuses what the specification does not allow", "[safetensors]") {
  const std::string path = tmp_file("bad");
  const std::string four(4, '\0'), eight(8, '\0');
  auto refused = [&](const std::string& bytes, const std::string& why) {
    spit(path, bytes);
    try {
      read_safetensors(path);
      FAIL("accepted: " << why);
    } catch (const InputError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(why) != std::string::npos);
    }
  };
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  spit(path, file_of(ok, eight));
  CHECK(read_safetensors(path).tensors.size() == 1);
  refused(file_of(ok, four), "do not hold");                                       // truncated buffer
  refused(file_of(ok, eight + four), "bytes no tensor names");                     // bytes left over
  refused(file_of(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", four), "F32 tensors only");
  refused(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight), "hole");
  refused(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                  four), "hole or overlap");
  refused(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", eight), "not valid JSON");
  refused(file_of(R"({"a":{"dtype":"F32","shape":[2]}})", eight), "lacks dtype, shape or data_offsets");
  refused(std::string("\x10\0\0\0\0\0\0\0{", 9), "does not fit the file");
  refused(std::string(5, '\0'), "shorter than");
  spit(path, std::string("\x89HDF\r\n\x1a\n", 8) + std::string(64, '\0'));
  CHECK_FALSE(is_safetensors_file(path));
  std::remove(path.c_str());
}
