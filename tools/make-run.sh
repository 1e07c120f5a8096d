#!/usr/bin/env bash
# `make run`: the default job. Prepares the gettext dataset if absent, trains the Switch deck on
# 2 ranks (mesh.data = 2 when the trainer supports it), and prints the validation table.
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/env.sh
BUILD=${BUILD:-build}
M=$BUILD/meshmoe
DECK=${DECK:-inputs/m4-switch-tiny.toml}
NP=${NP:-1}
if [ ! -s data/gettext.h5 ]; then
  mkdir -p data
  $M prep gettext -o data/gettext.h5.tmp && mv data/gettext.h5.tmp data/gettext.h5
fi
mpirun -np "$NP" $M train "$DECK" "$@"
