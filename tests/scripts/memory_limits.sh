#!/usr/bin/env bash
# The memory check before allocating (docs/user-guide.md "Memory check") and the expert-capacity clamp:
#   train with model.d_model = 1e9: exit 2 within seconds, one "error:" about the size, never
#     'max_size' or a crash;
#   run.max_memory far below the plan: exit 2 on both ranks with "the plan needs X per node (2 ranks:
#     ...), more than the Y available (run.max_memory = ...)"; a generous run.max_memory trains;
#   a bad run.max_memory in the deck file: a deck error naming file:line and the key;
#   `plan` of a huge model: parameters and optimizer state consistent (adamw state = 2 x parameters)
#     or a clean "too large" error; `plan` of the test deck reports the available memory and a fit;
#   bench-comm: --sizes 1T exits 2 naming the 1 GiB limit; --sizes 1G over 2 ranks with
#     --max-memory 1G is refused before allocating;
#   in a cgroup v1 memory cgroup of 768 MiB (when one can be created, else skipped with the reason):
#     a plan of ~13 GiB and bench-comm --sizes 1G are refused naming the cgroup's limit file;
#   moe.capacity_factor_train = 1e300 trains 2 steps and drops nothing (metrics.h5
#     /moe/*/dropped_fraction all 0; the capacity used to overflow to 1).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "memory_limits: $M not built"; exit 1; }
test_dir memory_limits
tiny_data "$T"
write_tiny_deck "$T" run.steps=2 optim.batch_size=4 optim.warmup_steps=1 eval.every=0

# run NAME NP CMD ARGS...: meshmoe CMD under mpirun and timeout; output in $T/NAME.log, exit code in
# $rc, seconds in $secs.
run() {
  local name=$1 np=$2; shift 2
  local t0=$SECONDS
  timeout 120 mpirun -np "$np" "$M" "$@" >"$T/$name.log" 2>&1
  rc=$?
  secs=$((SECONDS - t0))
  echo "-- $name: exit $rc in ${secs}s"
}
expect_rc() { [ "$rc" = "$1" ] || { cat "$T/$2.log"; fail "$2: exit $rc, expected $1"; }; }
expect_log() { grep -q -- "$2" "$T/$1.log" || { cat "$T/$1.log"; fail "$1: no line matching '$2'"; }; }
no_crash() {
  if grep -qiE "max_size|bad_alloc|terminate called|Segmentation|Killed|MPI_ABORT|core dumped" "$T/$1.log"; then
    cat "$T/$1.log"; fail "$1: crashed instead of a clean error"
  fi
}

echo "== d_model = 1e9: refused before allocating"
run huge 2 train "$T/deck.toml" --set run.out_dir="$T/huge" --set mesh.data=2 --set model.d_model=1000000000 \
  --set model.num_heads=8
expect_rc 2 huge
no_crash huge
expect_log huge "error: .*\(too large\|more than the\)"
[ "$secs" -le 30 ] || fail "huge: took ${secs}s"
[ "$(grep -c "error:" "$T/huge.log")" = 1 ] || { cat "$T/huge.log"; fail "huge: expected one error line (rank 0)"; }

echo "== run.max_memory below the plan: refused; generous: trains"
run small 2 train "$T/deck.toml" --set run.out_dir="$T/small" --set mesh.data=2 --set run.max_memory=100K
expect_rc 2 small
no_crash small
expect_log small "error: the plan needs .* per node (2 ranks: .* each), more than the 100.00 KiB available (run.max_memory = \"100K\")"
[ -e "$T/small/metrics.h5" ] && fail "small: the refused run wrote metrics.h5"
run roomy 2 train "$T/deck.toml" --set run.out_dir="$T/roomy" --set mesh.data=2 --set run.max_memory=64G
expect_rc 0 roomy
expect_log roomy "step *2"

echo "== a bad run.max_memory is a deck error"
sed 's/^steps = 2$/steps = 2\nmax_memory = "12X"/' "$T/deck.toml" >"$T/bad.toml"
run bad 1 train "$T/bad.toml" --set run.out_dir="$T/bad"
expect_rc 2 bad
expect_log bad "bad.toml:[0-9]*:[0-9]*: run.max_memory = \"12X\": unknown suffix 'x'"
run bad0 1 plan "$T/deck.toml" --set run.max_memory=0G
expect_rc 2 bad0
expect_log bad0 "run.max_memory = \"0G\": must be positive"

echo "== plan: huge models are consistent or a clean error; the test deck fits"
for dm in 65536 268435456 1000000000; do
  run "plan$dm" 1 plan "$T/deck.toml" --set model.d_model=$dm --set model.num_heads=8 --set model.num_layers=64 \
    --set moe.every=0
  no_crash "plan$dm"
  if [ "$rc" = 2 ]; then
    expect_log "plan$dm" "error: the model is too large"
  else
    expect_rc 0 "plan$dm"
    /usr/bin/python3 - "$T/plan$dm.log" "$dm" <<'PY' || fail "plan$dm: inconsistent totals"
