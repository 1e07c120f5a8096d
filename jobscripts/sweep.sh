#!/usr/bin/env bash
# A Slurm job array over values of one deck key, one run directory each:
#   jobscripts/sweep.sh DECK KEY "V1 V2 ..." [--set k=v]... [-- SBATCH-OPTIONS...]
#   jobscripts/sweep.sh inputs/m4-switch-tiny.toml moe.num_experts "1 2 4 8 16"
# Run i trains with --set KEY=V_i and run.name=<deck's run.name>-<key>-<value>.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 3 ] || { echo "usage: sweep.sh DECK KEY \"V1 V2 ...\" [--set k=v]... [-- SBATCH-OPTIONS...]" >&2; exit 2; }
deck=$1 key=$2 values=$3; shift 3
args=(); sbatch_opts=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; sbatch_opts=("$@"); break; fi
  args+=("$1"); shift
done
MESHMOE=${MESHMOE:-$PWD/build/meshmoe}
read -r -a vals <<<"$values"
n=$("$MESHMOE" plan --ranks "$deck" "${args[@]}")
# Every value must give a valid deck before anything is submitted.
for v in "${vals[@]}"; do "$MESHMOE" plan --ranks "$deck" "${args[@]}" --set "$key=$v" >/dev/null; done
exec sbatch --ntasks="$n" --array=0-$((${#vals[@]} - 1)) --export=ALL,MESHMOE="$MESHMOE",MESHMOE_JOBSCRIPTS="$here",SWEEP_KEY="$key",SWEEP_VALUES="$values" \
  "${sbatch_opts[@]}" "$here/sweep-task.sbatch" "$deck" "${args[@]}"
