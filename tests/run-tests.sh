#!/usr/bin/env bash
# Runs the tests of one tier and ends with the line "N passed, M failed" (test cases summed over
# all runs). Exits non-zero when anything failed. Which test is in which tier, and why, is the
# table of tests/TIERS.md; this script reads it.
#   check  (`make check`): meshmoe_tests (Catch2) on 1 rank, its [mpi] cases on 2 and 4 ranks, and
#          the scripts of tier `check`;
#   all    (`make check-all`): those, every other script, then each test marked for the second
#          OpenBLAS kernel again under OPENBLAS_CORETYPE=<a kernel other than the native one>
#          (tools/blas-kernels.sh), and the Catch suite of the CUDA build when $CUDA_BUILD has one.
# Each script is one test case, pass = exit 0; its log is $BUILD/test-logs/<name>.log (a second
# kernel's run: <name>@<kernel>.log). Scripts run JOBS at a time (default 2), longest first; one
# marked `alone` in the table runs with nothing else beside it (it times itself).
# Usage: tests/run-tests.sh [--tier check|all] [--rest] [-j JOBS] [SCRIPT-GLOB]
#   --rest: with --tier all, only what `all` adds to `check` (tools/check-all.sh runs make check
#           first); a SCRIPT-GLOB runs only the matching scripts (any tier), no Catch runs,
#           e.g. tests/run-tests.sh 'ckpt*'.
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/env.sh
BUILD=${BUILD:-build}
tier=check jobs=${JOBS:-2} only_scripts="" rest=0
while [ $# -gt 0 ]; do
  case $1 in
    --tier) tier=$2; shift 2 ;;
    --rest) rest=1; shift ;;
    -j) jobs=$2; shift 2 ;;
    -*) echo "run-tests: unknown option $1" >&2; exit 2 ;;
    *) only_scripts=$1; shift ;;
  esac
done
case $tier in check|all) ;; *) echo "run-tests: --tier must be check or all" >&2; exit 2 ;; esac
export MESHMOE="$PWD/$BUILD/meshmoe" MESHMOE_TESTS="$PWD/$BUILD/meshmoe_tests"
tmp_root=$(mktemp -d /tmp/meshmoe-tests.XXXXXX)
logs="$BUILD/test-logs"; [ "$rest" = 1 ] || rm -rf "$logs"; mkdir -p "$logs"  # --rest keeps make check's logs
passed=0; failed=0; failures=()

# The table: rows "| `name` | tier | seconds | second kernel | alone | why |".
declare -A row_tier row_secs row_kernel row_alone
while IFS='|' read -r _ name t secs kern alone _; do
  name=$(tr -d ' `' <<<"$name")
  row_tier[$name]=$(tr -d ' ' <<<"$t"); row_secs[$name]=$(tr -d ' ' <<<"$secs")
  row_kernel[$name]=$(tr -d ' ' <<<"$kern"); row_alone[$name]=$(tr -d ' ' <<<"$alone")
done < <(grep -E '^\| `[a-z0-9_-]+` \|' tests/TIERS.md)

in_tier() {  # name: whether this run runs it
  if [ "$rest" = 1 ]; then [ "${row_tier[$1]}" = all ]; else [ "$tier" = all ] || [ "${row_tier[$1]}" = check ]; fi
}

run_catch() {  # label tests-binary np kernel catch-args...
  local label=$1 bin=$2 np=$3 kernel=$4; shift 4
  local dir="$logs/$label"; mkdir -p "$dir"
  echo "== $label: meshmoe_tests on $np rank(s) $*${kernel:+ (OPENBLAS_CORETYPE=$kernel)}"
  # Catch prints only failures and its totals; show them (bounded), full text in the log.
  OPENBLAS_CORETYPE=${kernel:-${OPENBLAS_CORETYPE:-}} MESHMOE_TEST_LOGDIR="$PWD/$dir" \
    MESHMOE_TEST_TMPDIR="$tmp_root/$label" timeout 1200 mpirun -np "$np" "$bin" --use-colour no "$@" >"$dir/rank0.log" 2>&1
  tail -n 150 "$dir/rank0.log" | grep -vE '^$'
  local line p f
  line=$(grep -E '^meshmoe_tests np=[0-9]+: [0-9]+ passed, [0-9]+ failed' "$dir/rank0.log" | tail -1)
  if [ -z "$line" ]; then
    echo "!! $label did not finish (crash or timeout); counted as one failure"
    failed=$((failed + 1)); failures+=("$label (no summary), see $dir"); return
  fi
  p=$(sed -E 's/.*: ([0-9]+) passed.*/\1/' <<<"$line"); f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")
  [ "$f" -gt 0 ] && failures+=("$label: $f test case(s), see $dir")
  passed=$((passed + p)); failed=$((failed + f))
}

