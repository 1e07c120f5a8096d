#!/usr/bin/env bash
# Sparse upcycling on gettext (Komatsuzaki et al. 2023; docs/export.md "Sparse upcycling"): the
# dense tiny deck trained DENSE_STEPS steps, then three continuations of MORE steps each, with
# the same data, batch and schedule:
#   dense-continued  the dense model, --init-from its checkpoint (the optimizer state restarts)
#   switch-upcycled  the Switch tiny deck (top-1, E = 8, every other block), --init-from the dense
#                    checkpoint --upcycle (each expert the dense feed-forward, the router fresh)
#   switch-scratch   the Switch tiny deck from its initialisation, DENSE_STEPS + MORE steps
# Validation loss every EVAL steps (eval.examples_per_language = 8: every language); the curves
# in one figure: bench/upcycle_plot.py.  NP=2 DENSE_STEPS=150 MORE=100 EVAL=25 bench/upcycle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
NP=${NP:-2}
DENSE_STEPS=${DENSE_STEPS:-150}
MORE=${MORE:-100}
EVAL=${EVAL:-25}
OUT=${OUT:-runs/bench-upcycle}
ensure_gettext_data
mkdir -p "$OUT"
common=(--set mesh.data="$NP" --set eval.every="$EVAL" --set eval.batches=8 --set checkpoint.every=0 --set optim.warmup_steps=30)
run() {  # run NAME DECK STEPS ARGS...
  local name=$1 deck=$2 steps=$3; shift 3
  echo "== $name: $steps steps on $NP ranks"
  mpirun -np "$NP" $M train "$deck" "${common[@]}" --set run.steps="$steps" --set run.out_dir="$OUT/$name" "$@" |
    grep -E '^(init|eval|done)' | tail -4
}
# REUSE_DENSE=1: keep $OUT/dense from an earlier call (its checkpoint at DENSE_STEPS).
[ "${REUSE_DENSE:-0}" = 1 ] || run dense inputs/m4-dense-tiny.toml "$DENSE_STEPS"
# The three continuations at once (the losses do not depend on the timing; only they are compared).
run dense-continued inputs/m4-dense-tiny.toml "$MORE" --init-from "$OUT/dense" >"$OUT/dense-continued.out" &
run switch-upcycled inputs/m4-switch-tiny.toml "$MORE" --init-from "$OUT/dense" --upcycle >"$OUT/switch-upcycled.out" &
run switch-scratch inputs/m4-switch-tiny.toml $((DENSE_STEPS + MORE)) >"$OUT/switch-scratch.out" &
wait
cat "$OUT"/dense-continued.out "$OUT"/switch-upcycled.out "$OUT"/switch-scratch.out
/usr/bin/python3 bench/upcycle_plot.py "$OUT" "$DENSE_STEPS" -o "$OUT/upcycle.png"
