#include "mesh/agree.hpp"

#include <unistd.h>

#include <climits>

#include <algorithm>
#include <cstdint>

#include "core/error.hpp"
#include "core/hash.hpp"
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

namespace {

std::string joined(const std::vector<std::string>& lines) {
  std::string all;
  for (const std::string& l : lines) all += l + '\n';
  return all;
}

// Line i quoted, or "nothing" past the end.
std::string quoted(const std::vector<std::string>& lines, size_t i) {
  return i < lines.size() ? "'" + lines[i] + "'" : "nothing";
}

}  // namespace

void agree_on_lines(const std::string& what, const std::vector<std::string>& lines,
                    const std::function<std::string(const std::vector<std::string>&, size_t)>& label, MPI_Comm comm) {
  int me = 0, size = 1;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &size);
  const std::string text = joined(lines);
  const uint64_t mine = fnv1a64(text);
  std::vector<uint64_t> hashes(size_t(size), 0);
  MPI_Allgather(&mine, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, comm);
  if (std::all_of(hashes.begin(), hashes.end(), [&](uint64_t h) { return h == hashes[0]; })) return;

  // Rank 0 receives the text of every rank whose hash differs from its own and names the first.
  std::vector<int> differ;
  for (int r = 1; r < size; ++r)
    if (hashes[size_t(r)] != hashes[0]) differ.push_back(r);
  std::string message;
  if (me == 0) {
    std::string ranks;
    for (size_t k = 0; k < differ.size(); ++k)
      ranks += (k == 0 ? "" : k + 1 == differ.size() ? " and " : ", ") + std::to_string(differ[k]);
    for (size_t k = 0; k < differ.size(); ++k) {
      long long n = 0;
      MPI_Recv(&n, 1, MPI_LONG_LONG, differ[k], 0, comm, MPI_STATUS_IGNORE);
      std::string theirs(size_t(n), '\0');
      MPI_Recv(theirs.data(), int(n), MPI_CHAR, differ[k], 1, comm, MPI_STATUS_IGNORE);
      if (k > 0) continue;
      // The first of rank 0's lines that the other's text does not repeat, and the other's line there.
      size_t i = 0, at = 0;
      while (i < lines.size() && theirs.compare(at, lines[i].size() + 1, lines[i] + '\n') == 0) at += lines[i++].size() + 1;
      const size_t end = theirs.find('\n', at);
      const std::string their_line = end == std::string::npos ? "nothing" : "'" + theirs.substr(at, end - at) + "'";
      message = "the ranks disagree on their " + what + ": rank" + (differ.size() > 1 ? "s " : " ") + ranks +
                (differ.size() > 1 ? " differ" : " differs") + " from rank 0, first at " + label(lines, i) + " (" +
                their_line + " on rank " + std::to_string(differ[0]) + ", " + quoted(lines, i) +
                " on rank 0): every rank of a launch must run the same command on the same deck with the same --set "
                "options";
    }
  } else if (hashes[size_t(me)] != hashes[0]) {
    const long long n = (long long)text.size();
    MPI_Send(&n, 1, MPI_LONG_LONG, 0, 0, comm);
    MPI_Send(text.data(), int(n), MPI_CHAR, 0, 1, comm);
  }
  throw InputError(broadcast_string(message, 0, comm));
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
