#!/usr/bin/env bash
# On a GPU machine, in the working tree, with the bundle of tools/gpu-bundle.sh at .gpu/meshmoe-gpu.tar.xz
# (docs/gpu.md): unpacks it, then runs the named stages in order, each with its own time limit,
# logs under LOGS (default runs/gpu-check):
#   catch          the [cuda] and [nccl] Catch cases             (CATCH_TIMEOUT, default 180 s)
#   train          tests/scripts/gpu_train.sh                    (TRAIN_TIMEOUT, default 240 s)
#   probe          bench/cuda_gemm_probe.cu (packed as gemm_probe): cuBLAS's bf16 GEMM, rounded and
#                  not, at the dense deck's shapes and at a new M each call (PROBE_TIMEOUT, default 60 s)
#   comm           meshmoe bench-comm --device cuda over every GPU of the machine (one rank each):
#                  NCCL's all_reduce and all_to_all bus bandwidth, 1 MiB to 256 MiB (COMM_TIMEOUT, default 120 s)
#   bench[:DECKS]  bench/gpu.sh on DECKS (comma-separated; default all), results in LOGS/bench
#                  (BENCH_TIMEOUT, default 600 s; bench/gpu.sh's variables apply)
# Usage: tools/gpu-check.sh [STAGE...]   (default: catch train bench); exit 1 when a test stage fails.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${LOGS:-runs/gpu-check}
mkdir -p build-gpu "$LOGS"
tar -xJf .gpu/meshmoe-gpu.tar.xz -C build-gpu || exit 1
[ -s .gpu/gpu-bench.h5 ] || { [ -s .gpu/gpu-bench.h5.xz ] && xz -dk .gpu/gpu-bench.h5.xz; }
source build-gpu/env.sh
export MESHMOE_PYTHON=${MESHMOE_PYTHON:-python3} MESHMOE=build-gpu/meshmoe BUILD=build-gpu
export PMIX_MCA_pcompress_base_silence_warning=1
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,driver_version --format=csv
build-gpu/meshmoe --version
[ $# -gt 0 ] || set -- catch train bench
status=0
for stage in "$@"; do
  start=$SECONDS
  case "$stage" in
    catch)
      echo "== [cuda] and [nccl] Catch cases"
      timeout "${CATCH_TIMEOUT:-180}" build-gpu/meshmoe_tests '[cuda],[nccl]' --durations yes >"$LOGS/catch-cuda.log" 2>&1
      rc=$?; grep -E "^[0-9.]+ s:|passed|failed|FAILED" "$LOGS/catch-cuda.log" | tail -15; [ $rc = 0 ] || status=1 ;;
    train)
      echo "== tests/scripts/gpu_train.sh"
      timeout "${TRAIN_TIMEOUT:-240}" tests/scripts/gpu_train.sh >"$LOGS/gpu_train.log" 2>&1
      rc=$?; grep -v -i "pmix\|^$" "$LOGS/gpu_train.log" | tail -8; [ $rc = 0 ] || status=1 ;;
    probe)
      echo "== bench/cuda_gemm_probe.cu"
      timeout "${PROBE_TIMEOUT:-60}" build-gpu/gemm_probe 2>&1 | tee "$LOGS/probe.log"
      rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1 ;;
    comm)
      gpus=$(nvidia-smi -L | grep -c "^GPU")
      echo "== bench-comm through NCCL on $gpus GPU(s)"
      timeout "${COMM_TIMEOUT:-120}" mpirun -np "$gpus" build-gpu/meshmoe bench-comm --device cuda --ops all_reduce,all_to_all \
        --sizes 1M,16M,256M -o "$LOGS/bench-comm-nccl.h5" 2>&1 | grep -v -i pmix | tee "$LOGS/bench-comm-nccl.log"
      rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1 ;;
    bench|bench:*)
      decks=${stage#bench}; decks=${decks#:}
      echo "== bench/gpu.sh ${decks:-all decks}"
      d=${decks//,/ }
      BENCH_OUT=$LOGS/bench DECKS="${d:-${DECKS:-}}" timeout "${BENCH_TIMEOUT:-600}" bench/gpu.sh 2>&1 |
        grep -v -i "pmix\|^$" | tee -a "$LOGS/bench.log"
      rc=0 ;;
    *) echo "gpu-check: unknown stage $stage"; exit 2 ;;
  esac
  echo "-- $stage: exit $rc, $((SECONDS - start)) s"
done
exit $status
