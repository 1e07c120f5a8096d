#!/usr/bin/env bash
# Checkpoints and restart, end to end:
#   exact resume: 20 steps straight vs 10 + restart + 10 on the same mesh: every loss-like metric
#     bitwise equal;
#   resharded resume: written on data=2 x tensor=2, resumed on data=4 and on 1 rank: within 1e-5;
#   a resume with a changed deck: mesh and steps listed, an optimizer/dropout change warned about
#     key by key, a change of model shape refused naming the key;
#   a corrupted newest checkpoint: reported, the previous one used, and the run still finishes;
#   SIGUSR1 to one rank mid-run: exit 75 with a checkpoint, and the resumed run ends equal to the
#     uninterrupted one;
#   model.arch = "encdec": exact resume on data=2, and resharded onto tensor=2 within 1e-5;
#   moe.router = "expert_choice": the same, experts over data;
#   expert replicas (2 experts on data = 4: expert groups of 2, 2 replicas each): exact resume,
#     each expert stored once, resumed on 1 rank (no replicas) and, written on data = 2 (no
#     replicas), resumed on data = 4 (replicas) and with mesh.expert_parallel = 1, within 1e-5;
#   checkpoint.at_end = false: no checkpoint after the last step, the periodic ones kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir ckpt-resume
tiny_data "$T"
write_tiny_deck "$T" run.name=resume run.steps=20 run.seed=11 model.dropout=0.1 moe.router=top2 \
  moe.capacity_factor_train=1.0 moe.jitter_eps=0.01 optim.name=adamw optim.lr=0.01 optim.warmup_steps=3 \
  eval.every=5 eval.batches=2 checkpoint.every=5 checkpoint.keep_last=2
train() {  # np dir overrides...
  local np=$1 dir=$2; shift 2
  mpirun -np "$np" $M train "$T/deck.toml" --set run.out_dir="$T/$dir" "$@" >>"$T/$dir.log" 2>&1
}
compare() {  # a b tolerance (0 = bitwise)
  $PYTHON - "$T/$1/metrics.h5" "$T/$2/metrics.h5" "$3" <<'PY'
import sys, h5py, numpy as np
a, b, tol = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"), float(sys.argv[3])
assert np.array_equal(a["step"][()], b["step"][()]), (a["step"][()], b["step"][()])
bad = 0
for k in ["loss", "aux_loss", "z_loss", "grad_norm", "lr", "eval/loss"]:
    x, y = a[k][()], b[k][()]
    same_nan = np.array_equal(np.isnan(x), np.isnan(y))
    ok = np.isfinite(x)
    diff = np.max(np.abs(x[ok] - y[ok]) / np.maximum(np.abs(x[ok]), 1e-30)) if ok.any() else 0.0
    good = same_nan and (np.array_equal(x[ok], y[ok]) if tol == 0 else diff <= tol)
    print(f"  {k:10s} max rel diff {diff:.2e} ({'bitwise' if tol == 0 else f'tolerance {tol}'}) {'ok' if good else 'MISMATCH'}")
    bad += not good
sys.exit(1 if bad else 0)
PY
}

# exact_resume NP NAME FORK ARGS...: NAME-straight trains 20 steps; NAME-split trains 10, is copied
# to FORK (a checkpoint at step 10 for a resume elsewhere), then resumes for the other 10: bitwise
# equal to NAME-straight.
exact_resume() {
  local np=$1 name=$2 fork=$3
  shift 3
  train "$np" "$name-straight" "$@"
  train "$np" "$name-split" "$@" --set run.steps=10
  cp -r "$T/$name-split" "$T/$fork"; : > "$T/$fork.log"
  train "$np" "$name-split" "$@"
  grep -q "resuming from .*step_00000010.h5: step 10" "$T/$name-split.log" || fail "$name-split did not resume from step 10"
  compare "$name-straight" "$name-split" 0 || fail "$name: exact resume differs"
}

