// Tests of the files a command writes (src/io/output_file.hpp): an output that is one of the inputs
// (through symbolic and hard links) or a file of another kind is refused, a missing directory is
// not created, a ReplacingFile leaves the old file until commit().
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../test_util.hpp"
#include "core/error.hpp"
#include "io/h5.hpp"
#include "io/output_file.hpp"

using namespace meshmoe;
namespace fs = std::filesystem;

namespace {
std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_all(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }
void h5_with_creator(const std::string& path, const std::string& by) {
  h5::File f = h5::File::create(path);
  if (!by.empty()) f.set_attr("created_by", by);
  f.close();
}
}  // namespace

TEST_CASE("check_output_path: inputs, links, other kinds of file, missing directories", "[io]") {
  const std::string dir = test::scratch_dir() + "/output_file_" + std::to_string(long(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir + "/sub");
  const std::string input = dir + "/input.h5", eval = dir + "/old_eval.h5", metrics = dir + "/metrics.h5";
  h5_with_creator(input, "meshmoe prep text");
  h5_with_creator(eval, "meshmoe eval abc");
  h5_with_creator(metrics, "");
  write_all(dir + "/notes.txt", "notes\n");
  fs::create_symlink(input, dir + "/link.h5");
  fs::create_hard_link(input, dir + "/hard.h5");
  fs::create_symlink(dir + "/nowhere", dir + "/dangling.h5");
  const OutputRules rules{"eval", "-o", {input}, {"meshmoe eval"}};

  CHECK(same_file(input, dir + "/link.h5"));
  CHECK(same_file(input, dir + "/hard.h5"));
  CHECK(same_file(input, dir + "/sub/../input.h5"));
  CHECK_FALSE(same_file(input, eval));
  CHECK_FALSE(same_file(input, dir + "/absent.h5"));
  for (const std::string& out : {input, dir + "/link.h5", dir + "/hard.h5", dir + "/sub/../input.h5"}) {
    INFO(out);
    CHECK_THROWS_WITH(check_output_path(out, rules), Catch::Contains("is the input " + input + ": refusing to overwrite it"));
  }
  CHECK_THROWS_WITH(check_output_path(metrics, rules), Catch::Contains("an HDF5 file of another kind"));
  CHECK_THROWS_WITH(check_output_path(dir + "/notes.txt", rules), Catch::Contains("not an HDF5 file"));
  CHECK_THROWS_WITH(check_output_path(dir + "/dangling.h5", rules), Catch::Contains("a symbolic link to nothing"));
  CHECK_THROWS_WITH(check_output_path(dir + "/sub", rules), Catch::Contains("not a regular file"));
  CHECK_THROWS_WITH(check_output_path(dir + "/input.h5", {"prep", "-o", {}, {"meshmoe eval"}}),
                    Catch::Contains("a file of meshmoe prep text"));
  const std::string missing = dir + "/no/such";
  CHECK_THROWS_WITH(check_output_path(missing + "/x.h5", rules),
                    Catch::Contains("eval: the output file " + missing + "/x.h5: cannot create it: its directory " + missing +
                                    " does not exist"));
  CHECK_FALSE(fs::exists(dir + "/no"));
  CHECK_NOTHROW(check_output_path(eval, rules));
  CHECK_NOTHROW(check_output_path(dir + "/new.h5", rules));
  CHECK_NOTHROW(check_output_path(input, {"prep", "-o", {}, {"meshmoe prep"}}));
  CHECK_NOTHROW(check_output_path(dir + "/notes.txt", {"prep", "-o", {}, {}}));  // no kind asked
  // A text output (eval --write-text): an existing text file is replaced, a binary one never.
  const OutputRules text{"eval", "--write-text", {input}, {}, true};
  CHECK_NOTHROW(check_output_path(dir + "/notes.txt", text));
  CHECK_NOTHROW(check_output_path(dir + "/new.hyp", text));
  CHECK_THROWS_WITH(check_output_path(eval, text), Catch::Contains("old_eval.h5 exists and does not hold text"));
  CHECK_THROWS_WITH(check_output_path(dir + "/hard.h5", text), Catch::Contains("is the input"));
  fs::remove_all(dir);
}

TEST_CASE("ReplacingFile: the old file stays until commit; uncommitted, the temporary goes", "[io]") {
  const std::string dir = test::scratch_dir() + "/replacing_" + std::to_string(long(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = dir + "/out.txt";
  write_all(path, "old");
  {
    ReplacingFile f(path);
    CHECK(fs::path(f.temporary()).parent_path() == fs::path(path).parent_path());
    write_all(f.temporary(), "half");
    CHECK(read_all(path) == "old");
  }  // an error or a stop before commit
  CHECK(read_all(path) == "old");
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}) == 1);
  {
    ReplacingFile f(path);
    write_all(f.temporary(), "new");
    f.commit();
    CHECK(read_all(path) == "new");
  }
  CHECK(read_all(path) == "new");
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}) == 1);
  fs::remove_all(dir);
}