catch_runs() {  # kernel: the three Catch runs of every tier
  local k=$1 sfx=${1:+@$1}
  run_catch "catch-np1$sfx" "$MESHMOE_TESTS" 1 "$k"
  run_catch "catch-np2$sfx" "$MESHMOE_TESTS" 2 "$k" '[mpi]'
  run_catch "catch-np4$sfx" "$MESHMOE_TESTS" 4 "$k" '[mpi]'
}

# Scripts: a pool of $jobs background jobs; each job writes its exit code to $tmp_root/<id>.rc.
declare -A started
running=0
finish_one() {  # waits for one job and reports it
  local pid id rc
  wait -n -p pid || true
  [ -n "${pid:-}" ] || return 0
  id=${started[$pid]}; unset "started[$pid]"; running=$((running - 1))
  rc=$(cat "$tmp_root/$id.rc" 2>/dev/null || echo 1)
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1)); echo "ok   $id ($(cat "$tmp_root/$id.secs")s)"
  else
    failed=$((failed + 1)); failures+=("$id, see $logs/$id.log")
    echo "FAIL $id ($(cat "$tmp_root/$id.secs" 2>/dev/null || echo ?)s)"; tail -25 "$logs/$id.log" | sed 's/^/     /'
  fi
}
start_script() {  # name kernel
  local name=$1 kernel=$2 id=$1${2:+@$2}
  if [ "${row_alone[$name]:-}" = yes ]; then
    while [ "$running" -gt 0 ]; do finish_one; done
  fi
  while [ "$running" -ge "$jobs" ]; do finish_one; done
  (
    start=$(date +%s)
    mkdir -p "$tmp_root/$id"
    OPENBLAS_CORETYPE=${kernel:-${OPENBLAS_CORETYPE:-}} MESHMOE_TEST_TMPDIR="$tmp_root/$id" \
      timeout 900 bash "tests/scripts/$name.sh" >"$logs/$id.log" 2>&1
    echo $? >"$tmp_root/$id.rc"; echo $(( $(date +%s) - start )) >"$tmp_root/$id.secs"
  ) &
  started[$!]=$id; running=$((running + 1))
  if [ "${row_alone[$name]:-}" = yes ]; then finish_one; fi
}
run_scripts() {  # kernel name...: longest first by the table's seconds
  local kernel=$1; shift
  local name
  for name in $(for n in "$@"; do echo "${row_secs[$n]:-999} $n"; done | sort -rn | cut -d' ' -f2); do
    start_script "$name" "$kernel"
  done
  while [ "$running" -gt 0 ]; do finish_one; done
}

scripts=()
unlisted=()
for t in tests/scripts/${only_scripts:-*}.sh; do
  [ -e "$t" ] || continue
  name=$(basename "$t" .sh)
  if [ -z "${row_tier[$name]:-}" ]; then unlisted+=("$name"); continue; fi
  if [ -n "$only_scripts" ] || in_tier "$name"; then scripts+=("$name"); fi
done
for name in "${unlisted[@]}"; do
  echo "FAIL $name: not in the table of tests/TIERS.md (every script needs a tier)"
  failed=$((failed + 1)); failures+=("$name: not in tests/TIERS.md")
done

if [ -z "$only_scripts" ] && [ "$rest" = 0 ]; then catch_runs ""; fi
run_scripts "" "${scripts[@]}"

if [ "$tier" = all ] && [ -z "$only_scripts" ]; then
  second=$(tools/blas-kernels.sh second)
  echo "== the floating-point comparisons again under a second OpenBLAS kernel: $second (native: $(tools/blas-kernels.sh native))"
  catch_runs "$second"
  again=()
  for name in "${!row_tier[@]}"; do
    [ "${row_kernel[$name]}" = yes ] && [ -e "tests/scripts/$name.sh" ] && again+=("$name")
  done
  run_scripts "$second" "${again[@]}"
  if [ -n "${CUDA_BUILD:-}" ] && [ -x "$CUDA_BUILD/meshmoe_tests" ]; then
    run_catch "catch-np1-cuda-build" "$PWD/$CUDA_BUILD/meshmoe_tests" 1 ""
  fi
fi

rm -rf "$tmp_root"
echo
for f in "${failures[@]}"; do echo "failed: $f"; done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