echo "== exact resume"
train 2 straight --set mesh.data=2
train 2 split --set mesh.data=2 --set run.steps=10
[ -s "$T/split/ckpt/step_00000010.h5" ] || fail "no checkpoint at step 10"
train 2 split --set mesh.data=2
grep -q "resuming from .*step_00000010.h5: step 10" "$T/split.log" || fail "split run did not resume from step 10"
compare straight split 0 || fail "exact resume differs"
ls "$T/straight/ckpt" | grep -q step_00000020.h5 || fail "no final checkpoint"
[ "$(ls "$T/straight/ckpt" | grep -c '^step_.*\.h5$')" = 2 ] || fail "checkpoint.keep_last = 2 not applied: $(ls "$T/straight/ckpt")"

echo "== checkpoint.at_end = false: the periodic checkpoints only"
train 1 no-end --set run.steps=12 --set checkpoint.at_end=false
[ "$(ls "$T/no-end/ckpt" | grep '^step_.*\.h5$' | tr '\n' ' ')" = "step_00000005.h5 step_00000010.h5 " ] ||
  fail "checkpoint.at_end = false: expected steps 5 and 10 only, got $(ls "$T/no-end/ckpt")"

echo "== resharded resume"
train 4 reshard-d2t2 --set mesh.data=2 --set mesh.tensor=2 --set run.steps=10
for target in "4 --set mesh.data=4" "1"; do
  set -- $target; np=$1; shift
  name=reshard-to-$np
  cp -r "$T/reshard-d2t2" "$T/$name"; : > "$T/$name.log"
  train "$np" "$name" "$@"
  grep -q "resuming from .*step 10 (written on mesh pipe=1 x data=2 x tensor=2" "$T/$name.log" || fail "$name did not resume"
  compare straight "$name" 1e-5 || fail "resharded resume on $np ranks differs"
done
# Another mesh and more steps are listed as such, not as a change of the training.
grep -q "^deck changed since the checkpoint (run length, mesh, output):" "$T/reshard-to-4.log" &&
  grep -q "^  mesh.data: 2 -> 4" "$T/reshard-to-4.log" && grep -q "^  run.steps: 10 -> 20" "$T/reshard-to-4.log" ||
  fail "the resharded resume did not list its mesh and step changes"
grep -q "trains differently" "$T/reshard-to-4.log" && fail "a change of mesh was reported as a change of the training"

echo "== resume with a changed deck"
cp -r "$T/straight" "$T/changed"; : > "$T/changed.log"
train 2 changed --set mesh.data=2 --set run.steps=22 --set optim.lr=0.005 --set model.dropout=0.2
grep -q "warning: resuming with a deck that trains differently from the checkpoint's from step 20 on:" "$T/changed.log" &&
  grep -q "^  optim.lr: 0.01 -> 0.005" "$T/changed.log" && grep -q "^  model.dropout: 0.1 -> 0.2" "$T/changed.log" ||
  { cat "$T/changed.log"; fail "no warning listing the changed optimizer and dropout keys"; }
grep -q "^step .* 22/22" "$T/changed.log" || fail "the run with a changed optimizer did not train"
cp -r "$T/straight" "$T/reshaped"; : > "$T/reshaped.log"
set +e; train 2 reshaped --set mesh.data=2 --set run.steps=22 --set model.d_ff=64; rc=$?; set -e
[ "$rc" = 2 ] || { cat "$T/reshaped.log"; fail "a change of model shape exited with $rc, expected 2"; }
grep -q "checkpoint from an incompatible model" "$T/reshaped.log" && grep -q "^  model.d_ff: 32 -> 64" "$T/reshaped.log" ||
  { cat "$T/reshaped.log"; fail "the refusal does not name the changed key"; }

echo "== corrupted newest checkpoint"
cp -r "$T/split" "$T/corrupt"; : > "$T/corrupt.log"
newest="$T/corrupt/ckpt/step_00000020.h5"
$PYTHON - "$newest" <<'PY'
import sys, h5py
path = sys.argv[1]
with h5py.File(path, "r") as f:
    d = f["params/blocks.0.attn.wq"]
    off = d.id.get_chunk_info(0).byte_offset
with open(path, "r+b") as g:
    g.seek(off + 8); b = g.read(1); g.seek(off + 8); g.write(bytes([b[0] ^ 0xFF]))
