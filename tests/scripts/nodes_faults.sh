#!/usr/bin/env bash
# Faults of a job on 2 nodes x 2 ranks (two fake nodes: tools/fake-nodes.sh), and checkpoints
# across node counts (docs/cluster.md "Faults on a cluster"):
#   1. a run directory that differs per node (node 2 has its own mount namespace with a tmpfs over
#      the run's parent, as a node-local disk): refused at start with the reason (rank 2 cannot
#      read back the nonce rank 0 wrote into run.lock), exit 2, within 60 s;
#   2. a node lost during a checkpoint write (both ranks of node 2 killed while step_N.h5.tmp is
#      being written): the job ends within 60 s, the half-written file never becomes a checkpoint,
#      and the run resumes on one node of 4 ranks: its metrics and final checkpoint BITWISE those of
#      an uninterrupted run on one node (mesh data 2 x tensor 2: every sum has two terms, so TCP
#      between nodes and shared memory inside one add them alike);
#   3. a checkpoint written on 2 nodes x 2 ranks resumes on 1 node x 4 ranks (bitwise, as 2.) and
#      on 1 rank (within 1e-5 of the uninterrupted one-rank run: the mesh-invariance bound of
#      train_invariance.sh).
# First asserts that MPI sees 2 hosts of 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
source tests/lib/fake_nodes.sh
M=${MESHMOE:-build/meshmoe}
test_dir nodes-faults
tiny_data "$T"
STEPS=10
write_tiny_deck "$T" run.name=nodes-faults run.steps="$STEPS" run.seed=5 mesh.data=2 mesh.tensor=2 \
  model.d_model=32 model.d_ff=64 model.dropout=0.1 moe.router=top2 moe.jitter_eps=0.01 optim.lr=0.01 \
  checkpoint.every=1
assert_two_nodes "$T/deck.toml"

echo "== 1. a run directory that differs per node"
mkdir -p "$T/local"
start=$SECONDS
set +e
timeout -k 5 90 tools/fake-nodes.sh --private 2:"$T/local" "$M" train "$T/deck.toml" \
  --set run.out_dir="$T/local/run" >"$T/local.log" 2>&1
rc=$?
set -e
took=$((SECONDS - start))
[ "$rc" = 2 ] || { cat "$T/local.log"; fail "a per-node run directory: exit $rc, not 2"; }
[ "$took" -le 60 ] || fail "a per-node run directory: refused after $took s, not within 60 s"
grep -Eq "meshmoe: error: rank [23] on fakenode2: the run directory .*/local/run is not the one rank 0 writes" "$T/local.log" ||
  { cat "$T/local.log"; fail "a per-node run directory: the reason is not given"; }
echo "ok   a run directory that differs per node: exit 2 in $took s, $(grep -Eo 'rank [23] on fakenode2: the run directory [^,;]*' "$T/local.log" | head -1)"

echo "== 2. a node lost during a checkpoint write"
R="$T/lost"
mkdir -p "$T/state"
setsid timeout -k 5 300 tools/fake-nodes.sh --state "$T/state" "$M" train "$T/deck.toml" --set run.out_dir="$R" \
  >"$T/lost.log" 2>&1 &
