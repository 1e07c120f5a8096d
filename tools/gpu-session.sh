#!/usr/bin/env bash
# The one script a session with a GPU runs (docs/gpu.md "A GPU session"): builds nothing there, and
# within SESSION_SECONDS (default 470, under the 8 minutes a session plans for one call) runs, in
# this order (the measurements before gpu_train.sh, which gets a reserved TRAIN_SECONDS at the end),
# each stage with its own limit cut to what the session has left:
#   setup   unpack the bundle (.gpu/meshmoe-gpu.tar.xz, tools/gpu-bundle.sh) into build-gpu; unpack
#           each .gpu/*.h5.xz carried beside it (the decks' data sets, prepared here)
#   catch   the [cuda] and [nccl] Catch cases                             (CATCH_SECONDS, 100)
#   bench   bench/gpu.sh on the DECKs in bf16: meshmoe and the eager PyTorch peer on each deck,
#           then the compile peer on each (bench/torch_peer_best.py), then a 3-step
#           MESHMOE_DEVICE_PROFILE=1 run of each; the memory each reached; appends one record per
#           deck to bench/results/gpu.json (until TRAIN_SECONDS + 20 s before the end; each run at
#           most RUN_TIMEOUT, 120 s)
#   train   tests/scripts/gpu_train.sh: GPU training against the host     (TRAIN_SECONDS, 110)
# A deck whose data set is missing is prepared there by bench/gpu.sh on all cores (the real-size
# decks' 32k vocabulary over the whole corpus: about 20 s estimated, docs/gpu.md; carry it instead).
# What comes back (OUT, the device tool's folder, else runs/gpu-session): session.log (all of the
# above), gpu.json (bench/results/gpu.json after the run: copy it over the repository's and commit),
# logs.tar.xz (every stage's logs and the bench folder without metrics.h5's, ~100 kB).
# Usage (there):  tools/gpu-session.sh DECK...     (DECK: gpu-NAME or a .toml; default large-dense large-switch8)
#         (here):  HOST=1 BUILD=build tools/gpu-session.sh DECK.toml   (a dry run on the CPU: no bundle;
#                  the [cuda] cases and gpu_train.sh skip without a GPU; bench/gpu.sh --host)
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
SESSION_SECONDS=${SESSION_SECONDS:-470}
deadline=$((start + SESSION_SECONDS))
HOST=${HOST:-0}
RESULT=${OUT:-runs/gpu-session}
LOGS=${LOGS:-runs/gpu-session-logs}
mkdir -p "$RESULT" "$LOGS"
[ $# -gt 0 ] || set -- large-dense large-switch8
left() { echo $((deadline - $(date +%s))); }
limit() { local l; l=$(($(left) - $2)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }  # limit WANT RESERVE
stage() { echo "== $1 ($(($(date +%s) - start)) s into the session, $(left) s left)"; }

main() {
stage setup
if [ "$HOST" = 1 ]; then
  export BUILD=${BUILD:-build}
else
  export BUILD=build-gpu
  mkdir -p build-gpu
  tar -xJf .gpu/meshmoe-gpu.tar.xz -C build-gpu || { echo "gpu-session: no bundle at .gpu/meshmoe-gpu.tar.xz"; exit 1; }
  source build-gpu/env.sh
  export PMIX_MCA_pcompress_base_silence_warning=1
  export MESHMOE_PYTHON=${MESHMOE_PYTHON:-python3}
  nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,driver_version --format=csv
fi
case $BUILD in /*) ;; *) BUILD=$PWD/$BUILD ;; esac
export MESHMOE=$BUILD/meshmoe MESHMOE_TESTS=$BUILD/meshmoe_tests
for x in .gpu/*.h5.xz; do
  [ -e "$x" ] && [ ! -s "${x%.xz}" ] && xz -dk "$x"
done
$MESHMOE --version || exit 1
status=0

stage catch
t=$(limit "${CATCH_SECONDS:-100}" 300)
timeout "$t" "$BUILD/meshmoe_tests" '[cuda],[nccl]' --durations yes >"$LOGS/catch-cuda.log" 2>&1
rc=$?; grep -E "^[0-9.]+ s:|passed|failed|FAILED|skipped" "$LOGS/catch-cuda.log" | tail -15
echo "-- catch: exit $rc (limit $t s)"; [ $rc = 0 ] || status=1

stage "bench: $*"
host_flag=()
[ "$HOST" = 1 ] && host_flag=(--host)
BENCH_OUT=$LOGS/bench DECKS="$*" PRECISIONS=bf16 PEERS="${PEERS:-eager compile}" PROFILE=1 \
  STEPS=${STEPS:-6} TORCH_STEPS=${TORCH_STEPS:-6} RUN_TIMEOUT=${RUN_TIMEOUT:-120} DEADLINE=$((deadline - ${TRAIN_SECONDS:-110} - 20)) \
  RESULTS_JSON=${RESULTS_JSON:-bench/results/gpu.json} bench/gpu.sh "${host_flag[@]}" 2>&1 | grep -v -i "pmix\|^$"
rc=${PIPESTATUS[0]}
echo "-- bench: exit $rc"; [ $rc = 0 ] || status=1

stage train
t=$(limit "${TRAIN_SECONDS:-110}" 15)
timeout "$t" tests/scripts/gpu_train.sh >"$LOGS/gpu_train.log" 2>&1
rc=$?; grep -v -i "pmix\|^$" "$LOGS/gpu_train.log" | tail -8
echo "-- train: exit $rc (limit $t s)"; [ $rc = 0 ] || status=1

stage "results to $RESULT"
cp "${RESULTS_JSON:-bench/results/gpu.json}" "$RESULT/gpu.json" 2>/dev/null
tar -C "$LOGS" --exclude='*.h5' -cJf "$RESULT/logs.tar.xz" .
ls -l "$RESULT"
echo "gpu-session: exit $status after $(($(date +%s) - start)) s"
return $status
}
main "$@" 2>&1 | tee "$RESULT/session.log"
exit "${PIPESTATUS[0]}"