import re, sys
rows = {}
dm = int(sys.argv[2])
text = open(sys.argv[1]).read()
count = int(re.search(r"^model: (-?\d+) parameters", text, re.M).group(1))
# 64 blocks of at least the 4 attention matrices [d_model, d_model] (exact integers: no wrap here)
print("model parameters", count, "lower bound", 64 * 4 * dm * dm)
if count < 64 * 4 * dm * dm:
    sys.exit(1)
for line in text.splitlines():
    m = re.match(r"  (parameters|gradients|optimizer state \(adamw\)|total) +(-?\d+)\s*$", line)
    if m: rows.setdefault(m.group(1), int(m.group(2)))
p, o, t = rows["parameters"], rows["optimizer state (adamw)"], rows["total"]
print("parameters", p, "optimizer", o, "total", t)
sys.exit(0 if 0 < p <= o and o == 2 * p and t >= p + rows["gradients"] + o else 1)
PY
  fi
done
run plan 2 plan "$T/deck.toml" --set mesh.data=2
expect_rc 0 plan
expect_log plan "^available memory: .* per node (.*), 2 ranks on the node: the plan fits"

echo "== bench-comm: sizes beyond the limits or the memory"
run bench1t 2 bench-comm --sizes 1T -o "$T/b.h5"
expect_rc 2 bench1t
expect_log bench1t "1T' is above the limit of 1 GiB per buffer"
run bench1g 2 bench-comm --sizes 1G --max-memory 1G -o "$T/b.h5"
expect_rc 2 bench1g
no_crash bench1g
expect_log bench1g "error: bench-comm --sizes 1G needs 4.00 GiB per node (2 ranks: 2.00 GiB each), more than the 1.00 GiB available (--max-memory = \"1G\")"
[ "$secs" -le 30 ] || fail "bench1g: took ${secs}s"

echo "== moe.capacity_factor_train = 1e300: capacity = group size, nothing dropped"
run cap 1 train "$T/deck.toml" --set run.out_dir="$T/cap" --set moe.capacity_factor_train=1e300
expect_rc 0 cap
/usr/bin/python3 - "$T/cap/metrics.h5" <<'PY' || fail "cap: tokens dropped with capacity_factor_train = 1e300"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    layers = list(f["moe"])
    assert layers, "no /moe groups"
    for l in layers:
        d = np.asarray(f["moe"][l]["dropped_fraction"])
        print(l, "dropped_fraction", d)
        assert d.size == 2 and np.all(d == 0), l
PY

echo "== a cgroup v1 memory limit"
cgroot=/sys/fs/cgroup/memory
cg=$cgroot/meshmoe-test-$$
if [ ! -f "$cgroot/memory.limit_in_bytes" ]; then
  echo "SKIP cgroup part: no cgroup v1 memory controller at $cgroot"
elif ! mkdir "$cg" 2>/dev/null; then
  echo "SKIP cgroup part: cannot create $cg (not root, or the cgroup file system is read-only)"
elif ! echo $((768 << 20)) >"$cg/memory.limit_in_bytes" 2>/dev/null; then
  rmdir "$cg"
  echo "SKIP cgroup part: cannot set $cg/memory.limit_in_bytes"
elif ! sh -c 'echo $$ > "$1/cgroup.procs"' sh "$cg" 2>/dev/null; then
  rmdir "$cg"
  echo "SKIP cgroup part: cannot move a process into $cg"
else
  trap 'rmdir "$cg" 2>/dev/null' EXIT
  # in_cgroup NAME NP ARGS...: like run, inside the cgroup
  in_cgroup() {
    local name=$1 np=$2; shift 2
    CG=$cg timeout 120 sh -c 'echo $$ > "$CG/cgroup.procs" && exec "$@"' sh mpirun -np "$np" "$M" "$@" \
      >"$T/$name.log" 2>&1
    rc=$?
    echo "-- $name (in $cg): exit $rc"
  }
  in_cgroup cgtrain 2 train "$T/deck.toml" --set run.out_dir="$T/cgtrain" --set mesh.data=2 --set model.d_model=4096 \
    --set model.num_heads=8 --set model.d_ff=16384
  expect_rc 2 cgtrain
  no_crash cgtrain
  expect_log cgtrain "error: the plan needs .* per node (2 ranks: .*), more than the 768.00 MiB available (cgroup limit $cg/memory.limit_in_bytes)"
  in_cgroup cgbench 2 bench-comm --sizes 1G -o "$T/b.h5"
  expect_rc 2 cgbench
  expect_log cgbench "more than the 768.00 MiB available (cgroup limit $cg/memory.limit_in_bytes)"
fi
echo "memory_limits: ok"
