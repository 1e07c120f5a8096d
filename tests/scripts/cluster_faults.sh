#!/usr/bin/env bash
# Cluster-shaped faults (docs/cluster.md "Faults on a cluster"): ranks that do not share everything, a run
# directory used twice, stop requests at any moment. Each case names what it checks; a case that
# hangs is killed after 60 s and fails. One line per case, "ok NAME" or "FAIL NAME: why".
#   - a dataset missing on one rank's node only, and a run directory that is not the same on every
#     rank (relative run.out_dir, ranks in different working directories): every rank exits 2
#     within 60 s, the failing rank named, no .tmp left;
#   - a second run started in the directory of a running one exits 2 naming the holder, and the
#     first one goes on, stops on USR1 with exit 75, its checkpoint verifies, metrics.h5 reads;
#   - a fresh start (run.resume = never, or a checkpoint path) in a directory holding another
#     run's checkpoints moves them aside (bitwise intact), a later auto resume continues the new
#     run, and pruning leaves the old ones alone;
#   - an empty validation split is an input error before step 1 when evaluations are on; an error
#     every rank reaches after some steps (metrics.h5 on a full disk) checkpoints them first;
#   - a resume on other data (another data.path content) exits 2 saying what changed; the same
#     data under another path resumes;
#   - USR1 while the data loads, and during a long evaluation: exit 75 with a checkpoint;
#     SIGINT and SIGHUP to a rank: exit 75 with a checkpoint; USR1 to mpirun: exit 75;
#   - run.threads is applied (the thread count OpenBLAS reports); bad run.name values are deck
#     errors.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=$(realpath "${MESHMOE:-build/meshmoe}")
test_dir cluster-faults
ulimit -c 0
tiny_data "$T" "$PWD"/src/model/*.cpp
write_tiny_deck "$T" run.name=cluster run.steps=20 run.seed=3 model.d_model=32 model.d_ff=64 moe.router=top1 \
  optim.batch_size=4 eval.every=0 checkpoint.every=10 checkpoint.keep_last=1
D="$T/deck.toml"

failed=0 n=0
# pid_of PATTERN: the newest meshmoe rank process whose command line matches PATTERN (waits 30 s).
pid_of() {
  local p
  for _ in $(seq 3000); do
    p=$(pgrep -n -f -- "$1" | while read -r q; do [ "$(cat /proc/$q/comm 2>/dev/null)" = meshmoe ] && echo "$q"; done | tail -1)
    [ -n "$p" ] && { echo "$p"; return; }
    sleep 0.01
  done
}
wait_for_line() {  # FILE REGEX: waits up to 60 s for a line
  for _ in $(seq 600); do grep -qE -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
verify_all() {  # DIR: every committed checkpoint under DIR verifies
  local f
  for f in $(find "$1" -name 'step_*.h5'); do "$M" ckpt verify "$f" >/dev/null 2>&1 || return 1; done
}

echo "== ranks that do not share everything"
mkdir -p "$T/A" "$T/B"; cp "$T/data.h5" "$T/A/data.h5"
mpmd() {  # the mpirun command line: both ranks with the same arguments, rank 0 in A, rank 1 in B
  cmd=(mpirun -np 1 --wdir "$T/A" "$M" train "$D" --set mesh.data=2 "$@" : -np 1 --wdir "$T/B" "$M" train "$D" --set mesh.data=2 "$@")
}
mpmd --set data.path=data.h5 --set run.out_dir="$T/shared-run"
run "$T/one-rank-data.out" "${cmd[@]}"
expect "dataset missing on rank 1's node only" 2 "meshmoe: error: rank 1 on [^:]+: .*data\.h5" "$T/one-rank-data.out"
mpmd --set run.out_dir=relative-run
run "$T/not-shared.out" "${cmd[@]}"
expect "run directory not shared (relative run.out_dir, two working directories)" 2 \
  "meshmoe: error: rank 1 on [^:]+: the run directory .*B/relative-run is not the one rank 0 writes" "$T/not-shared.out"
[ -z "$(find "$T/A" "$T/B" -name '*.tmp')" ] && ok "no half-written checkpoint left" || bad "a .tmp file was left: $(find "$T/A" "$T/B" -name '*.tmp')"

echo "== one run per run directory"
R="$T/owned"
(setsid timeout -k 5 120 mpirun -np 2 "$M" train "$D" --set mesh.data=2 --set run.out_dir="$R" --set run.steps=1000000 \
  --set checkpoint.every=0 >"$T/first.log" 2>&1; echo $? >"$T/first.rc") &
first_job=$!
wait_for_line "$T/first.log" "^step +3/" || bad "the first run did not start" "$T/first.log"
run "$T/second.out" mpirun -np 1 "$M" train "$D" --set run.out_dir="$R" --set run.seed=99
expect "a second run in a running run's directory" 2 "meshmoe: error: the run directory .*owned is in use by another run \(pid [0-9]+ on " "$T/second.out"
sleep 1
grep -qE "^step +[0-9]+/" "$T/first.log" && [ ! -s "$T/first.rc" ] && ok "the first run goes on" || bad "the first run stopped" "$T/first.log"
kill -USR1 "$(pid_of "train $D --set mesh.data=2 --set run.out_dir=$R ")" 2>/dev/null
wait $first_job
[ "$(cat "$T/first.rc")" = 75 ] && verify_all "$R/ckpt" && $PYTHON -c "import h5py,sys; h5py.File(sys.argv[1],'r')['loss'][()]" "$R/metrics.h5" &&
  ok "the first run stops with 75, its checkpoint verifies, metrics.h5 reads" || bad "the first run after the second's attempt: exit $(cat "$T/first.rc")" "$T/first.log"

echo "== a fresh start moves an earlier run aside"
R="$T/lineage"
train_or_fail lineage 1 --set run.seed=1                                   # steps 10 and 20 (keep_last 1: 20)
sum_old=$(sha256sum "$R/ckpt/step_00000020.h5" | cut -d' ' -f1)
run "$T/never.out" mpirun -np 1 "$M" train "$D" --set run.out_dir="$R" --set run.seed=2 --set run.resume=never --set run.steps=10
aside=$(ls -d "$R"/superseded-* 2>/dev/null | head -1)
expect "run.resume = never in a directory with another run's checkpoints" 0 "meshmoe: note: the run directory held an earlier run \(checkpoints of step 20, metrics.h5, deck.toml\); moved it to .*superseded-" "$T/never.out"
[ -n "$aside" ] && [ "$(sha256sum "$aside/ckpt/step_00000020.h5" | cut -d' ' -f1)" = "$sum_old" ] && [ -s "$aside/metrics.h5" ] &&
  ok "the earlier run's checkpoint and metrics are kept, bitwise" || bad "the earlier run's files were not kept"
[ "$(ls "$R/ckpt" | grep -c '^step_')" = 1 ] && [ -s "$R/ckpt/step_00000010.h5" ] || bad "ckpt/ should hold the new run's step 10 only: $(ls "$R/ckpt")"
run "$T/auto.out" mpirun -np 1 "$M" train "$D" --set run.out_dir="$R" --set run.seed=2
expect "a later auto resume continues the new run (not the old step 20)" 0 "resuming from .*/lineage/ckpt/step_00000010.h5: step 10" "$T/auto.out"
grep -q "moved it to" "$T/auto.out" && bad "the auto resume moved its own run aside"
run "$T/fork.out" mpirun -np 1 "$M" train "$D" --set run.out_dir="$R" --set run.seed=2 --set run.resume="$aside/ckpt/step_00000020.h5" --set run.steps=25 --set checkpoint.every=1
expect "a resume from another checkpoint starts a new lineage and moves this one aside" 0 "a new lineage of checkpoints starts here" "$T/fork.out"
[ "$(ls -d "$R"/superseded-* | wc -l)" = 2 ] && [ "$(sha256sum "$aside/ckpt/step_00000020.h5" | cut -d' ' -f1)" = "$sum_old" ] &&
  [ "$(ls "$R/ckpt" | grep '^step_')" = "step_00000025.h5" ] && ok "pruning kept to the new lineage" || bad "after the fork: $(ls "$R" "$R/ckpt")"