PY
$M ckpt verify "$newest" >/dev/null 2>&1 && fail "verify accepted a corrupted checkpoint"
train 2 corrupt --set mesh.data=2 --set run.steps=20
grep -q "warning: .*step_00000020.h5" "$T/corrupt.log" || fail "no warning about the corrupted checkpoint"
grep -q "resuming from .*step_00000015.h5: step 15" "$T/corrupt.log" || fail "did not fall back to step 15"
compare straight corrupt 0 || fail "run after the fallback differs"

echo "== SIGUSR1 to one rank"
( set +e; mpirun -np 2 $M train "$T/deck.toml" --set run.out_dir="$T/signal" --set mesh.data=2 --set run.steps=1000000 \
    --set checkpoint.every=0 >"$T/signal.log" 2>&1; echo $? >"$T/signal.rc" ) &
for _ in $(seq 300); do grep -q "^step .* 8/1000000" "$T/signal.log" 2>/dev/null && break; sleep 0.1; done
pid=$(pgrep -f "meshmoe train $T/deck.toml --set run.out_dir=$T/signal" | tail -1)
[ -n "$pid" ] || fail "no rank process found"
kill -USR1 "$pid"
wait
[ "$(cat "$T/signal.rc")" = 75 ] || { cat "$T/signal.log"; fail "exit code $(cat "$T/signal.rc"), expected 75"; }
grep -q "stop signal received" "$T/signal.log" || fail "no stop message"
stopped=$(sed -n 's/^checkpoint step \([0-9]*\):.*/\1/p' "$T/signal.log" | tail -1)
[ -n "$stopped" ] || fail "no checkpoint written on the signal"
train 2 signal --set mesh.data=2 --set checkpoint.every=0 --set run.steps=$((stopped + 10))
train 2 signal-straight --set mesh.data=2 --set run.steps=$((stopped + 10)) --set checkpoint.every=0
compare signal-straight signal 0 || fail "resume after the signal differs"
echo "== encdec resume"
mkdir -p "$T/pairs"
tiny_pairs "$T/pairs"
encdec=(--set model.arch=encdec --set data.path="$T/pairs/data.h5")
exact_resume 2 encdec encdec-to-t2 --set mesh.data=2 "${encdec[@]}"
train 2 encdec-to-t2 --set mesh.tensor=2 "${encdec[@]}"
grep -q "resuming from .*step 10 (written on mesh pipe=1 x data=2 x tensor=1" "$T/encdec-to-t2.log" || fail "encdec-to-t2 did not resume"
compare encdec-straight encdec-to-t2 1e-5 || fail "encdec resharded resume differs"

echo "== shared experts and selection biases (moe.balance = bias)"
# The biases are checkpoint state: an exact resume on data=2 x tensor=2 is bitwise, one written
# there resumes on pipe=2 within 1e-5 with the same biases; a checkpoint without them is refused
# for moe.balance = bias, naming the key.
sb=(--set moe.shared_experts=2 --set moe.balance=bias --set moe.bias_update_rate=0.01)
exact_resume 4 sb sb-to-p2 --set mesh.data=2 --set mesh.tensor=2 "${sb[@]}"
train 2 sb-to-p2 --set mesh.pipe=2 --set optim.micro_batches=2 "${sb[@]}"
grep -q "resuming from .*step 10 (written on mesh pipe=1 x data=2 x tensor=2" "$T/sb-to-p2.log" || fail "sb-to-p2 did not resume"
compare sb-straight sb-to-p2 1e-5 || fail "shared/bias resharded resume differs"
$PYTHON - "$T" <<'PY' || fail "the selection biases did not resume"
import sys, h5py, numpy as np
T = sys.argv[1]
a, b, c = (h5py.File(f"{T}/{r}/metrics.h5", "r") for r in ["sb-straight", "sb-split", "sb-to-p2"])
x = a["moe/layer1/bias_max_abs"][()]
assert x[-1] > 0.05, x  # the biases moved
assert np.array_equal(x, b["moe/layer1/bias_max_abs"][()]), "exact resume"
assert np.allclose(x, c["moe/layer1/bias_max_abs"][()], rtol=1e-6, atol=0), "resharded resume"
with h5py.File(f"{T}/sb-straight/ckpt/step_00000020.h5", "r") as f:
    assert f["optim/blocks.1.moe.router/selection_bias"].shape == (4,)
    assert "params/blocks.1.moe.shared.w_in" in f and "params/blocks.1.moe.shared.w_out" in f
