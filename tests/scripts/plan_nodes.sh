#!/usr/bin/env bash
# `meshmoe plan --ranks-per-node N`: which mesh axes cross nodes and the bytes each sends across
# node boundaries per step (docs/cluster.md "Placing the mesh on nodes"), against a hand
# calculation from the plan's own per-rank volumes (its "bytes sent per rank per step" table, which
# plan_memory.sh checks against the layers' shapes):
#   dense deck, data 2 x tensor 2 (ranks: data groups [0 2] [1 3], tensor groups [0 1] [2 3]):
#     4 ranks per node: nothing crosses;
#     2 ranks per node: tensor inside nodes; each data group is a ring of 2 over 2 nodes, both of
#       its hops cross: data = 2 groups x 2 hops x the per-rank data volume;
#     1 rank per node: data as above, tensor = 2 groups x 2 hops x the per-rank tensor volume,
#       and the warning that the tensor axis spans nodes;
#   Switch deck with tied embeddings, pipe 2 x data 2 (pipe groups [0 2] [1 3]; data groups [0 1]
#   [2 3], the all-to-all and the gradient all-reduce in the same groups of 2):
#     2 ranks per node: data inside; each pipe group sends stage 0's volume (activations forward,
#       the tied embedding's gradient) and stage 1's (gradients back, the tied gradient) across:
#       pipe = 2 x (stage 0's + stage 1's pipe volume);
#     1 rank per node: pipe as above, data = sum over stages of 2 x the per-rank data volume (a ring
#       of 2 and an all-to-all of 2 both send a rank's whole volume to the other node).
# Also: the placement from SLURM_NTASKS_PER_NODE, the nodes MPI sees (one node here), `plan --ranks
# --ranks-per-node` warning without a launch, and bad values (exit 2, named).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir plan-nodes
cat >"$T/dense.toml" <<'TOML'
[mesh]
data = 2
tensor = 2
[model]
vocab_size = 100
seq_len = 16
d_model = 32
num_layers = 2
num_heads = 4
d_ff = 64
[moe]
every = 0
[optim]
batch_size = 8
micro_batches = 2
TOML
cat >"$T/switch.toml" <<'TOML'
[mesh]
pipe = 2
data = 2
[model]
vocab_size = 100
seq_len = 16
d_model = 32
num_layers = 4
num_heads = 4
d_ff = 64
tied_embeddings = true
[moe]
num_experts = 4
every = 2
router = "top1"
group_size = 16
[optim]
batch_size = 8
micro_batches = 2
TOML
plan() {  # NAME DECK RANKS-PER-NODE|slurm
  local name=$1 deck=$2 rpn=$3
  if [ "$rpn" = slurm ]; then
    SLURM_NTASKS_PER_NODE=2 timeout 120 mpirun -np 4 -x SLURM_NTASKS_PER_NODE "$M" plan "$T/$deck.toml" >"$T/$name.out" 2>&1 ||
      { cat "$T/$name.out"; fail "plan $name failed"; }
    return
  fi
  timeout 120 mpirun -np 4 "$M" plan "$T/$deck.toml" --ranks-per-node "$rpn" >"$T/$name.out" 2>&1 ||
    { cat "$T/$name.out"; fail "plan $name failed"; }
}
plan dense-4 dense 4
plan dense-2 dense 2
plan dense-1 dense 1
plan dense-slurm dense slurm
plan switch-2 switch 2
plan switch-1 switch 1
cat "$T/dense-2.out"
$PYTHON - "$T" <<'PY'
import re, sys
T = sys.argv[1]
bad = 0
def read(name):
    text = open(f"{T}/{name}.out").read()
    sent = {}
    block = text.split("bytes sent per rank per step")[1].split("\n")[1:4]
    for line in block:
        f = line.split()
        sent[f[0]] = [int(x) for x in f[1:]]
    cross = {}
    for m in re.finditer(r"^  (pipe|data|tensor) +(within nodes|crosses nodes: +(\d+) of +(\d+) groups) +(\d+)$", text, re.M):
        cross[m.group(1)] = (m.group(3) and int(m.group(3)) or 0, int(m.group(5)))
    return text, sent, cross
