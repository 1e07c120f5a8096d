#!/usr/bin/env bash
# `make bench`: the tiny M4-style comparison (GShard section 4 in miniature): the dense, Switch (top-1) and GShard (top-2)
# decks, FLOP-matched, trained for the same steps on the same data; prints validation loss and step
# time of each, as ratios against the dense model measured in the same run.
#   NP=2 STEPS=300 bench/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
NP=${NP:-2}
STEPS=${STEPS:-300}
ensure_gettext_data
runs=()
for name in dense switch gshard; do
  out=runs/bench-m4-$name-tiny
  echo "== m4-$name-tiny: $STEPS steps on $NP ranks (mesh.data=$NP)"
  mpirun -np "$NP" $M train inputs/m4-$name-tiny.toml --set mesh.data=$NP --set run.steps=$STEPS \
    --set run.out_dir=$out --set eval.every=$STEPS --set eval.batches=32 | grep -E '^(step|eval|done)' | tail -3
  runs+=("$out")
done
/usr/bin/python3 bench/summarize.py "${runs[@]}"
