#!/usr/bin/env bash
# Kill test: SIGKILL the whole job (mpirun and every rank) at 10 random moments,
# checkpoints written every step so that some kills land inside a checkpoint write; after each kill
# the next launch (run.resume = auto) must resume from the newest complete checkpoint, and once the
# run has finished, its metrics (the rows of the final metrics.h5: loss, aux_loss, z_loss,
# grad_norm, lr, eval/loss) and its final checkpoint (every parameter and optimizer tensor, the
# step, cursor and counters) must equal the uninterrupted run's BITWISE (tolerance 0: same mesh,
# same deck, deterministic kernels).
#
# A job is started with setsid so it has its own session; Open MPI puts each rank in its own
# process group, so "the job" is every process of that session, killed together with kill -9.
# The kill moments come from a seeded $RANDOM: after the launch has logged a random number (1-6)
# of steps past its resume point, plus 0-29 ms, i.e. anywhere in a step (forward, backward,
# update, checkpoint write, metrics write). Kills 3, 6 and 9 instead wait for a step_*.h5.tmp to
# appear and fire at once: inside a checkpoint write.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir ckpt-kill
RANDOM=20240605  # seeded: the same kill moments (in steps) every time
STEPS=80
tiny_data "$T"
write_tiny_deck "$T" run.name=kill run.steps=$STEPS run.seed=7 model.dropout=0.1 moe.router=top2 moe.jitter_eps=0.01 \
  optim.lr=0.01 optim.warmup_steps=3 eval.every=10 eval.batches=2 checkpoint.every=1 checkpoint.keep_last=2
