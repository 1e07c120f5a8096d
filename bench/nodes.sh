#!/usr/bin/env bash
# The data axis across 2 fake nodes x 2 ranks (tools/fake-nodes.sh: shared memory inside a node,
# TCP over the loopback between nodes): the hierarchical all-reduce (run.shm_collectives, the
# default; docs/ARCHITECTURE.md "Hierarchical collectives") against MPI's flat one
# (run.shm_collectives = false, bench-comm --shm off).
#  1. bench-comm's all_reduce of SIZE (default 256M bytes = 64M floats), ITERS timed calls, REPS
#     alternated passes: the best time of each path, and the bytes the loopback carried per call
#     (/proc/net/dev's transmitted count of lo, TCP/IP headers included: what crossed between the
#     nodes; nothing else should use lo while this runs).
#  2. Training the speed-switch-512 deck on mesh.data = 4 for STEPS steps, each path REPS times:
#     the median tokens/s and time/grad_allreduce of steps 2..STEPS, the loopback bytes per step
#     (start-up included) and the final losses.
#   REPS=3 bench/nodes.sh        (about 10 minutes on the 2-core build machine)
#   PARTS=comm bench/nodes.sh    (only part 1; PARTS=train only part 2)
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/env.sh
BUILD=${BUILD:-build}
REPS=${REPS:-3}
ITERS=${ITERS:-3}
SIZE=${SIZE:-256M}
STEPS=${STEPS:-6}
OUT=${OUT:-/dev/shm/meshmoe-nodes-bench}
M=$BUILD/meshmoe
mkdir -p "$OUT"
lo_bytes() { awk '$1 == "lo:" { printf "%.0f\n", $10 }' /proc/net/dev; }
PARTS=${PARTS:-comm train}

comm_part() {
  local rep path before after ms per_call
  declare -A best bytes
  for rep in $(seq "$REPS"); do
    for path in on off; do
      before=$(lo_bytes)
      tools/fake-nodes.sh "$M" bench-comm --mesh 1x4x1 --axis data --ops all_reduce --sizes "$SIZE" --iters "$ITERS" \
        --shm "$path" -o "$OUT/bc-$path.h5" >"$OUT/bc-$path.txt"
      after=$(lo_bytes)
      ms=$(awk '$3 == "all_reduce" { printf "%.1f", $4 / 1000 }' "$OUT/bc-$path.txt")
      # The check call, the 2 warm-up and the ITERS timed calls move the same bytes (lo's transmitted count).
      per_call=$(( (after - before) / (ITERS + 3) ))
      echo "pass $rep  --shm $path  all_reduce $SIZE: $ms ms, loopback $per_call bytes per call" \
        "($(grep -o 'all_reduce [a-z].*' "$OUT/bc-$path.txt" | head -1))"
      if [ -z "${best[$path]:-}" ] || awk -v a="$ms" -v b="${best[$path]}" 'BEGIN { exit !(a < b) }'; then
        best[$path]=$ms
      fi
      bytes[$path]=$per_call
    done
  done
  echo "best all_reduce $SIZE: hierarchical ${best[on]} ms, flat MPI ${best[off]} ms," \
    "ratio $(awk -v a="${best[off]}" -v b="${best[on]}" 'BEGIN { printf "%.2f", a / b }')x"
  echo "bytes over the loopback per call: hierarchical ${bytes[on]}, flat MPI ${bytes[off]}"
}

train_part() {
  local rep path before after
  for rep in $(seq "$REPS"); do
    for path in true false; do
      rm -rf "$OUT/run"
      before=$(lo_bytes)
      tools/fake-nodes.sh "$M" train bench/decks/speed-switch-512.toml --set mesh.data=4 --set run.threads=1 \
        --set run.steps="$STEPS" --set run.shm_collectives=$path --set run.out_dir="$OUT/run" \
        --set checkpoint.at_end=false --set eval.every=0 >"$OUT/train-$path.txt" 2>&1 ||
        { cat "$OUT/train-$path.txt"; exit 1; }
      after=$(lo_bytes)
      /usr/bin/python3 - "$OUT/run/metrics.h5" "$path" "$(( (after - before) / STEPS ))" <<'PY'
import h5py, statistics, sys
f = h5py.File(sys.argv[1], "r")
m = lambda k: statistics.median(f[k][1:])
print("shm_collectives=%-5s tokens/s %.0f  grad_allreduce %.1f ms/step  loopback %s bytes/step  final loss %r"
      % (sys.argv[2], m("tokens_per_s"), 1000 * m("time/grad_allreduce"), sys.argv[3], float(f["loss"][-1])))
PY
    done
  done
}

for part in $PARTS; do "${part}_part"; done
