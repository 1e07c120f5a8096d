#!/usr/bin/env bash
# Submits a deck with --ntasks taken from its mesh: jobscripts/submit.sh [--gpu] DECK [--set k=v]... [-- SBATCH-OPTIONS...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
script=$here/train-cpu.sbatch
[ "${1:-}" = "--gpu" ] && { script=$here/train-gpu.sbatch; shift; }
args=(); sbatch_opts=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; sbatch_opts=("$@"); break; fi
  args+=("$1"); shift
done
MESHMOE=${MESHMOE:-$PWD/build/meshmoe}
n=$("$MESHMOE" plan --ranks "${args[@]}")
exec sbatch --ntasks="$n" --export=ALL,MESHMOE="$MESHMOE" "${sbatch_opts[@]}" "$script" "${args[@]}"
