#!/usr/bin/env bash
# metrics.h5 while the run writes it and on a full disk (docs/user-guide.md "metrics.h5", "Faults"):
#   - readers see consistent rows: a run (log_every = 1) pauses after each step's /step append
#     (MESHMOE_TEST_METRICS_PAUSE, the metrics writer's test hook) while h5py reads the file over
#     and over; some reads must catch /step longer than /loss (the hook works), and every read
#     that slices /step, /loss and /lr to the root attribute `rows` gets equal lengths and the
#     rows' final values;
#   - (root only: a tmpfs) a resume on a disk that is still full (to the last page, and with two
#     pages free) exits 2 (naming metrics.h5 when deck.toml fits) and leaves it bitwise as it was
#     (no .broken-N, no empty file); with space again the resume continues it: steps 1..20.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=$(realpath "${MESHMOE:-build/meshmoe}")
test_dir metrics-safety
ulimit -c 0
tiny_data "$T"
write_tiny_deck "$T" run.name=metrics run.steps=8 run.seed=3 moe.num_experts=2 moe.router=top1 \
  optim.batch_size=4 eval.every=0 checkpoint.every=10
D="$T/deck.toml"

echo "== readers see consistent rows"
(MESHMOE_TEST_METRICS_PAUSE=0.3 setsid timeout -k 5 60 mpirun -x MESHMOE_TEST_METRICS_PAUSE -np 1 "$M" train "$D" \
   --set run.out_dir="$T/paused" >"$T/paused.log" 2>&1; echo $? >"$T/paused.rc") &
HDF5_USE_FILE_LOCKING=FALSE $PYTHON - "$T/paused/metrics.h5" "$T/paused.rc" <<'PY' || { cat "$T/paused.log"; fail "inconsistent rows"; }
import os, sys, time, h5py
path, rc = sys.argv[1], sys.argv[2]
reads = torn = 0
bad = []
deadline = time.time() + 60
while not os.path.exists(rc) and time.time() < deadline:
    try:
        with h5py.File(path, "r") as f:
            step, loss, lr = f["step"][()], f["loss"][()] if "loss" in f else [], f["lr"][()] if "lr" in f else []
            n = f.attrs.get("rows")
    except (OSError, KeyError):
        time.sleep(0.01)
        continue
    reads += 1
    torn += len(step) != len(loss)
    if n is None:
        bad.append("no root attribute rows")
    elif not (len(step[:n]) == len(loss[:n]) == len(lr[:n]) == n):
        bad.append(f"rows {n}: step {len(step)}, loss {len(loss)}, lr {len(lr)}")
    time.sleep(0.01)
with h5py.File(path, "r") as f:
    final = f["loss"][()]
print(f"{reads} reads while the run wrote, {torn} of them met /step and /loss of different lengths, "
      f"{len(bad)} inconsistent after slicing to rows")
assert open(rc).read().strip() == "0", "the run failed"
assert torn > 0, "no read met a half-written step: the hook MESHMOE_TEST_METRICS_PAUSE does not work"
assert not bad, bad[:3]
assert len(final) == 8
PY
echo "ok   every read sliced to rows is consistent"

echo "== a resume on a full disk leaves metrics.h5 as it was"
F="$T/full"
mkdir -p "$F"
if mount -t tmpfs -o size=16m tmpfs "$F" 2>/dev/null; then
  trap 'umount "$F" 2>/dev/null' EXIT
  mpirun -np 1 "$M" train "$D" --set run.out_dir="$F/run" --set run.steps=10 >"$T/first.log" 2>&1 || { cat "$T/first.log"; fail "first run failed"; }
  before=$(sha256sum "$F/run/metrics.h5" | cut -d' ' -f1)
  dd if=/dev/zero of="$F/filler" bs=64k >/dev/null 2>&1   # until the disk is full
  # Full to the last page (the earlier behaviour renamed metrics.h5 to .broken-10 and left an empty
  # one), then with two pages free (lock files and deck.toml fit, a copy of metrics.h5 does not).
  for slack in 0 8; do
    [ $slack = 0 ] || truncate -s -${slack}k "$F/filler"
    setsid timeout -k 5 60 mpirun -np 1 "$M" train "$D" --set run.out_dir="$F/run" --set run.steps=20 >"$T/full.log" 2>&1
    rc=$?
    [ "$rc" = 2 ] || { cat "$T/full.log"; fail "resume on a full disk ($slack KiB free): exit $rc, expected 2"; }
    [ $slack = 0 ] || grep -qE "meshmoe: error: cannot continue $F/run/metrics.h5 .*it is left as it was" "$T/full.log" ||
      { cat "$T/full.log"; fail "the error does not name metrics.h5"; }
    grep -qE "^step " "$T/full.log" && fail "steps ran on the full disk"
    [ "$(sha256sum "$F/run/metrics.h5" | cut -d' ' -f1)" = "$before" ] || fail "metrics.h5 changed on the full disk ($slack KiB free)"
    ls "$F/run" | grep -qE "broken|tmp" && fail "files left beside metrics.h5 ($slack KiB free): $(ls "$F/run")"
  done
  echo "ok   the full disk left metrics.h5 bitwise as it was, exit 2 naming it"
  rm -f "$F/filler"
  mpirun -np 1 "$M" train "$D" --set run.out_dir="$F/run" --set run.steps=20 >"$T/again.log" 2>&1 || { cat "$T/again.log"; fail "resume with space failed"; }
  $PYTHON - "$F/run/metrics.h5" <<'PY' || fail "the resumed metrics.h5 is not the whole history"
import sys, h5py
f = h5py.File(sys.argv[1], "r")
assert list(f["step"][()]) == list(range(1, 21)) and f.attrs["rows"] == 20 and len(f["loss"]) == 20, (f["step"][()], f.attrs.get("rows"))
PY
  echo "ok   with space again the resume continues it: steps 1..20"
else
  echo "(mount not permitted: no full-disk case)"
fi
