#!/usr/bin/env bash
# Host throughput of data parallelism against BLAS threads on a GPT-2 124M-shaped dense model: one
# rank with 2 BLAS threads, and 2 data ranks with 1 each, their gradient all-reduce after the
# backward (run.grad_bucket_mb = 0) or overlapped with it (25 MiB buckets). Interleaved
# repetitions; prints the median tokens/s of steps 2..STEPS of each run and the median over runs.
#   REPS=3 STEPS=10 bench/overlap.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/env.sh
BUILD=${BUILD:-build}
REPS=${REPS:-3}
STEPS=${STEPS:-10}
OUT=${OUT:-/dev/shm/meshmoe-overlap}
DECK=bench/decks/gpt2-124m-dense.toml
declare -A cmd=(
  [1rank-2threads]="mpirun --map-by slot:PE=2 -np 1 $BUILD/meshmoe train $DECK --set run.threads=2"
  [2ranks-blocking]="mpirun -np 2 $BUILD/meshmoe train $DECK --set mesh.data=2 --set run.threads=1 --set run.grad_bucket_mb=0"
  [2ranks-overlap]="mpirun -np 2 $BUILD/meshmoe train $DECK --set mesh.data=2 --set run.threads=1 --set run.grad_bucket_mb=25"
)
order=(1rank-2threads 2ranks-blocking 2ranks-overlap)
median() { /usr/bin/python3 -c 'import sys, statistics; print("%.1f" % statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
declare -A all
for rep in $(seq "$REPS"); do
  for name in "${order[@]}"; do
    rm -rf "$OUT"
    ${cmd[$name]} --set run.steps="$STEPS" --set run.out_dir="$OUT" > /dev/null
    read -r tps wait < <(/usr/bin/python3 -c '
import h5py, statistics, sys
f = h5py.File(sys.argv[1], "r")
print("%.1f %.3f" % (statistics.median(f["tokens_per_s"][1:]), statistics.median(f["time/grad_allreduce"][1:])))' "$OUT/metrics.h5")
    echo "rep $rep  $name  tokens/s $tps  grad_allreduce wait $wait s/step  (load $(cut -d' ' -f1 /proc/loadavg))"
    all[$name]="${all[$name]:-} $tps"
  done
done
rm -rf "$OUT"
for name in "${order[@]}"; do echo "median $name: $(median ${all[$name]}) tokens/s (runs:${all[$name]})"; done
