#!/usr/bin/env bash
# `make run`: the default job. Prepares the gettext dataset if absent, trains the Switch deck on
# NP ranks (mesh.data = NP, default 2), and prints the validation loss of the 10 largest and the
# 10 smallest languages. Extra arguments go to `meshmoe train` (e.g. --set run.steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/env.sh
BUILD=${BUILD:-build}
M=$BUILD/meshmoe
DECK=${DECK:-inputs/m4-switch-tiny.toml}
NP=${NP:-2}
if [ ! -s data/gettext.h5 ]; then
  mkdir -p data
  $M prep gettext -o data/gettext.h5.tmp && mv data/gettext.h5.tmp data/gettext.h5
fi
mpirun -np "$NP" $M train "$DECK" --set mesh.data="$NP" "$@" | tee /tmp/meshmoe-run.$$.log | grep -v -E '^([a-z_0-9]+ = |\[|#|$)'
run_dir=$(sed -n 's/^meshmoe train: run .* -> //p' /tmp/meshmoe-run.$$.log | head -1)
rm -f /tmp/meshmoe-run.$$.log
echo
$PYTHON postprocess/lang_table.py "$run_dir" --top 10