def check(name, expect, warn):
    global bad
    text, sent, cross = read(name)
    want = expect(sent)
    for axis in ("pipe", "data", "tensor"):
        got = cross.get(axis)
        ok = got == want[axis]
        bad += not ok
        print(f"{name:12s} {axis:7s} groups spanning, bytes across: {got} expected {want[axis]} {'ok' if ok else 'MISMATCH'}")
    has = "warning: the tensor axis spans nodes" in text
    bad += has != warn
    print(f"{name:12s} tensor warning {has} expected {warn} {'ok' if has == warn else 'MISMATCH'}")
    return text
d = lambda s: s["data"][0]
t = lambda s: s["tensor"][0]
check("dense-4", lambda s: {"pipe": (0, 0), "data": (0, 0), "tensor": (0, 0)}, False)
check("dense-2", lambda s: {"pipe": (0, 0), "data": (2, 2 * 2 * d(s)), "tensor": (0, 0)}, False)
check("dense-1", lambda s: {"pipe": (0, 0), "data": (2, 2 * 2 * d(s)), "tensor": (2, 2 * 2 * t(s))}, True)
text = check("dense-slurm", lambda s: {"pipe": (0, 0), "data": (2, 2 * 2 * d(s)), "tensor": (0, 0)}, False)
ok = "placement (SLURM_NTASKS_PER_NODE 2): nodes: 2 (node 0: ranks 0 1; node 1: ranks 2 3)" in text
bad += not ok
print(f"dense-slurm  placement from SLURM_NTASKS_PER_NODE {'ok' if ok else 'MISMATCH'}")
ok = re.search(r"^nodes seen by MPI: 1 \([^:]+: ranks 0 1 2 3\)$", text, re.M) is not None
bad += not ok
print(f"dense-slurm  nodes seen by MPI: one node of 4 ranks {'ok' if ok else 'MISMATCH'}")
pipe = lambda s: 2 * (s["pipe"][0] + s["pipe"][1])
check("switch-2", lambda s: {"pipe": (2, pipe(s)), "data": (0, 0), "tensor": (0, 0)}, False)
check("switch-1", lambda s: {"pipe": (2, pipe(s)), "data": (2, 2 * s["data"][0] + 2 * s["data"][1]), "tensor": (0, 0)}, False)
_, sent, _ = read("switch-1")
ok = all(v > 0 for v in sent["pipe"] + sent["data"]) and d(read("dense-1")[1]) > 0 and t(read("dense-1")[1]) > 0
bad += not ok
print(f"volumes non-zero (the hand calculation is not 0 = 0) {'ok' if ok else 'MISMATCH'}")
print(f"{bad} mismatches")
sys.exit(1 if bad else 0)
PY
# --ranks with --ranks-per-node: the job scripts' check, no mesh started.
"$M" plan --ranks "$T/dense.toml" --ranks-per-node 1 >"$T/ranks.out" 2>"$T/ranks.err"
[ "$(cat "$T/ranks.out")" = 4 ] || fail "plan --ranks printed $(cat "$T/ranks.out")"
grep -q "warning: with 1 ranks per node the tensor axis (mesh.tensor = 2) spans nodes" "$T/ranks.err" ||
  { cat "$T/ranks.err"; fail "plan --ranks --ranks-per-node 1: no tensor warning"; }
"$M" plan --ranks "$T/dense.toml" --ranks-per-node 2 >/dev/null 2>"$T/ranks2.err"
[ ! -s "$T/ranks2.err" ] || { cat "$T/ranks2.err"; fail "plan --ranks --ranks-per-node 2 warned"; }
set +e
"$M" plan --ranks "$T/dense.toml" --ranks-per-node 0 >"$T/zero.out" 2>&1; rc0=$?
SLURM_NTASKS_PER_NODE=x "$M" plan --ranks "$T/dense.toml" >"$T/slurmbad.out" 2>&1; rcx=$?
set -e
[ "$rc0" = 2 ] && grep -q "ranks-per-node" "$T/zero.out" || { cat "$T/zero.out"; fail "--ranks-per-node 0: exit $rc0"; }
[ "$rcx" = 2 ] && grep -q "SLURM_NTASKS_PER_NODE = 'x'" "$T/slurmbad.out" || { cat "$T/slurmbad.out"; fail "SLURM_NTASKS_PER_NODE=x: exit $rcx"; }
echo "plan_nodes: crossings and bytes across nodes as calculated by hand; warnings and bad values"
