#!/usr/bin/env bash
# `make check-slurm`: the job scripts on a real Slurm started on this machine (cluster.sh).
#   1. train-cpu.sbatch (through submit.sh) with a tiny deck on 2 ranks: the job COMPLETES, its
#      metrics.h5 has every step, the checkpoint is there and verifies.
#   2. The same deck, sent USR1 mid-run (scancel --signal=USR1 --batch): meshmoe checkpoints and
#      exits 75, the job requeues itself, resumes, and ends with the same final loss as job 1;
#      the same with INT (the scripts pass every stop request on as USR1).
#   3. sweep.sh over moe.num_experts: one run directory per value.
#   4. train-gpu.sbatch (submit.sh --gpu) on 1 rank: Slurm grants the GPU (the script reports
#      CUDA_VISIBLE_DEVICES) and the ranks run with run.device = "cuda". The test node's GPU is a
#      stand-in (cluster.sh), so meshmoe must stop with exit 2 naming the rank, the host and the
#      reason, and the job must fail without requeueing; on a node with a real GPU this job trains
#      (tests/scripts/gpu_train.sh checks the CUDA path itself).
#   5. gshard-experiment.sbatch (GShard's experiment as one job) on a tiny corpus, stopped by USR1
#      mid-training: both trainings checkpoint and resume after the requeue, both models are
#      evaluated, the BLEU report and its figure are written.
#   6. two nodes (a second Slurm of two slurmd in their own UTS namespaces): MPI sees 2 hosts x
#      2 ranks under srun; submit.sh --nodes 2 trains to the last step, checkpoints, and its losses
#      are those of mpirun on the same nodes (bitwise) and of one rank (1e-5); mesh and nodes that
#      do not match: exit 2.
# Everything it started is stopped at the end, by process id. Ends with "N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
export MESHMOE=$ROOT/$BUILD/meshmoe
export OPENBLAS_NUM_THREADS=1
T=$(mktemp -d /tmp/meshmoe-slurm.XXXXXX)
chmod 755 "$T"
passed=0; failed=0
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; }
cleanup() { for c in cluster cluster2; do "$ROOT/tests/slurm/cluster.sh" stop "$T/$c" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT

conf=$(tests/slurm/cluster.sh start "$T/cluster") || { echo "could not start Slurm"; echo "0 passed, 1 failed"; exit 1; }
export SLURM_CONF=$conf
echo "slurm up: $(sinfo -h -o '%P %a %D %T %N')"

"$MESHMOE" prep text -q --max-len 65 src/model/*.cpp src/model/moe/*.cpp -o "$T/data.h5" >/dev/null
cat > "$T/deck.toml" <<DECK
[run]
name = "slurm"
steps = ${SLURM_TEST_STEPS:-100}
log_every = 5
seed = 3
[mesh]
data = 2
[model]
# Large enough that a step takes tens of milliseconds, so the USR1 sent after a few logged steps
# lands mid-run (a smaller model finishes its steps before the signal arrives).
seq_len = 64
d_model = 128
num_layers = 2
num_heads = 2
d_ff = 512
[moe]
num_experts = 4
every = 2
router = "top1"
group_size = 32
[optim]
batch_size = 8
lr = 0.003
warmup_steps = 5
[data]
path = "$T/data.h5"
[eval]
every = 0
[checkpoint]
every = 10
DECK

wait_job() {  # job id -> prints final state
  local id=$1 state=""
  for _ in $(seq 600); do
    state=$(sacct -n -X -j "$id" -o State 2>/dev/null | head -1 | tr -d ' ')
    [ -z "$state" ] && state=$(scontrol show job "$id" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case $state in COMPLETED|FAILED|CANCELLED*|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) echo "$state"; return;; esac
    sleep 0.5
  done
  echo "TIMEOUT_WAITING($state)"
}
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
# wait_job_within ID START END: the job's final state, as wait_job prints it; a job still pending
# after START seconds, or not finished END seconds after it started, is cancelled and prints
# TIMEOUT_PENDING or TIMEOUT_RUNNING, with squeue's reason, the job's and the nodes' state and the
# end of slurmctld's log on stderr (the test fails instead of hanging).
wait_job_within() {
  local id=$1 limit=$2 state="" t0=$SECONDS started=""
  while :; do
    state=$(job_state "$id")
    case $state in COMPLETED|FAILED|CANCELLED*|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE) echo "$state"; return;; esac
    if [ -z "$started" ] && [ -n "$state" ] && [ "$state" != PENDING ]; then started=1; t0=$SECONDS; limit=$3; fi
    [ $((SECONDS - t0)) -ge "$limit" ] && break
    sleep 0.5
  done
  { echo "job $id still ${state:-unknown} after $limit s; squeue reason: $(squeue -h -j "$id" -o '%T %R')"
    scontrol show job "$id"; sinfo -N -o '%N %T %C %E'
    tail -15 "$(dirname "$SLURM_CONF")/log/slurmctld.log"; } >&2
  scancel "$id"
  [ "$state" = PENDING ] && echo TIMEOUT_PENDING || echo TIMEOUT_RUNNING
}
wait_logged() {  # metrics.h5 tries: until the run has logged 3 steps (0.2 s a try)
  for _ in $(seq "$2"); do
    [ -s "$1" ] && /usr/bin/python3 -c "import h5py,sys; sys.exit(0 if h5py.File(sys.argv[1],'r')['step'].shape[0] >= 3 else 1)" "$1" 2>/dev/null && return
    sleep 0.2
  done
}
final_loss() { /usr/bin/python3 -c "import h5py,sys; f=h5py.File(sys.argv[1],'r'); print(repr(float(f['loss'][-1])), int(f['step'][-1]))" "$1"; }

cd "$T"
# 1. a plain job
id=$("$ROOT/jobscripts/submit.sh" deck.toml --set run.out_dir="$T/run1" -- --parsable)
state=$(wait_job "$id")
if [ "$(job_state "$id")" = COMPLETED ] && [ -s "$T/run1/metrics.h5" ]; then ok "job $id completed"; else
  bad "job $id: state $(job_state "$id")"; cat "$T"/meshmoe-"$id".out 2>/dev/null | tail -20; fi
read -r loss1 step1 < <(final_loss "$T/run1/metrics.h5" 2>/dev/null) || true
[ "${step1:-0}" = "${SLURM_TEST_STEPS:-100}" ] && ok "run1 logged every step up to $step1 (loss $loss1)" || bad "run1 metrics: step ${step1:-none}"
if [ -d "$T/run1/ckpt" ]; then
  "$MESHMOE" ckpt verify "$T/run1" >/dev/null 2>&1 && ok "run1 checkpoint verifies" || bad "run1 checkpoint does not verify"
else bad "run1 has no checkpoint directory"; fi

# 2. USR1 mid-run: checkpoint, exit 75, requeue, resume, same final loss
id=$("$ROOT/jobscripts/submit.sh" deck.toml --set run.out_dir="$T/run2" -- --parsable)
wait_logged "$T/run2/metrics.h5" 300  # until it has logged a few steps
scancel --signal=USR1 --batch "$id"
state=$(wait_job "$id")
out="$T/meshmoe-$id.out"
grep -q "meshmoe exited with 75" "$out" && ok "job $id: USR1 -> checkpoint and exit 75" || { bad "job $id: no exit 75 after USR1"; tail -30 "$out"; }
grep -q "restart 1" "$out" && ok "job $id requeued and restarted" || bad "job $id did not restart"
[ "$(job_state "$id")" = COMPLETED ] && ok "job $id completed after the restart" || bad "job $id: state $(job_state "$id")"
read -r loss2 step2 < <(final_loss "$T/run2/metrics.h5" 2>/dev/null) || true
if [ -n "${loss1:-}" ] && [ "${loss2:-x}" = "$loss1" ] && [ "$step2" = "$step1" ]; then ok "resumed run ends with the same final loss ($loss2)"
else bad "final loss after resume ${loss2:-none} (step ${step2:-none}) differs from the uninterrupted ${loss1:-none}"; fi

# 2b. INT to the batch shell (any stop request is passed on to the ranks as USR1): checkpoint,
# exit 75, requeue, resume, same final loss
id=$("$ROOT/jobscripts/submit.sh" deck.toml --set run.out_dir="$T/run2b" -- --parsable)
wait_logged "$T/run2b/metrics.h5" 300
scancel --signal=INT --batch "$id"
wait_job "$id" >/dev/null
out="$T/meshmoe-$id.out"
grep -q "got INT; asking the ranks to checkpoint" "$out" && grep -q "meshmoe exited with 75" "$out" &&
  ok "job $id: INT -> checkpoint and exit 75" || { bad "job $id: no exit 75 after INT"; tail -30 "$out"; }
read -r loss2b step2b < <(final_loss "$T/run2b/metrics.h5" 2>/dev/null) || true
if grep -q "restart 1" "$out" && [ "$(job_state "$id")" = COMPLETED ] && [ "${loss2b:-x}" = "${loss1:-}" ] && [ "$step2b" = "$step1" ]; then
  ok "job $id requeued, resumed and ends with the same final loss"
else bad "job $id after INT: state $(job_state "$id"), final loss ${loss2b:-none} at step ${step2b:-none}"; fi

# 3. a sweep over moe.num_experts
id=$("$ROOT/jobscripts/sweep.sh" deck.toml moe.num_experts "2 4" --set checkpoint.every=0 -- --parsable)
for t in 0 1; do wait_job "${id}_$t" >/dev/null; done
n=0; for v in 2 4; do [ -s "$T/runs/slurm-moe.num_experts-$v/metrics.h5" ] && n=$((n + 1)); done
[ "$n" = 2 ] && ok "sweep: one run directory per value" || { bad "sweep: $n of 2 run directories"; ls -R "$T/runs" 2>/dev/null | head; tail -n 5 "$T"/meshmoe-sweep-*.out; }

# 4. the GPU job script on the stand-in GPU
id=$("$ROOT/jobscripts/submit.sh" --gpu deck.toml --set mesh.data=1 --set run.out_dir="$T/gpu" -- --parsable)
wait_job "$id" >/dev/null
out="$T/meshmoe-$id.out"
grep -q "GPUs (CUDA_VISIBLE_DEVICES): 0" "$out" && ok "gpu job $id: Slurm granted one GPU per rank" || { bad "gpu job $id: no GPU granted"; tail -5 "$out"; }
grep -q "run.device=cuda" "$out" && ok "gpu job $id: ran with run.device = cuda" || bad "gpu job $id: run.device not set"
# A host-only build (make CUDA=0) names that instead of the missing device.
reason='run.device = "cuda": rank 0 on .*: no CUDA device is visible'
"$MESHMOE" --version 2>/dev/null | grep -q "built without CUDA" && reason='run.device = "cuda": .*built without CUDA'
if grep -qE "$reason" "$out" && grep -q "meshmoe exited with 2" "$out" &&
   [ "$(job_state "$id")" = FAILED ] && ! grep -q "restart 1" "$out"; then ok "gpu job $id: no usable GPU -> exit 2 with the reason, no requeue"
else bad "gpu job $id: state $(job_state "$id")"; tail -8 "$out"; fi

# 5. GShard's experiment as one job (gshard-experiment.sbatch) on a 3-language byte-level corpus,
# sent USR1 mid-training: both trainings checkpoint, the job requeues itself, both resume to the
# last step, then both models are evaluated and the BLEU report and figure are written.
"$MESHMOE" prep gettext -q --languages de,fr,es --max-len 64 -o "$T/gettext3.h5" >/dev/null
GS_STEPS=100
id=$(DATA="$T/gettext3.h5" TOKENIZER=bytes OUT="$T/gshard-exp" LANGS=de,fr MAX_EXAMPLES=4 BEAM=2 \
  sbatch --parsable "$ROOT/jobscripts/gshard-experiment.sbatch" --set run.steps=$GS_STEPS --set run.log_every=5 \
  --set optim.batch_size=4 --set eval.every=0 --set eval.bleu_every=0 --set checkpoint.every=0)
wait_logged "$T/gshard-exp/gshard/metrics.h5" 600
scancel --signal=USR1 --batch "$id"
wait_job "$id" >/dev/null
out="$T/meshmoe-gshard-$id.out"
grep -q "checkpointed; requeueing" "$out" && grep -q "restart 1" "$out" && [ "$(job_state "$id")" = COMPLETED ] &&
  ok "gshard experiment job $id: USR1 -> both trainings checkpoint, requeue, restart, complete" ||
  { bad "gshard experiment job $id: state $(job_state "$id")"; tail -30 "$out"; }
n=0
for m in dense gshard; do
  read -r _ s < <(final_loss "$T/gshard-exp/$m/metrics.h5" 2>/dev/null) || true
  [ "${s:-0}" = "$GS_STEPS" ] && [ -s "$T/gshard-exp/$m/eval-langs.h5" ] && n=$((n + 1))
done
[ "$n" = 2 ] && ok "gshard experiment: both models trained to step $GS_STEPS and evaluated" ||
  { bad "gshard experiment: $n of 2 models trained and evaluated"; tail -5 "$T"/gshard-exp/*.log; }
grep -q "^mean delta .* BLEU over 2 languages" "$out" && [ -s "$T/gshard-exp/figure6.png" ] &&
  ok "gshard experiment: BLEU report (figure 6) for de and fr" || { bad "gshard experiment: no report"; tail -12 "$out"; }

# 6. Two nodes (cluster.sh start DIR 2: fakenode1 and fakenode2, a slurmd each in its own UTS
# namespace): MPI under srun sees 2 hosts of 2 ranks (meshmoe plan's shared-memory split), and the
# placement follows SLURM_NTASKS_PER_NODE; submit.sh --nodes 2 trains a tiny deck on 2 nodes x 2
# ranks to its last step, writes its checkpoints (they verify), and logs bitwise the losses of the
# same mesh under mpirun on the same fake nodes (tools/fake-nodes.sh), and those of one rank within
# nodes_mesh.sh's invariance bound (1e-5 relative); a mesh the nodes cannot hold evenly is refused
# before submitting; a job whose ranks do not match the mesh stops with exit 2 before srun starts
# anything.
# The second Slurm numbers its jobs from 1 again, so its jobs write their meshmoe-<id>.out in a
# directory of their own: an output of the first Slurm's job of the same id is never read as theirs.
# The 4 ranks of the fake nodes share this machine's 2 cores, which Open MPI under srun does not
# know: busy-polling, they take the cores from each other, and a checkpoint (hundreds of small
# collectives of parallel HDF5) takes minutes instead of seconds (docs/cluster.md "Two nodes on
# one Slurm"); so they yield when idle, as the tests' ranks under mpirun do (tests/env.sh).
export OMPI_MCA_mpi_yield_when_idle=1
"$ROOT/tests/slurm/cluster.sh" stop "$T/cluster" >/dev/null 2>&1 || true
mkdir -p "$T/two" && cd "$T/two" || exit 1
if conf=$("$ROOT/tests/slurm/cluster.sh" start "$T/cluster2" 2); then
  export SLURM_CONF=$conf
  echo "two-node slurm up: $(sinfo -h -N -o '%N %T' | tr '\n' ' ')"
  timeout 120 srun -N2 --ntasks-per-node=2 --mpi="${MESHMOE_SRUN_MPI:-pmix}" "$MESHMOE" plan "$T/deck.toml" --set mesh.data=4 \
    >"$T/plan-2nodes.out" 2>&1
  grep -qx "nodes seen by MPI: 2 (fakenode1: ranks 0 1; fakenode2: ranks 2 3)" "$T/plan-2nodes.out" &&
    grep -q "^placement (SLURM_NTASKS_PER_NODE 2): nodes: 2" "$T/plan-2nodes.out" &&
    ok "srun on 2 nodes: MPI sees fakenode1 (ranks 0 1) and fakenode2 (ranks 2 3)" ||
    { bad "srun on 2 nodes: MPI does not see 2 nodes x 2 ranks"; tail -20 "$T/plan-2nodes.out"; }

  tiny=(--set mesh.data=4 --set run.steps=10 --set model.d_model=32 --set model.d_ff=64)
  id=$("$ROOT/jobscripts/submit.sh" --nodes 2 "$T/deck.toml" "${tiny[@]}" --set checkpoint.every=5 \
    --set run.out_dir="$T/nodes2" -- --parsable)
  state=$(wait_job_within "$id" 120 300)
  out="$T/two/meshmoe-$id.out"
  if [ "$state" = COMPLETED ] && grep -q "on fakenode1: 4 ranks" "$out" && grep -q "^done: 10 steps" "$out" &&
     grep -q "node-shared within each node over the data axis (hierarchical sums" "$out"; then
    ok "submit.sh --nodes 2: job $id trained its 10 steps on 2 nodes x 2 ranks"
    took=$(sed -n 's/^checkpoint step .*(\([0-9.]* s\))$/\1/p' "$out" | paste -sd/ -)
    [ "$(grep -c "^checkpoint step" "$out")" = 2 ] && "$MESHMOE" ckpt verify "$T/nodes2" >/dev/null 2>&1 &&
      ok "job $id wrote its checkpoints of steps 5 and 10 (in $took) and they verify" ||
      bad "job $id: checkpoints: $(ls "$T/nodes2/ckpt" 2>/dev/null | tr '\n' ' ')"
    timeout 300 "$ROOT/tools/fake-nodes.sh" "$MESHMOE" train "$T/deck.toml" "${tiny[@]}" --set checkpoint.every=0 \
      --set run.out_dir="$T/nodes2-mpirun" >"$T/nodes2-mpirun.log" 2>&1 || tail -5 "$T/nodes2-mpirun.log"
    timeout 300 "$MESHMOE" train "$T/deck.toml" "${tiny[@]}" --set mesh.data=1 --set checkpoint.every=0 \
      --set run.out_dir="$T/nodes2-one" >"$T/nodes2-one.log" 2>&1 || tail -5 "$T/nodes2-one.log"
    if (cd "$ROOT" && /usr/bin/python3 - "$T" >"$T/nodes2-compare.out" 2>&1 <<'PY'
import sys, h5py
sys.path.insert(0, "tests/lib")
from compare_runs import compare_scalars, compare_routing
T = sys.argv[1]
keys = ["loss", "aux_loss", "z_loss", "grad_norm"]  # the deck has no evaluation
job = h5py.File(f"{T}/nodes2/metrics.h5", "r")
bad = compare_scalars(h5py.File(f"{T}/nodes2-mpirun/metrics.h5", "r"), job, "slurm vs mpirun", tol=0, keys=keys)
one = h5py.File(f"{T}/nodes2-one/metrics.h5", "r")
bad += compare_scalars(one, job, "slurm vs 1 rank", tol=1e-5, keys=keys) + compare_routing(one, job, "slurm vs 1 rank")
sys.exit(1 if bad else 0)
PY
    ); then ok "job $id: losses bitwise those of mpirun on the fake nodes, within 1e-5 of one rank's"
    else bad "job $id: losses differ from mpirun's on the fake nodes or from one rank's"; cat "$T/nodes2-compare.out"; fi
  else bad "submit.sh --nodes 2: job $id ended $state"; tail -20 "$out" 2>/dev/null; fi

  "$ROOT/jobscripts/submit.sh" --nodes 3 "$T/deck.toml" --set mesh.data=4 -- --parsable >"$T/nodes3.out" 2>&1
  rc=$?
  [ "$rc" = 2 ] && grep -q "needs 4 ranks, which 3 nodes cannot hold evenly" "$T/nodes3.out" &&
    ok "submit.sh --nodes 3 for 4 ranks: refused before submitting (exit 2)" || { bad "submit.sh --nodes 3: exit $rc"; cat "$T/nodes3.out"; }
  id=$(sbatch --parsable --nodes=2 --ntasks-per-node=1 --export=ALL,MESHMOE="$MESHMOE" \
    "$ROOT/jobscripts/train-cpu.sbatch" "$T/deck.toml" --set mesh.data=4 --set run.out_dir="$T/nodes-bad")
  state=$(wait_job_within "$id" 120 120)
  out="$T/two/meshmoe-$id.out"
  [ "$state" = FAILED ] && grep -q "needs 4 ranks but the job has 2 (2 nodes" "$out" && [ ! -e "$T/nodes-bad" ] &&
    ok "2 nodes x 1 rank for a 4-rank mesh: job $id stops with exit 2 before srun" ||
    { bad "2 nodes x 1 rank: job $id ended $state"; tail -5 "$out"; }
else
  bad "could not start a two-node Slurm"
fi

cd "$ROOT"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