print("  selection biases: resumed exactly and resharded ok")
PY
echo "== expert-choice routing"
# Written on data=2 (experts over data: the all-to-all) resumes bitwise there, and on tensor=2
# within 1e-5.
ec=(--set moe.router=expert_choice --set moe.capacity_factor_train=1.5)
exact_resume 2 ec ec-to-t2 --set mesh.data=2 "${ec[@]}"
train 2 ec-to-t2 --set mesh.tensor=2 "${ec[@]}"
grep -q "resuming from .*step 10 (written on mesh pipe=1 x data=2 x tensor=1" "$T/ec-to-t2.log" || fail "ec-to-t2 did not resume"
compare ec-straight ec-to-t2 1e-5 || fail "expert-choice resharded resume differs"
cp -r "$T/straight" "$T/to-bias"; : > "$T/to-bias.log"
set +e; train 2 to-bias --set mesh.data=2 --set run.steps=22 --set moe.balance=bias; rc=$?; set -e
[ "$rc" = 2 ] && grep -q "selection_bias' \[4\] is not in the checkpoint" "$T/to-bias.log" &&
  grep -q "^  moe.balance: \"aux_loss\" -> \"bias\"" "$T/to-bias.log" ||
  { cat "$T/to-bias.log"; fail "a checkpoint without selection biases was not refused naming moe.balance"; }
echo "== expert replicas (mesh.expert_parallel)"
rp=(--set moe.num_experts=2)
exact_resume 4 rp rp-to-1 --set mesh.data=4 "${rp[@]}"
grep -q "replica groups (world ranks; expert gradient all-reduce): \[0 2\] \[1 3\]" "$T/rp-straight.log" ||
  fail "the replica run's log does not list its replica groups"
$M ckpt verify "$T/rp-straight" >"$T/rp-verify.log" 2>&1 || { cat "$T/rp-verify.log"; fail "the replica checkpoint does not verify"; }
$PYTHON - "$T/rp-straight/ckpt/step_00000020.h5" <<'PY' || fail "the replica checkpoint does not hold each expert once"
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    assert f["params/blocks.1.moe.experts.w_in"].shape[0] == 2, f["params/blocks.1.moe.experts.w_in"].shape
    assert f["optim/blocks.1.moe.experts.w_in/exp_avg"].shape[0] == 2
print("  each expert stored once")
PY
train 1 rp-to-1 "${rp[@]}"
grep -q "resuming from .*step 10 (written on mesh pipe=1 x data=4 x tensor=1" "$T/rp-to-1.log" || fail "rp-to-1 did not resume"
compare rp-straight rp-to-1 1e-5 || fail "expert replicas: resumed on one rank differs"
# the other way round: written without replicas (data = 2: one expert per rank), resumed with them
train 2 rp-from-d2 --set mesh.data=2 --set run.steps=10 "${rp[@]}"
cp -r "$T/rp-from-d2" "$T/rp-from-d2-ep1"; : > "$T/rp-from-d2-ep1.log"
train 4 rp-from-d2 --set mesh.data=4 "${rp[@]}"
grep -q "resuming from .*step 10 (written on mesh pipe=1 x data=2 x tensor=1" "$T/rp-from-d2.log" || fail "rp-from-d2 did not resume"
grep -q "^  mesh.data: 2 -> 4" "$T/rp-from-d2.log" || fail "rp-from-d2 did not list its mesh change"
compare rp-straight rp-from-d2 1e-5 || fail "expert replicas: resumed with replicas differs"
train 4 rp-from-d2-ep1 --set mesh.data=4 --set mesh.expert_parallel=1 "${rp[@]}"
grep -q "^  mesh.expert_parallel: 0 -> 1" "$T/rp-from-d2-ep1.log" || fail "rp-from-d2-ep1 did not list mesh.expert_parallel"
grep -q "trains differently" "$T/rp-from-d2-ep1.log" && fail "a change of mesh.expert_parallel was reported as a change of the training"
compare rp-straight rp-from-d2-ep1 1e-5 || fail "expert replicas: resumed with every expert on every rank differs"
echo "all ok"
