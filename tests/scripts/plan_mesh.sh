#!/usr/bin/env bash
# `meshmoe plan` prints the device mesh: shape, every rank's coordinates and host, and the world
# ranks of every axis group (rank = (p*data + d)*tensor + t, tensor innermost), once (rank 0).
# Checked on 4 ranks as 1x2x2 and, through --set, as 2x2x1 and 2x1x2; a mesh that does not fit
# the job exits 2 quickly. (A pipeline needs optim.micro_batches >= 2, hence the extra --set.)
# With experts over data the memory report lists the expert and replica groups (expert replicas).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "plan_mesh: $M not built"; exit 1; }
tmp=$(mktemp -d "${MESHMOE_TEST_TMPDIR:-/tmp}/plan_mesh.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
host=$(hostname)  # MPI_Get_processor_name gives the host name; all ranks run here

cat >"$tmp/deck.toml" <<'TOML'
[mesh]
data = 2
tensor = 2
TOML

# plan NAME NP ARGS...: output in $tmp/NAME.out/.err, exit code in $tmp/NAME.rc
plan() {
  local name=$1 np=$2; shift 2
  timeout 60 mpirun -np "$np" "$M" plan "$tmp/deck.toml" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  echo $? >"$tmp/$name.rc"
  echo "-- $name (np=$np $*): exit $(cat "$tmp/$name.rc")"; sed 's/^/   /' "$tmp/$name.out"
}
# expect NAME: exit 0 and the mesh part of stdout exactly the text on stdin (so printed once, by rank 0 only)
expect() {
  [ "$(cat "$tmp/$1.rc")" = 0 ] || { fail "$1: exit $(cat "$tmp/$1.rc")"; sed 's/^/   stderr: /' "$tmp/$1.err"; }
  # The mesh part: everything before the memory and cost report (tested by plan_memory.sh).
  diff <(cat) <(sed -E '/^(model|memory):/,$d' "$tmp/$1.out") >"$tmp/$1.diff" || { fail "$1: output differs (< expected, > got)"; cat "$tmp/$1.diff"; }
}

plan p122 4
expect p122 <<END
mesh: pipe=1 x data=2 x tensor=2 = 4 ranks
rank 0  host $host  pipe 0 data 0 tensor 0
rank 1  host $host  pipe 0 data 0 tensor 1
rank 2  host $host  pipe 0 data 1 tensor 0
rank 3  host $host  pipe 0 data 1 tensor 1
pipe groups: [0] [1] [2] [3]
data groups: [0 2] [1 3]
tensor groups: [0 1] [2 3]
END

plan p221 4 --set mesh.pipe=2 --set mesh.tensor=1 --set optim.micro_batches=2
expect p221 <<END
mesh: pipe=2 x data=2 x tensor=1 = 4 ranks
rank 0  host $host  pipe 0 data 0 tensor 0
rank 1  host $host  pipe 0 data 1 tensor 0
rank 2  host $host  pipe 1 data 0 tensor 0
rank 3  host $host  pipe 1 data 1 tensor 0
pipe groups: [0 2] [1 3]
data groups: [0 1] [2 3]
tensor groups: [0] [1] [2] [3]
END

plan p212 4 --set mesh.pipe=2 --set mesh.data=1 --set optim.micro_batches=2
expect p212 <<END
mesh: pipe=2 x data=1 x tensor=2 = 4 ranks
rank 0  host $host  pipe 0 data 0 tensor 0
rank 1  host $host  pipe 0 data 0 tensor 1
rank 2  host $host  pipe 1 data 0 tensor 0
rank 3  host $host  pipe 1 data 0 tensor 1
pipe groups: [0 2] [1 3]
data groups: [0] [1] [2] [3]
tensor groups: [0 1] [2 3]
END

# Expert replicas (mesh.expert_parallel): the expert groups (the all-to-all) and the replica groups
# (the experts' gradient all-reduce) as world ranks, with the experts per rank. 2 experts on
# data = 4 default to groups of 2; with expert_parallel = 1 on 1x2x2 every rank holds all 8.
# expect_lines NAME: every line on stdin appears in the output, whole
expect_lines() {
  [ "$(cat "$tmp/$1.rc")" = 0 ] || { fail "$1: exit $(cat "$tmp/$1.rc")"; sed 's/^/   stderr: /' "$tmp/$1.err"; }
  while IFS= read -r line; do grep -qxF -- "$line" "$tmp/$1.out" || fail "$1: no line '$line'"; done
}
plan replicas 4 --set mesh.data=4 --set mesh.tensor=1 --set moe.num_experts=2 --set model.vocab_size=100
expect_lines replicas <<'END'
experts: moe.num_experts = 2 in expert groups of mesh.expert_parallel = 2 data ranks (1 per rank), each expert on 2 replicas (mesh.data / mesh.expert_parallel)
  expert groups (world ranks; MoE all-to-all): [0 1] [2 3]
  replica groups (world ranks; expert gradient all-reduce): [0 2] [1 3]
END
plan replicas-all 4 --set mesh.expert_parallel=1 --set model.vocab_size=100
expect_lines replicas-all <<'END'
experts: moe.num_experts = 8 in expert groups of mesh.expert_parallel = 1 data rank (8 per rank), each expert on 2 replicas (mesh.data / mesh.expert_parallel)
  expert groups (world ranks; MoE all-to-all): [0] [1] [2] [3]
  replica groups (world ranks; expert gradient all-reduce): [0 2] [1 3]
END
plan no-replicas 4 --set model.vocab_size=100
expect_lines no-replicas <<'END'
experts: moe.num_experts = 8 in expert groups of mesh.expert_parallel = 2 data ranks (4 per rank), each expert once
  expert groups (world ranks; MoE all-to-all): [0 2] [1 3]
END
grep -q "replica groups" "$tmp/no-replicas.out" && fail "no-replicas: lists replica groups"

# A mesh of 4 on 2 ranks: exit 2 naming both numbers, no hang.
start=$(date +%s)
plan wrong 2
[ "$(cat "$tmp/wrong.rc")" = 2 ] || fail "wrong: exit $(cat "$tmp/wrong.rc"), expected 2"
if ! { grep -q "4 ranks" "$tmp/wrong.err" && grep -q "2 ranks" "$tmp/wrong.err"; }; then
  fail "wrong: the message does not name 4 and 2 ranks"
  cat "$tmp/wrong.err"
fi
[ $(( $(date +%s) - start )) -le 30 ] || fail "wrong: took more than 30 s"

echo "plan_mesh: $fails failure(s)"
[ "$fails" -eq 0 ]