"$M" ckpt info "$R" >"$T/fork-info.out" 2>&1
grep -qE "^lineage +[0-9a-f]{16}, forked from .*superseded-.*/ckpt/step_00000020.h5 \(step 20\)" "$T/fork-info.out" &&
  grep -qE "^data +$T/data.h5: tokenizer .*\(fingerprint [0-9a-f]{16}\)" "$T/fork-info.out" &&
  ok "ckpt info shows the lineage, its fork and the data" || bad "ckpt info: lineage or data missing" "$T/fork-info.out"

echo "== every split the deck uses is checked at start"
printf 'one line of text for a data set without a validation split\n' >"$T/one-line.txt"
"$M" prep text -q "$T/one-line.txt" -o "$T/novalid.h5" --valid-percent 0 >/dev/null 2>&1
run "$T/novalid.out" mpirun -np 2 "$M" train "$D" --set mesh.data=2 --set data.path="$T/novalid.h5" --set run.out_dir="$T/novalid" --set eval.every=5
expect "an empty validation split with evaluations on" 2 "meshmoe: error: .*novalid.h5: the valid split has no target token .*eval.every = 5" "$T/novalid.out"
grep -qE "^step " "$T/novalid.out" && bad "steps ran before the empty validation split was found"

echo "== an error every rank reaches after some steps"
# metrics.h5 on a file system that fills up (a tmpfs bind-mounted over the file; needs root): rank
# 0 cannot append, the ranks agree, a checkpoint of the last completed step is written first.
R="$T/metrics-full"
train_or_fail metrics-full 2 --set mesh.data=2 --set run.steps=10
mkdir -p "$T/small"
if mount -t tmpfs -o size=$(( ($(stat -c %s "$R/metrics.h5") + 65536) / 1024 ))k tmpfs "$T/small" 2>/dev/null; then
  cp "$R/metrics.h5" "$T/small/metrics.h5"
  mount --bind "$T/small/metrics.h5" "$R/metrics.h5"
  run "$T/metrics-full.out" mpirun -np 2 "$M" train "$D" --set mesh.data=2 --set run.out_dir="$R" --set run.steps=1000000 --set checkpoint.every=0
  umount "$R/metrics.h5"; umount "$T/small"
  expect "metrics.h5 cannot be written: exit 1 after a checkpoint" 1 "meshmoe: error: cannot write .*metrics-full/metrics.h5" "$T/metrics-full.out"
  last=$(sed -n 's/^meshmoe: writing a checkpoint of step \([0-9]*\) before stopping.*/\1/p' "$T/metrics-full.out")
  [ -n "$last" ] && [ "$last" -gt 10 ] && "$M" ckpt verify "$R/ckpt/$(printf 'step_%08d.h5' "$last")" >/dev/null 2>&1 &&
    [ "$(cat "$R/ckpt/LATEST")" = "$(printf 'step_%08d.h5' "$last")" ] &&
    ok "the steps done are kept (checkpoint of step $last, LATEST)" || bad "no checkpoint of the steps done" "$T/metrics-full.out"
