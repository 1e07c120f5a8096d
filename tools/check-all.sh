#!/usr/bin/env bash
# `make check-all`: every test (tests/TIERS.md), and the line "N passed, M failed" summed over
#   1. make check (the quick tier: host build, Catch on 1, 2 and 4 ranks, a script of each kind);
#   2. the CUDA build (CUDA=1 in $BUILD-cuda) where nvcc is found: it must compile and link, and
#      its Catch suite runs on the host (the [cuda] and [nccl] cases skip without a GPU);
#   3. the scripts of tier `all`, then the floating-point comparisons under a second OpenBLAS kernel;
#   4. the Slurm job scripts on a real single-node Slurm (tests/slurm/run.sh), with the CUDA build
#      where there is one.
# Each part's own summary line is kept in its log; a part that ends without one counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
JOBS=${JOBS:-$(nproc)}
CUDA_BUILD=$BUILD-cuda
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT
total_p=0 total_f=0 rc=0 cuda_ok=0
summary() {  # log: adds the log's last "N passed, M failed" line to the totals
  local line p f
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -1)
  if [ -z "$line" ]; then total_f=$((total_f + 1)); echo "check-all: $2 ended without a summary: one failure"; return; fi
  read -r p _ f _ <<<"${line//,/}"
  total_p=$((total_p + p)); total_f=$((total_f + f))
}
part() { echo; echo "==== check-all: $*"; }
start=$(date +%s)
stamp() { echo "(check-all: $(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s so far)"; }

part "1/4 make check"
make --no-print-directory check BUILD="$BUILD" JOBS="$JOBS" 2>&1 | tee "$logdir/check.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
summary "$logdir/check.log" "make check"; stamp

part "2/4 the CUDA build ($CUDA_BUILD)"
if [ -n "$NVCC" ]; then
  if make --no-print-directory -j"$JOBS" CUDA=1 BUILD="$CUDA_BUILD" tests >"$logdir/cuda-build.log" 2>&1; then
    echo "ok   CUDA=1 build"; total_p=$((total_p + 1)); cuda_ok=1; export CUDA_BUILD
  else
    tail -40 "$logdir/cuda-build.log"; echo "FAIL CUDA=1 build"; total_f=$((total_f + 1)); rc=1
  fi
else
  echo "nvcc not found: no CUDA build here (it needs /usr/local/cuda or nvcc on PATH)"
fi
stamp

part "3/4 the scripts of tier all, the second OpenBLAS kernel"
BUILD="$BUILD" JOBS="$JOBS" tests/run-tests.sh --tier all --rest 2>&1 | tee "$logdir/all.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
summary "$logdir/all.log" "the tier all"; stamp

part "4/4 Slurm job scripts"
# With the CUDA build the GPU job meets the stand-in GPU of the test node (no CUDA device visible).
slurm_build=$BUILD; [ "$cuda_ok" = 1 ] && slurm_build=$CUDA_BUILD
BUILD="$slurm_build" tests/slurm/run.sh 2>&1 | tee "$logdir/slurm.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
summary "$logdir/slurm.log" "the Slurm tests"; stamp

echo
echo "check-all: $(( ($(date +%s) - start) / 60 )) min"
echo "$total_p passed, $total_f failed"
[ "$rc" -eq 0 ] && [ "$total_f" -eq 0 ]
