#!/usr/bin/env bash
# `meshmoe plan` as one process plans a mesh of any size (docs/user-guide.md "Planning in one
# process"). A top-2 MoE deck (experts over data in expert groups of 2, tensor 2, pipe 2):
#   - on pipe=2 x data=2 x tensor=2 (8 ranks, --ranks-per-node 4: two nodes), the one-process plan
#     prints what `mpirun -np 8` prints, line for line: the mesh (every rank's coordinates and
#     groups; the host is the planned node there), the memory table per stage, the placement and
#     its bytes across nodes; only the nodes MPI sees differ (here one node of 8 ranks, there none)
#     and so the available memory: run.max_memory shared by 8 ranks there, by the 4 of a planned
#     node here;
#   - on pipe=2 x data=512 x tensor=2 (2,048 ranks, 8 per node) it plans in one process within
#     20 s, the mesh text holding all 2,048 ranks, and every row of its memory table from the
#     parameters to the total (the same shard shapes: 4 experts and half the heads per rank, 2
#     blocks per stage, 1 sequence per micro-batch) equals the 8-rank plan's.
# Needs $MESHMOE (default build/meshmoe).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir plan-one-process
cat >"$T/deck.toml" <<'DECK'
[run]
max_memory = "64G"
[model]
vocab_size = 1000
seq_len = 64
d_model = 64
num_layers = 4
num_heads = 4
d_ff = 128
[moe]
num_experts = 8
every = 2
router = "top2"
group_size = 64
[optim]
batch_size = 4
micro_batches = 2
[mesh]
expert_parallel = 2
DECK
small=(--set mesh.pipe=2 --set mesh.data=2 --set mesh.tensor=2 --ranks-per-node 4)
mpirun -np 8 "$M" plan "$T/deck.toml" "${small[@]}" >"$T/mpi.out" 2>"$T/mpi.err" || { cat "$T/mpi.err"; fail "plan under mpirun -np 8"; }
"$M" plan "$T/deck.toml" "${small[@]}" >"$T/one.out" 2>"$T/one.err" || { cat "$T/one.err"; fail "plan in one process"; }
host=$(hostname)
# The same text but the hosts (MPI's processor name there, the planned node here) and the nodes MPI sees.
sed -e "s/  host $host  /  host H  /" -e '/^nodes seen by MPI/d' -e '/^available memory/d' "$T/mpi.out" >"$T/mpi.cmp"
sed -E -e 's/  host node [0-9]+  /  host H  /' -e '/^nodes seen by MPI/d' -e '/^available memory/d' "$T/one.out" >"$T/one.cmp"
diff "$T/mpi.cmp" "$T/one.cmp" || fail "one process and mpirun -np 8 plan the 8-rank mesh differently (< mpirun, > one process)"
grep -q "^rank 4  host node 1  pipe 1 data 0 tensor 0$" "$T/one.out" || { cat "$T/one.out"; fail "rank 4 is not on the planned node1"; }
grep -q '^available memory: 64.00 GiB per node (run.max_memory = "64G"), 4 ranks on the node: the plan fits' "$T/one.out" ||
  { cat "$T/one.out"; fail "no available-memory line of a 4-rank node"; }
grep -q "^nodes seen by MPI: none: planned in one process for 8 ranks" "$T/one.out" || fail "the one-process plan does not say so"

start=$(date +%s.%N)
"$M" plan "$T/deck.toml" --set mesh.pipe=2 --set mesh.data=512 --set mesh.tensor=2 --set optim.batch_size=1024 \
  --ranks-per-node 8 >"$T/big.out" 2>"$T/big.err" || { cat "$T/big.err"; fail "plan of 2,048 ranks in one process"; }
seconds=$(echo "$(date +%s.%N) - $start" | bc)
echo "2,048 ranks planned in $seconds s"
[ "$(echo "$seconds < 20" | bc)" = 1 ] || fail "a plan of 2,048 ranks took $seconds s"
grep -q "^mesh: pipe=2 x data=512 x tensor=2 = 2048 ranks" "$T/big.out" || fail "not the 2,048-rank mesh"
[ "$(grep -c '^rank [0-9]*  host node ' "$T/big.out")" = 2048 ] || fail "not 2,048 rank lines"
grep -q "^rank 2047  host node 255  pipe 1 data 511 tensor 1$" "$T/big.out" || fail "rank 2047 misplaced"
# The per-rank rows (parameters to total) of both plans: the same shard shapes, the same bytes.
rows() { sed -n '/^  parameters (count)/,/^  total /p' "$1"; }
[ -n "$(rows "$T/one.out")" ] || fail "no memory rows"
diff <(rows "$T/one.out") <(rows "$T/big.out") || fail "2,048 ranks: per-rank memory differs from the 8-rank plan's"
grep -q "the plan fits" "$T/big.out" || fail "no available-memory line for 2,048 ranks"
echo "plan_one_process: ok"