else
  echo "(mount not permitted: no full-disk case)"
fi

echo "== resume on other data"
R="$T/data-change"
train_or_fail data-change 1 --set run.steps=10
mkdir -p "$T/other"; tiny_data "$T/other" "$PWD"/src/train/*.cpp
run "$T/other-data.out" mpirun -np 1 "$M" train "$D" --set run.out_dir="$R" --set data.path="$T/other/data.h5"
expect "a resume with another data set" 2 "checkpoint .*step_00000010.h5 was trained on other data:" "$T/other-data.out"
grep -q "data.path was $T/data.h5, now $T/other/data.h5" "$T/other-data.out" || bad "the message does not say which data.path changed" "$T/other-data.out"
cp "$T/data.h5" "$T/copy.h5"
run "$T/same-data.out" mpirun -np 1 "$M" train "$D" --set run.out_dir="$R" --set data.path="$T/copy.h5"
expect "the same data under another path resumes" 0 "data.path changed from .* to .*copy.h5: the same data" "$T/same-data.out"

echo "== stop requests at any moment"
# USR1 while the data loads: a data set large enough that its reading is seen (its file open).
$PYTHON - "$T/big.txt" <<'PY'
import random, sys
random.seed(1)
w = ["alpha", "beta", "gamma", "delta", "mesh", "expert", "router", "token", "group", "capacity"]
with open(sys.argv[1], "w") as f:
    for _ in range(300000):
        f.write(" ".join(random.choice(w) for _ in range(16)) + "\n")
PY
"$M" prep text -q --max-len 17 "$T/big.txt" -o "$T/big.h5" >/dev/null  # fits seq_len 16 + 1
(setsid timeout -k 5 60 mpirun -np 1 "$M" train "$D" --set data.path="$T/big.h5" --set run.out_dir="$T/early" >"$T/early.log" 2>&1; echo $? >"$T/early.rc") &
job=$!
sent=0
for _ in $(seq 3000); do
  p=$(pid_of "train $D --set data.path=$T/big.h5")
  if [ -n "$p" ] && ls -l "/proc/$p/fd" 2>/dev/null | grep -q big.h5; then kill -USR1 "$p"; sent=1; break; fi
  sleep 0.002
done
wait $job; rc=$(cat "$T/early.rc")
if [ $sent = 0 ]; then bad "USR1 while the data loads: the data set was never seen open" "$T/early.log"
else
  # Nothing trained yet: nothing to checkpoint, and none written (docs/user-guide.md "Exit codes").
  expect "USR1 while the data loads" 75 "stop signal received before the first step of this start \\(step 0\\): nothing to checkpoint" "$T/early.log"
  [ -z "$(find "$T/early" -name 'step_*.h5' 2>/dev/null)" ] || bad "USR1 while the data loads: a checkpoint was written" "$T/early.log"
fi

# USR1 during a long evaluation (eval.batches far more than the 60 s limit allows).
(setsid timeout -k 5 60 mpirun -np 2 "$M" train "$D" --set mesh.data=2 --set run.out_dir="$T/long-eval" --set eval.every=5 \
  --set eval.batches=100000000 >"$T/long-eval.log" 2>&1; echo $? >"$T/long-eval.rc") &
job=$!
wait_for_line "$T/long-eval.log" "^step +5/" && sleep 1
kill -USR1 "$(pid_of "train $D --set mesh.data=2 --set run.out_dir=$T/long-eval")" 2>/dev/null
wait $job; rc=$(cat "$T/long-eval.rc")
expect "USR1 during a long evaluation" 75 "evaluation of step 5 interrupted" "$T/long-eval.log"
[ -s "$T/long-eval/ckpt/step_00000005.h5" ] && verify_all "$T/long-eval/ckpt" && ok "checkpoint of step 5 written" || bad "no checkpoint of step 5" "$T/long-eval.log"
run "$T/long-eval-resumed.out" mpirun -np 2 "$M" train "$D" --set mesh.data=2 --set run.out_dir="$T/long-eval" --set eval.every=5 --set run.steps=6
expect "the resumed run does the interrupted evaluation first" 0 "eval step 5 \| valid loss" "$T/long-eval-resumed.out"
train_or_fail long-eval-straight 2 --set mesh.data=2 --set eval.every=5 --set run.steps=6
$PYTHON - "$T/long-eval/metrics.h5" "$T/long-eval-straight/metrics.h5" <<'PY' &&
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
for k in ["step", "loss", "eval/loss", "eval/lang_loss", "eval/tokens"]:
    if not np.array_equal(a[k][()], b[k][()], equal_nan=True):
        sys.exit(f"{k}: {a[k][()]} after the interrupted evaluation, {b[k][()]} uninterrupted")
PY
  ok "metrics.h5 after the interrupted evaluation equals the uninterrupted run's (bitwise)" || bad "metrics.h5 differs from the uninterrupted run's"

for sig in INT HUP; do
  (setsid timeout -k 5 60 mpirun -np 2 "$M" train "$D" --set mesh.data=2 --set run.out_dir="$T/sig-$sig" --set run.steps=1000000 \
    --set checkpoint.every=0 >"$T/sig-$sig.log" 2>&1; echo $? >"$T/sig-$sig.rc") &
  job=$!
  wait_for_line "$T/sig-$sig.log" "^step +3/"
  kill -"$sig" "$(pid_of "train $D --set mesh.data=2 --set run.out_dir=$T/sig-$sig ")" 2>/dev/null
  wait $job; rc=$(cat "$T/sig-$sig.rc")
  expect "SIG$sig to one rank" 75 "stop signal received after step [0-9]+: writing a checkpoint" "$T/sig-$sig.log"
  verify_all "$T/sig-$sig/ckpt" && [ -n "$(ls "$T/sig-$sig/ckpt" | grep '^step_')" ] || bad "SIG$sig: no good checkpoint"
done
# mpirun turns INT/TERM/HUP sent to it into an abort of the job (exit 1, the ranks killed a second
# later); it forwards USR1 as it is, which is what the job scripts send for every stop request.
(setsid timeout -k 5 60 mpirun -np 2 "$M" train "$D" --set mesh.data=2 --set run.out_dir="$T/mpirun-usr1" --set run.steps=1000000 \
  --set checkpoint.every=0 >"$T/mpirun-usr1.log" 2>&1; echo $? >"$T/mpirun-usr1.rc") &
job=$!
wait_for_line "$T/mpirun-usr1.log" "^step +3/"
pkill -USR1 -f "^mpirun -np 2 $M train $D --set mesh.data=2 --set run.out_dir=$T/mpirun-usr1 "
wait $job; rc=$(cat "$T/mpirun-usr1.rc")
expect "USR1 to mpirun (what the job scripts send for USR1, TERM, INT, HUP)" 75 "stop signal received after step [0-9]+" "$T/mpirun-usr1.log"

echo "== run.threads and run.name"
run "$T/threads.out" env OPENBLAS_NUM_THREADS=1 mpirun -np 1 "$M" train "$D" --set run.out_dir="$T/threads" --set run.threads=2 --set run.steps=1
expect "run.threads = 2 is applied (OpenBLAS reports 2)" 0 "2 BLAS threads per rank" "$T/threads.out"
run "$T/threads0.out" env -u OPENBLAS_NUM_THREADS mpirun -np 1 "$M" train "$D" --set run.out_dir="$T/threads0" --set run.steps=1
expect "run.threads = 0 without OPENBLAS_NUM_THREADS: 1 thread" 0 " 1 BLAS thread per rank" "$T/threads0.out"
printf '[run]\nname = "two\\nlines"\n' >"$T/newline.toml"
run "$T/name-newline.out" mpirun -np 1 "$M" train "$T/newline.toml"
expect "run.name with a newline" 2 "meshmoe: error: .*run.name holds a control character \(0x0a\)" "$T/name-newline.out"
run "$T/name-empty.out" mpirun -np 1 "$M" train "$D" --set 'run.name=""'
expect "empty run.name" 2 "meshmoe: error: .*run.name is empty" "$T/name-empty.out"
run "$T/name-slash.out" mpirun -np 1 "$M" train "$D" --set run.name=../up
expect "run.name ../up" 2 "meshmoe: error: .*run.name starts with '.'" "$T/name-slash.out"

echo
echo "$n checks, $failed failed"
[ "$failed" = 0 ]
