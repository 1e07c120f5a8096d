#!/usr/bin/env bash
# Host throughput of data parallelism against BLAS threads on a GPT-2 124M-shaped dense model: one
# rank with 2 BLAS threads, and 2 data ranks with 1 each, their gradient all-reduce after the
# backward (run.grad_bucket_mb = 0) through the shared-memory window (run.shm_collectives, the
# default) or MPI's all-reduce, or overlapped with it (25 MiB buckets, MPI's non-blocking
# all-reduce); and with optim.shard_state (reduce-scatter, all-gather) on either path. Interleaved
# repetitions; prints the median tokens/s of steps 2..STEPS of each run and the median over runs.
#   REPS=3 STEPS=10 bench/overlap.sh
#   ROWS="1rank-2threads 2ranks-shm 2ranks-mpi" bench/overlap.sh     (a subset, in this order)
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/env.sh
BUILD=${BUILD:-build}
REPS=${REPS:-3}
STEPS=${STEPS:-10}
OUT=${OUT:-/dev/shm/meshmoe-overlap}
DECK=bench/decks/gpt2-124m-dense.toml
TWO="mpirun -np 2 $BUILD/meshmoe train $DECK --set mesh.data=2 --set run.threads=1"
declare -A cmd=(
  [1rank-2threads]="mpirun --map-by slot:PE=2 -np 1 $BUILD/meshmoe train $DECK --set run.threads=2"
  [2ranks-shm]="$TWO --set run.grad_bucket_mb=0 --set run.shm_collectives=true"
  [2ranks-mpi]="$TWO --set run.grad_bucket_mb=0 --set run.shm_collectives=false"
  [2ranks-overlap]="$TWO --set run.grad_bucket_mb=25 --set run.shm_collectives=false"
  [2ranks-shard-shm]="$TWO --set run.grad_bucket_mb=0 --set optim.shard_state=true --set run.shm_collectives=true"
  [2ranks-shard-mpi]="$TWO --set run.grad_bucket_mb=0 --set optim.shard_state=true --set run.shm_collectives=false"
)
read -r -a order <<< "${ROWS:-1rank-2threads 2ranks-shm 2ranks-mpi 2ranks-overlap 2ranks-shard-shm 2ranks-shard-mpi}"
median() { /usr/bin/python3 -c 'import sys, statistics; print("%.1f" % statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
declare -A all
for rep in $(seq "$REPS"); do
  for name in "${order[@]}"; do
    rm -rf "$OUT"
    ${cmd[$name]} --set run.steps="$STEPS" --set run.out_dir="$OUT" --set checkpoint.at_end=false > /dev/null
    read -r tps wait opt < <(/usr/bin/python3 -c '
import h5py, statistics, sys
f = h5py.File(sys.argv[1], "r")
m = lambda k: statistics.median(f[k][1:])
print("%.1f %.3f %.3f" % (m("tokens_per_s"), m("time/grad_allreduce"), m("time/optimizer")))' "$OUT/metrics.h5")
    echo "rep $rep  $name  tokens/s $tps  grad_allreduce $wait s/step  optimizer (with the all-gather) $opt s/step  (load $(cut -d' ' -f1 /proc/loadavg))"
    all[$name]="${all[$name]:-} $tps"
  done
done
rm -rf "$OUT"
for name in "${order[@]}"; do echo "median $name: $(median ${all[$name]}) tokens/s (runs:${all[$name]})"; done
