#!/usr/bin/env bash
# `meshmoe distill` (Switch section 4.2, docs/user-guide.md "Distillation"): a tiny Switch teacher and a dense
# baseline are trained, then the dense student is distilled from the teacher. Checks:
#   - the report line, and /distill/* in metrics.h5: the teacher's and the baseline's validation
#     losses equal their own runs' last eval/loss (the same checkpoint, the same sample; 1e-6
#     relative), the preserved share is (baseline - student) / (baseline - teacher);
#   - the student's init (`train --init-from`): with a learning rate of 1e-30 (the weights cannot
#     move), every parameter the teacher has with the same shape equals the teacher's, the others
#     a fresh dense run's, the line counts them; compared in the checkpoints with h5py;
#   - distill.alpha = 0 trains bitwise as `train --init-from TEACHER` (loss, grad_norm, eval/loss);
#   - the mesh (the teacher's experts over data, heads over tensor): data 2, tensor 2 and 2 x 2 give
#     the single-rank distillation within train_invariance.sh's 1e-5; so do pipe 2 and pipe 2 x
#     data 2 (the teacher in the student's stages, its logits on the last one), and pipe 2 with a
#     teacher of 4 layers (its own stage split: 2 blocks a stage against the student's 1) that of
#     the same teacher on one rank;
#   - exit 2 with a message for a teacher whose layers do not divide over the pipe stages and for
#     a teacher of another sequence length.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir distill
tiny_data "$T"
cp tests/decks/good/distill_switch.toml "$T/deck.toml"
data="--set data.path=$T/data.h5"
dense="--set moe.every=0"
# The data: the stable license texts (tests/lib/common.sh TINY_TEXT), not the model's sources:
# with those as text, an edit of src/model/ changed the trajectories, and on one such text the
# tensor-2 and pipe-2 x data-2 runs drifted to 1e-4 of one rank by the last step (old and new
# binaries alike). The teacher trains three times as long as the baseline and the student, so
# that it is the better model.
# shellcheck disable=SC2086
train_or_fail teacher 1 $data --set run.steps=120
# shellcheck disable=SC2086
train_or_fail baseline 1 $data $dense
# A deeper teacher: 4 layers (MoE in blocks 1 and 3) for the dense student's 2; and one of 3
# layers, which two pipeline stages cannot split (a refusal below; 2 steps suffice).
# shellcheck disable=SC2086
train_or_fail teacher4 1 $data --set model.num_layers=4 --set run.steps=60
# shellcheck disable=SC2086
train_or_fail teacher3 1 $data --set model.num_layers=3 --set run.steps=2 --set eval.every=0
# distill_or_fail NAME NP [ARG...]: `meshmoe distill` of the dense deck with the teacher
# ($teacher, by default $T/teacher).
distill_or_fail() {
  local name=$1 np=$2; shift 2
  # shellcheck disable=SC2086
  mpirun -np "$np" "$M" distill "$T/deck.toml" $data $dense --teacher "${teacher:-$T/teacher}" --set run.out_dir="$T/$name" "$@" \
    >"$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "distill $name failed"; }
}
distill_or_fail student 1 --baseline "$T/baseline/ckpt"
grep -E '^distill: validation loss \(nats/token\): teacher [0-9.]+ \| student [0-9.]+ \| baseline [0-9.]+ \| the student keeps -?[0-9.]+% of the teacher' "$T/student.log" ||
  { cat "$T/student.log"; fail "no distillation report line"; }
grep -E '^init from .*teacher/ckpt/step_00000120.h5: [0-9]+ parameters copied, [0-9]+ kept at their initialisation \(blocks.1.mlp' "$T/student.log" ||
  { cat "$T/student.log"; fail "no init-from line naming the kept expert-block feed-forward"; }
# The init: lr 1e-30 leaves every weight where the init put it (an update of 1e-30 is below
# float's resolution of the weights; zero-initialised biases move by at most 1e-28).
tiny_lr="--set optim.lr=1e-30 --set optim.warmup_steps=0 --set run.steps=2 --set eval.every=0"
# shellcheck disable=SC2086
distill_or_fail init 1 $tiny_lr
# shellcheck disable=SC2086
train_or_fail fresh 1 $data $dense $tiny_lr
# alpha = 0: plain training from the teacher's weights.
distill_or_fail alpha0 1 --set distill.alpha=0
# shellcheck disable=SC2086
mpirun -np 1 "$M" train "$T/deck.toml" $data $dense --init-from "$T/teacher/ckpt/step_00000120.h5" \
  --set run.out_dir="$T/initfrom" >"$T/initfrom.log" 2>&1 || { cat "$T/initfrom.log"; fail "train --init-from failed"; }
# The mesh.
distill_or_fail student-d2 2 --set mesh.data=2
distill_or_fail student-t2 2 --set mesh.tensor=2
distill_or_fail student-d2t2 4 --set mesh.data=2 --set mesh.tensor=2
pipe2="--set mesh.pipe=2 --set optim.micro_batches=2"
# shellcheck disable=SC2086
distill_or_fail student-p2 2 $pipe2
# shellcheck disable=SC2086
distill_or_fail student-p2d2 4 $pipe2 --set mesh.data=2
teacher="$T/teacher4" distill_or_fail deep 1
# shellcheck disable=SC2086
teacher="$T/teacher4" distill_or_fail deep-p2 2 $pipe2
$PYTHON - "$T" <<'PY'
import sys, h5py, numpy as np
T = sys.argv[1]
bad = 0
def check(cond, what):
    global bad
    print(("ok   " if cond else "FAIL ") + what)
    bad += not cond
