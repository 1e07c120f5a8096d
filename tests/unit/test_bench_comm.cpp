// bench-comm pieces: the --sizes parser and the NCCL-tests bus bandwidth factors. The whole
// command (timing, HDF5 output, exit codes) is checked by tests/scripts/bench_comm.sh.
#include <catch2/catch.hpp>

#include "core/error.hpp"
#include "app/bench_comm.hpp"

using namespace meshmoe;

TEST_CASE("bench-comm: --sizes accepts bytes with K/M/G suffixes", "[bench_comm]") {
  CHECK(parse_sizes("1024") == std::vector<int64_t>{1024});
  CHECK(parse_sizes("1K,64k,1M,1g") == std::vector<int64_t>{1024, 65536, 1048576, int64_t(1) << 30});
  CHECK(parse_sizes(" 4KiB , 2MiB,12") == std::vector<int64_t>{4096, 2097152, 12});
  // Default: powers of 4 from 1 KiB to 16 MiB.
  CHECK(default_sizes() == std::vector<int64_t>{1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216});
}

TEST_CASE("bench-comm: --sizes rejects what is not a float-sized byte count", "[bench_comm]") {
  for (const char* bad : {"", "K", "1X", "-4", "0", "1001", "4,,8", "2G", "1025M", "1.5K", "0x10", "9999999999999"})
    CHECK_THROWS_AS(parse_sizes(bad), InputError);
  CHECK_THROWS_WITH(parse_sizes("1K,64Q"), Catch::Contains("'64Q'"));
}

TEST_CASE("bench-comm: bus bandwidth factors", "[bench_comm]") {
  // NCCL-tests PERFORMANCE.md: all_reduce 2(n-1)/n, all_gather and all_to_all (n-1)/n, send/recv 1.
  CHECK(bus_factor("all_reduce", 4) == 1.5);
  CHECK(bus_factor("all_to_all", 4) == 0.75);
  CHECK(bus_factor("all_gather", 2) == 0.5);
  CHECK(bus_factor("permute", 8) == 1.0);
  CHECK(bus_factor("all_reduce", 1) == 0.0);
  CHECK_THROWS_AS(bus_factor("broadcast", 2), InputError);
  CHECK(bench_ops() == std::vector<std::string>{"all_reduce", "all_to_all", "all_gather", "permute"});
}
