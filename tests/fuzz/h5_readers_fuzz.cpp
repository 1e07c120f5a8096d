// libFuzzer target for the readers of the HDF5 files a user hands in (`make fuzz`; not part of
// `make check`, whose Catch cases run a fixed set of the same mutations). Each input picks up to 4
// structural mutations (tests/support/h5_mutate.hpp: an object or attribute removed, made 0-d,
// reshaped, retyped, set negative, huge or NaN) of a valid checkpoint or dataset written by
// `meshmoe train` and `meshmoe prep` (MESHMOE_FUZZ_CKPT, MESHMOE_FUZZ_DATA; the Makefile makes
// them), then runs the readers on the result: ckpt verify, the checkpoint's attributes and logical
// tensors (export), the dataset's attributes, splits and tokenizer. Each must return or throw
// InputError (verify: report bad); anything else (another exception, a crash, a sanitizer report)
// is a bug the fuzzer stops on. Seeds: tests/fuzz/h5_seeds/ (one input per file and mutation).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "core/error.hpp"
#include "data/dataset.hpp"
#include "support/h5_mutate.hpp"

namespace {

using namespace meshmoe;
namespace fs = std::filesystem;

struct Seed {
  std::string path, scratch;
  std::vector<test::H5Site> sites;
};
Seed g_seed[2];  // 0: checkpoint, 1: dataset

Seed make_seed(const char* env, const char* name) {
  const char* p = std::getenv(env);
  if (!p) {
    std::fprintf(stderr, "h5_readers_fuzz: set %s to a valid %s (make fuzz does)\n", env, name);
    std::exit(2);
  }
  Seed s{p, (fs::temp_directory_path() / ("h5_readers_fuzz_" + std::to_string(getpid()) + "_" + name + ".h5")).string(), {}};
  s.sites = test::h5_sites(s.path);
  return s;
}

template <typename F>
void expect_clean(const char* what, F&& read) {
  try {
    read();
  } catch (const InputError& e) {
    if (std::string(e.what()).empty()) {
      std::fprintf(stderr, "%s: InputError without a message\n", what);
      std::abort();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: not an InputError: %s\n", what, e.what());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_seed[0] = make_seed("MESHMOE_FUZZ_CKPT", "checkpoint");
  g_seed[1] = make_seed("MESHMOE_FUZZ_DATA", "dataset");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Seed& seed = g_seed[data[0] & 1];
  fs::copy_file(seed.path, seed.scratch, fs::copy_options::overwrite_existing);
  // Then 3 bytes per mutation: the site (2 bytes), the mutation (1 byte).
  for (size_t at = 1; at + 3 <= size && at < 1 + 4 * 3; at += 3) {
    const test::H5Site& site = seed.sites[(size_t(data[at]) << 8 | data[at + 1]) % seed.sites.size()];
    try {
      test::h5_mutate(seed.scratch, site, test::H5Mutation(data[at + 2] % int(test::H5Mutation::kCount)));
    } catch (const std::runtime_error&) {
      // An earlier mutation removed the site: this one does nothing.
    }
  }
  if (&seed == &g_seed[0]) {
    const VerifyResult v = verify_checkpoint(seed.scratch);
    if (!v.ok && v.message.empty()) {
      std::fprintf(stderr, "ckpt verify: bad without a reason\n");
      std::abort();
    }
    expect_clean("read_checkpoint_meta", [&] { read_checkpoint_meta(seed.scratch); });
    expect_clean("read_logical_tensors", [&] { read_logical_tensors(seed.scratch); });  // export's reader
  } else {
    expect_clean("Dataset::read_info", [&] { Dataset::read_info(seed.scratch).tokenizer_object(); });
    expect_clean("Dataset::open train", [&] { Dataset::open(seed.scratch, "train"); });
    expect_clean("Dataset::open valid", [&] { Dataset::open(seed.scratch, "valid").info().tokenizer_object(); });
  }
  return 0;
}
