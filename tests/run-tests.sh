#!/usr/bin/env bash
# Runs every test of `make check` and ends with the line "N passed, M failed" (test cases summed
# over all runs). Exits non-zero when anything failed.
#   1. build/meshmoe_tests (Catch2) on 1 rank: every test case;
#   2. the test cases tagged [mpi] again on 2 and on 4 ranks (--oversubscribe);
#   3. every tests/scripts/*.sh (command-line, HDF5 read-back with h5py, PyTorch reference, ...),
#      each one test case, pass = exit 0.
# Usage: tests/run-tests.sh [SCRIPT-GLOB]   (e.g. 'deck*' runs only matching scripts, no Catch runs)
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/env.sh
BUILD=${BUILD:-build}
export MESHMOE="$PWD/$BUILD/meshmoe" MESHMOE_TESTS="$PWD/$BUILD/meshmoe_tests"
export MESHMOE_TEST_TMPDIR=$(mktemp -d /tmp/meshmoe-tests.XXXXXX)
logs="$BUILD/test-logs"; rm -rf "$logs"; mkdir -p "$logs"
passed=0; failed=0; failures=()
only_scripts=${1:-}

run_catch() {  # np, catch args...
  local np=$1; shift
  local dir="$logs/catch-np$np"; mkdir -p "$dir"
  echo "== meshmoe_tests on $np rank(s) $*"
  # Catch prints only failures and its totals; show them (bounded), full text in the log.
  MESHMOE_TEST_LOGDIR="$PWD/$dir" timeout 1200 mpirun -np "$np" "$MESHMOE_TESTS" --use-colour no "$@" >"$dir/rank0.log" 2>&1
  tail -n 150 "$dir/rank0.log"
  local line p f
  line=$(grep -E '^meshmoe_tests np=[0-9]+: [0-9]+ passed, [0-9]+ failed' "$dir/rank0.log" | tail -1)
  if [ -z "$line" ]; then
    echo "!! meshmoe_tests on $np ranks did not finish (crash or timeout); counted as one failure"
    failed=$((failed + 1)); failures+=("meshmoe_tests np=$np (no summary)"); return
  fi
  p=$(sed -E 's/.*: ([0-9]+) passed.*/\1/' <<<"$line"); f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")
  [ "$f" -gt 0 ] && failures+=("meshmoe_tests np=$np: $f test case(s), see $dir")
  passed=$((passed + p)); failed=$((failed + f))
}

if [ -z "$only_scripts" ]; then
  run_catch 1
  run_catch 2 '[mpi]'
  run_catch 4 '[mpi]'
fi

for t in tests/scripts/${only_scripts:-*}.sh; do
  [ -e "$t" ] || continue
  name=$(basename "$t" .sh)
  start=$(date +%s)
  if timeout 900 bash "$t" >"$logs/$name.log" 2>&1; then
    passed=$((passed + 1)); echo "ok   $name ($(( $(date +%s) - start ))s)"
  else
    failed=$((failed + 1)); failures+=("$name, see $logs/$name.log"); echo "FAIL $name ($(( $(date +%s) - start ))s)"; tail -25 "$logs/$name.log" | sed 's/^/     /'
  fi
done

rm -rf "$MESHMOE_TEST_TMPDIR"
echo
for f in "${failures[@]}"; do echo "failed: $f"; done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
