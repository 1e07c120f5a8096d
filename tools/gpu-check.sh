#!/usr/bin/env bash
# On a GPU machine, in the working tree, with the bundle of tools/gpu-bundle.sh at .gpu/meshmoe-gpu.tar.xz
# (README "GPU"): unpacks it, then runs the GPU checks and `make bench-gpu`'s script, each with its
# own time limit, logs under LOGS (default runs/gpu-check):
#   the [cuda] Catch cases, tests/scripts/gpu_train.sh, bench/gpu.sh.
# Usage: tools/gpu-check.sh [tests|bench|all]   (default all)
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
LOGS=${LOGS:-runs/gpu-check}
mkdir -p build-gpu "$LOGS"
tar -xJf .gpu/meshmoe-gpu.tar.xz -C build-gpu || exit 1
[ -s .gpu/gpu-bench.h5 ] || { [ -s .gpu/gpu-bench.h5.xz ] && xz -dk .gpu/gpu-bench.h5.xz; }
source build-gpu/env.sh
export MESHMOE_PYTHON=${MESHMOE_PYTHON:-python3} MESHMOE=build-gpu/meshmoe BUILD=build-gpu
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,driver_version --format=csv
build-gpu/meshmoe --version
status=0
if [ "$what" != bench ]; then
  echo "== [cuda] and [nccl] Catch cases"
  timeout 180 build-gpu/meshmoe_tests '[cuda],[nccl]' >"$LOGS/catch-cuda.log" 2>&1; rc=$?
  tail -15 "$LOGS/catch-cuda.log"; echo "[cuda] exit $rc"; [ $rc = 0 ] || status=1
  echo "== gpu_train.sh"
  timeout 240 tests/scripts/gpu_train.sh >"$LOGS/gpu_train.log" 2>&1; rc=$?
  tail -12 "$LOGS/gpu_train.log"; echo "gpu_train exit $rc"; [ $rc = 0 ] || status=1
fi
if [ "$what" != tests ]; then
  echo "== bench/gpu.sh"
  BENCH_OUT=${BENCH_OUT:-$LOGS/bench} timeout "${BENCH_TIMEOUT:-600}" bench/gpu.sh 2>&1 | tee "$LOGS/bench.log"
fi
exit $status
