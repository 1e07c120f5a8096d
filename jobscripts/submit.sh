#!/usr/bin/env bash
# Submits a deck with --ntasks taken from its mesh:
#   jobscripts/submit.sh [--gpu] [--nodes N] DECK [--set k=v]... [-- SBATCH-OPTIONS...]
# With --nodes N the job gets N nodes and mesh-ranks / N ranks on each (--ntasks-per-node), which
# must divide evenly (exit 2 otherwise); a warning says when a tensor group would span nodes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
script=$here/train-cpu.sbatch
[ "${1:-}" = "--gpu" ] && { script=$here/train-gpu.sbatch; shift; }
nodes=""
if [ "${1:-}" = "--nodes" ]; then nodes=${2:?--nodes needs a number}; shift 2; fi
args=(); sbatch_opts=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; sbatch_opts=("$@"); break; fi
  args+=("$1"); shift
done
MESHMOE=${MESHMOE:-$PWD/build/meshmoe}
n=$("$MESHMOE" plan --ranks "${args[@]}")
placement=(--ntasks="$n")
if [ -n "$nodes" ]; then
  case $nodes in ''|*[!0-9]*|0) echo "submit.sh: --nodes takes a positive number, not '$nodes'" >&2; exit 2 ;; esac
  if [ $((n % nodes)) != 0 ]; then
    echo "submit.sh: the deck's mesh needs $n ranks, which $nodes nodes cannot hold evenly; use a number of nodes that divides $n" >&2
    exit 2
  fi
  per=$((n / nodes))
  "$MESHMOE" plan --ranks --ranks-per-node "$per" "${args[@]}" >/dev/null  # warns when tensor spans nodes
  placement=(--nodes="$nodes" --ntasks-per-node="$per" --ntasks="$n")
fi
exec sbatch "${placement[@]}" --export=ALL,MESHMOE="$MESHMOE" "${sbatch_opts[@]}" "$script" "${args[@]}"
