#include "mesh/agree.hpp"

#include <unistd.h>

#include <climits>

#include "core/error.hpp"
#include "mesh/comm.hpp"

namespace meshmoe {

std::string broadcast_string(std::string s, int root, MPI_Comm comm) {
  return broadcast_sized(std::move(s), [&](void* p, size_t n) {
    if (n > size_t(INT_MAX)) throw Error("broadcast_string: " + std::to_string(n) + " bytes exceed one MPI message");
    MPI_Bcast(p, int(n), MPI_BYTE, root, comm);
  });
}

std::string first_error(const std::string& error, MPI_Comm comm) {
  int me = 0, size = 1;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &size);
  int mine = error.empty() ? size : me, first = size;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return "";
  return broadcast_string(me == first ? error : "", first, comm);
}

std::string host_name() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

std::string rank_and_host() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return "rank " + std::to_string(rank) + " on " + host_name();
}

void throw_agreed_input_error(const std::string& mine, MPI_Comm comm) {
  // Did every rank fail alike? Then the message needs no rank (e.g. a typo in data.path).
  int failed = mine.empty() ? 0 : 1, failed_all = 0, failed_any = 0;
  MPI_Allreduce(&failed, &failed_all, 1, MPI_INT, MPI_MIN, comm);
  MPI_Allreduce(&failed, &failed_any, 1, MPI_INT, MPI_MAX, comm);
  if (!failed_any) return;
  const std::string tagged = failed_all || mine.empty() ? mine : rank_and_host() + ": " + mine;
  throw InputError(first_error(tagged, comm));
}

}  // namespace meshmoe
