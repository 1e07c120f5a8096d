// MPI-aware Catch2 (v2) runner. Every rank runs the same test cases in the same order; after each
// test case the ranks agree (MPI_Allreduce) on whether it failed anywhere, so rank 0's count is
// the truth for the whole job. Rank 0 reports to stdout; the other ranks report to
// $MESHMOE_TEST_LOGDIR/rank<r>.log (or discard their output when unset) and name failures on stderr.
// The last line rank 0 prints is "meshmoe_tests np=<N>: <P> passed, <F> failed".
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tensor/host_threads.hpp"

namespace {
int g_rank = 0, g_size = 1, g_passed = 0, g_failed = 0;

struct MpiListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseEnded(Catch::TestCaseStats const& stats) override {
    int failed_here = stats.totals.assertions.failed > 0 ? 1 : 0, failed_any = 0;
    MPI_Allreduce(&failed_here, &failed_any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (failed_here && g_rank != 0)
      std::fprintf(stderr, "rank %d: FAILED: %s\n", g_rank, stats.testInfo.name.c_str());
    (failed_any ? g_failed : g_passed) += 1;
  }
};
}  // namespace
CATCH_REGISTER_LISTENER(MpiListener)

int main(int argc, char** argv) {
  meshmoe::ensure_openblas_thread_timeout(argv);  // the [threads] case checks its effect
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) {
    MPI_Finalize();
    return rc;
  }
  if (g_rank != 0) {
    const char* dir = std::getenv("MESHMOE_TEST_LOGDIR");
    session.configData().outputFilename = dir ? std::string(dir) + "/rank" + std::to_string(g_rank) + ".log" : "%debug";
    if (!dir) session.configData().outputFilename = "/dev/null";
  }
  session.run();
  if (g_rank == 0) std::printf("meshmoe_tests np=%d: %d passed, %d failed\n", g_size, g_passed, g_failed);
  MPI_Finalize();
  return g_failed == 0 ? 0 : 1;
}