def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)
m = h5py.File(f"{T}/student/metrics.h5", "r")
teacher_eval = h5py.File(f"{T}/teacher/metrics.h5", "r")["eval/loss"][()]
baseline_eval = h5py.File(f"{T}/baseline/metrics.h5", "r")["eval/loss"][()]
d = {k: m[f"distill/{k}"][()][-1] for k in ("teacher_loss", "student_loss", "baseline_loss", "preserved")}
print("report:", {k: round(float(v), 5) for k, v in d.items()})
check(rel(d["teacher_loss"], teacher_eval[np.isfinite(teacher_eval)][-1]) <= 1e-6, "teacher loss = the teacher run's last eval/loss")
check(rel(d["baseline_loss"], baseline_eval[np.isfinite(baseline_eval)][-1]) <= 1e-6, "baseline loss = the baseline run's last eval/loss")
check(rel(d["student_loss"], m["eval/loss"][()][-1]) <= 1e-6, "student loss = the distill run's last eval/loss")
check(d["teacher_loss"] < d["baseline_loss"], "the teacher beats the baseline")
check(rel(d["preserved"], (d["baseline_loss"] - d["student_loss"]) / (d["baseline_loss"] - d["teacher_loss"])) <= 1e-12,
      "preserved = (baseline - student) / (baseline - teacher)")
check(m["distill/teacher_loss"].attrs["units"] in (b"nats/token", "nats/token"), "units of /distill/teacher_loss")
soft = m["distill/soft_loss"][()]
check(np.all(np.isfinite(soft)) and np.all(soft > 0), "distill/soft_loss logged at every logged step")
check("time/teacher_forward" in m and np.all(m["time/teacher_forward"][()] > 0), "time/teacher_forward > 0")
# The init.
tp = h5py.File(f"{T}/teacher/ckpt/step_00000120.h5", "r")["params"]
sp = h5py.File(f"{T}/init/ckpt/step_00000002.h5", "r")["params"]
fp = h5py.File(f"{T}/fresh/ckpt/step_00000002.h5", "r")["params"]
names = []
sp.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
copied = kept = 0
for n in names:
    s = sp[n][()]
    if n in tp and tp[n].shape == s.shape:
        copied += 1
        check(np.max(np.abs(s - tp[n][()])) <= 1e-20, f"{n}: the teacher's")
    else:
        kept += 1
        check(np.max(np.abs(s - fp[n][()])) <= 1e-20, f"{n}: a fresh initialisation")
check(kept > 0 and copied > kept, f"{copied} copied, {kept} kept")
log = open(f"{T}/init.log").read()
check(f"{copied} parameters copied, {kept} kept" in log, "the init line counts them")
# alpha = 0 is plain training from the teacher's weights: bitwise.
a0, tr = h5py.File(f"{T}/alpha0/metrics.h5", "r"), h5py.File(f"{T}/initfrom/metrics.h5", "r")
for k in ("loss", "grad_norm", "eval/loss"):
    check(np.array_equal(a0[k][()], tr[k][()], equal_nan=True), f"alpha 0 = train --init-from: {k} bitwise")
# The mesh: as train_invariance.sh, 1e-5 relative.
for ref, run in (("student", "student-d2"), ("student", "student-t2"), ("student", "student-d2t2"),
                 ("student", "student-p2"), ("student", "student-p2d2"), ("deep", "deep-p2")):
    r, f = h5py.File(f"{T}/{ref}/metrics.h5", "r"), h5py.File(f"{T}/{run}/metrics.h5", "r")
    for k in ("loss", "grad_norm", "eval/loss", "distill/soft_loss", "distill/teacher_loss", "distill/student_loss"):
        a, b = r[k][()], f[k][()]
        ok = np.isfinite(a)
        same = np.array_equal(ok, np.isfinite(b)) and np.max(np.abs(a[ok] - b[ok]) / np.abs(a[ok])) <= 1e-5
        check(same, f"{run} {k} within 1e-5 of one rank")
deep = h5py.File(f"{T}/deep/metrics.h5", "r")
check(abs(deep["distill/teacher_loss"][()][-1] - d["teacher_loss"]) > 1e-3, "the 4-layer teacher is another teacher")
sys.exit(1 if bad else 0)
PY
# Refusals: exit 2, all ranks together, with what to do.
expect_refusal() {
  local name=$1 np=$2 want=$3; shift 3
  local rc=0
  # shellcheck disable=SC2086
  timeout 60 mpirun -np "$np" "$M" distill "$T/deck.toml" $data $dense --set run.out_dir="$T/$name" "$@" >"$T/$name.log" 2>&1 || rc=$?
  [ "$rc" = 2 ] && grep -q "$want" "$T/$name.log" || { cat "$T/$name.log"; fail "$name: exit $rc, wanted 2 and '$want'"; }
  echo "ok   $name refused: $(grep -m1 'error' "$T/$name.log")"
}
# shellcheck disable=SC2086
expect_refusal pipe 2 "model.num_layers = 3 is not divisible by mesh.pipe = 2" --teacher "$T/teacher3" $pipe2
expect_refusal seqlen 1 "model.seq_len" --teacher "$T/teacher" --set model.seq_len=8
expect_refusal missing 1 "teacher" --teacher "$T/nothing-here"
echo "distill: all checks passed"