RUN="$T/killed"
launch() {  # log: starts the job in its own session, in the background; sets $job
  setsid mpirun -np 2 $M train "$T/deck.toml" --set run.out_dir="$RUN" --set mesh.data=2 >"$1" 2>&1 &
  job=$!
}
session_pids() { ps -eo pid=,sid=,stat= | awk -v s="$1" '$2 == s && $3 !~ /^Z/ { print $1 }'; }
# A step_*.h5.tmp this launch wrote (not one a previous kill left behind).
new_tmp() { find "$RUN/ckpt" -name 'step_*.h5.tmp' -newer "$T/started" 2>/dev/null; }
last_logged_step() { sed -n 's/^step *\([0-9]*\)\/.*/\1/p' "$1" | tail -1; }
resumed_step() { sed -n 's/^resuming from .*: step \([0-9]*\) (written.*/\1/p' "$1" | tail -1; }
# The newest step_*.h5 that `meshmoe ckpt verify` accepts (0 when none): where a resume must start.
newest_good() {
  local f best=0
  for f in $(ls "$RUN/ckpt"/step_*.h5 2>/dev/null | sort -r); do
    if $M ckpt verify "$f" >/dev/null 2>&1; then best=$((10#$(basename "$f" .h5 | sed 's/step_//'))); break; fi
  done
  echo $best
}

echo "== uninterrupted run"
train_or_fail straight 2 --set mesh.data=2

echo "== 10 kills"
expect=0 in_write=0 broken=0 stale_tmp=0
for k in $(seq 10); do
  log="$T/launch$k.log"
  launch "$log"
  # Wait for the launch to get going: its resume line (or first step) tells where it starts.
  for _ in $(seq 600); do grep -q "^step " "$log" 2>/dev/null && break; kill -0 $job 2>/dev/null || break; sleep 0.01; done
  touch "$T/started"
  from=$(resumed_step "$log"); from=${from:-0}
  [ "$from" = "$expect" ] || { cat "$log"; fail "launch $k resumed from step $from, the newest complete checkpoint is step $expect"; }
  if [ "$from" -gt 0 ] && [ "$stale_tmp" = 1 ]; then
    grep -q "warning: ignoring .*step_[0-9]*\.h5\.tmp: left over" "$log" || fail "launch $k: no warning about the stale .tmp"
  fi
  if [ $((k % 3)) = 0 ]; then
    how="inside a checkpoint write"
    for _ in $(seq 3000); do [ -n "$(new_tmp)" ] && break; kill -0 $job 2>/dev/null || break; done
  else
    target=$((from + 1 + RANDOM % 6)) ms=$((RANDOM % 30))
    how="after step $target + ${ms} ms"
    for _ in $(seq 3000); do [ "$(last_logged_step "$log")" -ge "$target" ] 2>/dev/null && break; kill -0 $job 2>/dev/null || break; sleep 0.002; done
    sleep "0.0$(printf %02d $ms)"
  fi
  kill -0 $job 2>/dev/null || { tail "$log"; fail "launch $k ended before kill $k (run.steps = $STEPS too small?)"; }
  # SIGKILL the whole job at once: mpirun and both ranks.
  kill -9 $(session_pids $job) 2>/dev/null || true
  wait $job 2>/dev/null || true
  # A process killed inside a system call (fsync) goes away when the call returns.
  for _ in $(seq 100); do left=$(session_pids $job); [ -z "$left" ] && break; sleep 0.05; done
  [ -z "$left" ] || { kill -9 $left; fail "processes of the killed job survived 5 s: "$left; }
  stale_tmp=0; [ -n "$(new_tmp)" ] && stale_tmp=1 && in_write=$((in_write + 1))
  expect=$(newest_good)
  echo "kill $k ($how): last logged step $(last_logged_step "$log"), newest complete checkpoint step $expect$([ $stale_tmp = 1 ] && echo ', a partial step_*.h5.tmp left')"
done
[ "$in_write" -ge 1 ] || fail "no kill landed inside a checkpoint write"

echo "== resume to the end"
log="$T/final.log"
mpirun -np 2 $M train "$T/deck.toml" --set run.out_dir="$RUN" --set mesh.data=2 >"$log" 2>&1 || { tail "$log"; fail "the final launch failed"; }
[ "$(resumed_step "$log")" = "$expect" ] || { cat "$log"; fail "final launch did not resume from step $expect"; }
grep -q "^done: $STEPS steps" "$log" || fail "the final launch did not finish"
ls "$RUN" | grep -q 'metrics.h5.broken-' && broken=1
echo "(metrics.h5 left unreadable by a kill and set aside: $broken)"

echo "== compare with the uninterrupted run (bitwise)"
$PYTHON - "$T/straight" "$RUN" "$STEPS" <<'PY'
import sys, h5py, numpy as np
straight, killed, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
bad = 0
with h5py.File(f"{straight}/metrics.h5", "r") as a, h5py.File(f"{killed}/metrics.h5", "r") as b:
    sa, sb = a["step"][()], b["step"][()]
    # Rows are unique per step in each file (a resume drops the rows after its checkpoint).
    assert len(np.unique(sb)) == len(sb), f"duplicate steps in the resumed metrics.h5: {sb}"
    assert sb[-1] == steps and len(sb) >= 5, f"the resumed metrics.h5 ends at {sb[-1]} with {len(sb)} rows"
    ia = np.searchsorted(sa, sb)
    assert np.array_equal(sa[ia], sb), "steps missing from the uninterrupted run"
    for k in ["loss", "aux_loss", "z_loss", "grad_norm", "lr", "skipped", "eval/loss"]:
        x, y = a[k][()][ia], b[k][()]
        same = np.array_equal(x, y, equal_nan=True)  # bitwise on finite values; NaN rows (no eval) alike
        print(f"  metrics {k:10s} rows {sb[0]}..{sb[-1]}: {'bitwise equal' if same else 'DIFFER'}")
        bad += not same
name = f"ckpt/step_{steps:08d}.h5"
with h5py.File(f"{straight}/{name}", "r") as a, h5py.File(f"{killed}/{name}", "r") as b:
    names = []
    a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    bnames = []
    b.visititems(lambda n, o: bnames.append(n) if isinstance(o, h5py.Dataset) else None)
    assert sorted(names) == sorted(bnames), "the checkpoints hold different tensors"
    diff = [n for n in names if not np.array_equal(a[n][()], b[n][()])]
    print(f"  checkpoint {len(names)} tensors (params, optimizer state): {'bitwise equal' if not diff else 'DIFFER: ' + ', '.join(diff)}")
    bad += bool(diff)
    for k in ["step", "update_count", "data_epoch", "data_position", "schedule_step", "seed"]:
        if a.attrs[k] != b.attrs[k]:
            print(f"  checkpoint attribute {k}: {a.attrs[k]} vs {b.attrs[k]} DIFFER"); bad += 1
    if dict(a["counters"].attrs) != dict(b["counters"].attrs):
        print(f"  checkpoint counters differ: {dict(a['counters'].attrs)} vs {dict(b['counters'].attrs)}"); bad += 1
sys.exit(1 if bad else 0)
PY
echo "all ok ($in_write of 10 kills left a partial checkpoint write)"