job=$!
# Wait for a checkpoint write from step 3 on (the ranks write step_N.h5.tmp, then rename it), then
# SIGKILL both ranks of node 2 (the children of its daemon) at once.
killed=""
for _ in $(seq 1 6000); do
  for f in "$R"/ckpt/step_*.h5.tmp; do
    [ -e "$f" ] || continue
    n=${f##*/step_}; n=${n%%.*}
    if [ "$((10#$n))" -ge 3 ]; then
      pids=$(pgrep -P "$(cat "$T/state/fakenode2.pid")" || true)
      # shellcheck disable=SC2086
      [ -n "$pids" ] && kill -9 $pids && killed="$f"
    fi
  done
  [ -n "$killed" ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.005
done
[ -n "$killed" ] || { wait "$job" || true; cat "$T/lost.log"; fail "no checkpoint write seen to kill node 2 in"; }
kill_time=$SECONDS
set +e
wait "$job"
rc=$?
set -e
took=$((SECONDS - kill_time))
[ "$rc" != 0 ] || fail "the job with a lost node exited 0"
[ "$took" -le 60 ] || fail "the job with a lost node ended $took s after the kill, not within 60 s"
echo "ok   node 2 killed while ${killed##*/} was written: the job ended in $took s (exit $rc)"
last=$(tr -d '[:space:]' <"$R/ckpt/LATEST" 2>/dev/null || true)
[ -n "$last" ] || fail "no committed checkpoint before the kill"
kstep=${killed##*/step_}; kstep=$((10#${kstep%%.*}))
lstep=${last#step_}; lstep=$((10#${lstep%%.*}))
# (rank 0, on node 1, may still commit the file when node 2's ranks had written their part)
[ ! -e "$killed" ] || [ "$lstep" -lt "$kstep" ] || fail "LATEST names $last, not a step before the half-written ${killed##*/}"
"$M" ckpt verify "$R/ckpt/$last" >/dev/null || fail "the newest committed checkpoint $last does not verify"
echo "ok   the newest committed checkpoint ($last) verifies"

# The uninterrupted runs: one node of 4 ranks (same mesh) and one rank.
train_or_fail ref-1x4 4
train_or_fail ref-1x1 1 --set mesh.data=1 --set mesh.tensor=1
# 2. and 3.: the lost node's run resumes on one node of 4 ranks; a copy of its checkpoint resumes
# on one rank.
cp -a "$R" "$T/lost-1x1"
train_or_fail lost 4
train_or_fail lost-1x1 1 --set mesh.data=1 --set mesh.tensor=1
for r in lost lost-1x1; do
  grep -q "^resuming from .*/$last: step $lstep (written on mesh pipe=1 x data=2 x tensor=2" "$T/$r.log" ||
    { cat "$T/$r.log"; fail "$r did not resume from $last of the 2 x 2 run"; }
done
echo "ok   the 2 x 2 run's $last resumed on 1 node x 4 ranks and on 1 rank"
$PYTHON - "$T" "$STEPS" <<'PY'
import sys, glob, h5py, numpy as np
sys.path.insert(0, "tests/lib")
from compare_runs import compare_scalars
T, steps = sys.argv[1], int(sys.argv[2])
bad = 0
def final(run):
    return h5py.File(f"{T}/{run}/ckpt/step_{steps:08d}.h5", "r") if glob.glob(f"{T}/{run}/ckpt/step_{steps:08d}.h5") else None
for ref, run, tol in [("ref-1x4", "lost", 0), ("ref-1x1", "lost-1x1", 1e-5)]:
    a, b = h5py.File(f"{T}/{ref}/metrics.h5", "r"), h5py.File(f"{T}/{run}/metrics.h5", "r")
    bad += compare_scalars(a, b, run, tol=tol, keys=["loss", "aux_loss", "grad_norm"])
ca, cb = final("ref-1x4"), final("lost")
if ca is None or cb is None:
    print("final checkpoint missing MISMATCH"); bad += 1
else:
    names = []
    ca.visit(lambda n: names.append(n) if isinstance(ca[n], h5py.Dataset) else None)
    diff = [n for n in names if n not in cb or not np.array_equal(ca[n][()], cb[n][()])]
    print(f"final checkpoint: {len(names)} datasets, {len(diff)} differ {'ok' if not diff else 'MISMATCH ' + ' '.join(diff[:5])}")
    bad += len(diff) > 0 or len(names) == 0
print(f"{bad} mismatches")
sys.exit(1 if bad else 0)
PY
echo "nodes_faults: per-node run directory refused, lost node ends the job, 2x2 checkpoints resume on 1x4 and 1x1"
