# shellcheck shell=bash
# Helpers of the multi-node tests (tests/scripts/nodes_*.sh) on two fake nodes of two ranks
# (tools/fake-nodes.sh, docs/cluster.md "Several nodes on one machine"). Sourced after
# tests/lib/common.sh, with M and T set.

# assert_two_nodes DECK [ARG...]: `meshmoe plan DECK ARG...` on the fake nodes must report what MPI
# sees as two hosts of two ranks each: the shared-memory split (MPI_COMM_TYPE_SHARED) gives ranks
# 0 1 and 2 3, with two distinct processor names. A fall-back to one node (or to one host name)
# fails the test, so that no multi-node test passes on a single node.
assert_two_nodes() {
  local deck=$1; shift
  timeout 120 tools/fake-nodes.sh "$M" plan "$deck" "$@" >"$T/two-nodes.out" 2>&1 ||
    { cat "$T/two-nodes.out"; fail "meshmoe plan on the fake nodes failed"; }
  grep -qx "nodes seen by MPI: 2 (fakenode1: ranks 0 1; fakenode2: ranks 2 3)" "$T/two-nodes.out" ||
    { cat "$T/two-nodes.out"; fail "MPI does not see 2 nodes x 2 ranks (fakenode1: 0 1, fakenode2: 2 3)"; }
  echo "ok   MPI sees 2 nodes x 2 ranks: $(grep '^nodes seen by MPI' "$T/two-nodes.out")"
}

# train_on_nodes NAME [ARG...]: `meshmoe train $T/deck.toml` on 2 fake nodes x 2 ranks into
# $T/NAME (output in $T/NAME.log); a run that fails shows its log and fails the test.
train_on_nodes() {
  local name=$1; shift
  timeout 300 tools/fake-nodes.sh "$M" train "$T/deck.toml" --set run.out_dir="$T/$name" "$@" >"$T/$name.log" 2>&1 ||
    { cat "$T/$name.log"; fail "run $name on 2 nodes x 2 ranks failed"; }
}
