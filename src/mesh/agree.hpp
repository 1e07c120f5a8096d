// Agreement on a verdict that each rank reaches on its own (a file it cannot read, a directory it
// cannot see, a GPU it lacks). On a cluster ranks do not share everything, so a check that fails on
// one rank only must still stop every rank together, with the failing rank's reason (docs/ARCHITECTURE.md
// "Principles" 6), instead of leaving the others waiting in the next collective.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace meshmoe {

// Collective over `comm`: rank `root`'s string on every rank. For groups that exist before the
// mesh (world, node); with a mesh, Comm::broadcast_string.
std::string broadcast_string(std::string s, int root, MPI_Comm comm);

// Collective over `comm`. `error` is this rank's verdict ("" = fine). Returns on every rank the
// message of the lowest failing rank, "" when none failed.
std::string first_error(const std::string& error, MPI_Comm comm);

// This machine's host name, and "rank R on HOST" of this process (world rank).
std::string host_name();
std::string rank_and_host();

// Collective over `comm`: runs `check` on every rank; when it throws on any rank, every rank throws
// InputError with the lowest failing rank's message, prefixed with "rank R on HOST: " when not
// every rank failed the same way (so the user learns which node lacks what).
template <class Check>
void agree_on_input(MPI_Comm comm, Check&& check);

// Collective over `comm`: every rank must hold the same `lines` (its command line, its effective
// deck). When a rank's differ from rank 0's, throws InputError on every rank, naming `what`, the
// ranks that differ and the first line that differs, as `label(lines, i)` names line i ("argument
// 3", "optim.lr"). One hash per rank crosses the wire when all agree; the differing ranks' lines
// only when not. Call it before any collective that a disagreement could leave waiting.
void agree_on_lines(const std::string& what, const std::vector<std::string>& lines,
                    const std::function<std::string(const std::vector<std::string>&, size_t)>& label, MPI_Comm comm);

// The non-template part of agree_on_input: `mine` is this rank's message ("" = fine).
void throw_agreed_input_error(const std::string& mine, MPI_Comm comm);

template <class Check>
void agree_on_input(MPI_Comm comm, Check&& check) {
  std::string mine;
  try {
    check();
  } catch (const std::exception& e) {
    mine = e.what();
    if (mine.empty()) mine = "failed";
  }
  throw_agreed_input_error(mine, comm);
}

}  // namespace meshmoe
