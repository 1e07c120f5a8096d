#!/usr/bin/env bash
# Faults in checkpoint and data files (docs/user-guide.md "Checkpoints and restart", "Datasets", "Exit codes").
# One line per case, "ok NAME" or "FAIL NAME: why"; exit 1 when any case failed.
#   non-finite checkpoints: a copy of a good checkpoint with one parameter element NaN, one Inf,
#     one AdamW second moment (exp_avg_sq) negative (h5py rewrites the Fletcher32 checksum):
#     `ckpt verify` exits 1 naming the tensor; a resume auto whose newest checkpoint is the NaN one
#     skips it with a warning and resumes from the older good one;
#   weights made infinite by an applied update (optim.lr = 1e39 after a resume from step 2): the
#     run stops for non-finite steps (or at its periodic checkpoint) with exit 1 and "the
#     parameters at step 3 are not finite ... no checkpoint written", LATEST still names step 2,
#     and every step_*.h5 present holds only finite values (h5py) and verifies;
#   datasets: a loss_mask value 7, or no loss_mask = 1 in /train: `train` exits 2 with the message
#     within 30 s, on 1 and on 2 ranks;
#   prep: an output that is its own input (same path, another spelling, a symlink; a .mo file of
#     prep gettext's --root) exits 2 and leaves the input byte-identical (sha256); an empty valid
#     split is a warning, an empty train split exit 2.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=$(realpath "${MESHMOE:-build/meshmoe}")
test_dir data-ckpt-faults
ulimit -c 0

n=0 failed=0
# report NAME WHY...: one line for the case; WHY empty = ok.
report() {
  local name=$1; shift
  n=$((n + 1))
  if [ $# = 0 ]; then echo "ok   $name"; else
    failed=$((failed + 1)); echo "FAIL $name: $(IFS=';'; echo "$*")"
  fi
}
# run OUT CMD...: CMD under timeout (30 s), output to OUT, sets $rc.
run() {
  local out=$1; shift
  set +e
  timeout -k 5 30 "$@" </dev/null >"$out" 2>&1
  rc=$?
  set -e
}
# rc_is WANT: appends to why when $rc differs.
rc_is() { if [ $rc = 124 ] || [ $rc = 137 ]; then why+=("hang: killed after 30 s"); elif [ $rc != "$1" ]; then why+=("exit code $rc, expected $1"); fi; }
has() { grep -qE -- "$2" "$1" || why+=("no message matching /$2/"); }
# finite_ckpts DIR: every step_*.h5 in DIR holds only finite values (h5py) and `ckpt verify` passes.
finite_ckpts() {
  local f
  for f in "$1"/step_*.h5; do
    [ -e "$f" ] || continue
    $PYTHON - "$f" <<'PY' || why+=("$(basename "$f") holds non-finite values")
import sys, h5py, numpy as np
bad = []
with h5py.File(sys.argv[1], "r") as f:
    f.visititems(lambda n, o: bad.append(n) if isinstance(o, h5py.Dataset) and not np.isfinite(o[()]).all() else None)
sys.exit(1 if bad else 0)
PY
    "$M" ckpt verify "$f" >/dev/null 2>&1 || why+=("$(basename "$f") does not verify")
  done
}

# ---- fixtures -------------------------------------------------------------------------------
tiny_data "$T"
write_tiny_deck "$T" run.name=faults run.seed=7 run.max_bad_steps=2 optim.lr=0.01 optim.warmup_steps=0 \
  eval.every=0 checkpoint.every=2
train_or_fail good 1
[ "$(cat "$T/good/ckpt/LATEST")" = step_00000004.h5 ] || fail "the reference run did not checkpoint step 4"
$PYTHON - "$T" <<'PY'
import sys, shutil, h5py, numpy as np
T = sys.argv[1]
src = f"{T}/good/ckpt/step_00000004.h5"
def spoil(dst, dset, value):
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        d = f[dset]
        a = d[()]
        a.flat[3] = value
        d[...] = a
spoil(f"{T}/nan.h5", "params/blocks.0.attn.wq", np.nan)
spoil(f"{T}/inf.h5", "params/embed.wte", np.inf)
spoil(f"{T}/negsq.h5", "optim/blocks.0.attn.wq/exp_avg_sq", -1.0)
shutil.copytree(f"{T}/good", f"{T}/skip")
spoil(f"{T}/skip/ckpt/step_00000004.h5", "params/blocks.0.attn.wq", np.nan)
PY

# ---- checkpoints that hold non-finite values --------------------------------------------------
why=(); run "$T/v-good.out" "$M" ckpt verify "$T/good/ckpt/step_00000004.h5"; rc_is 0
report "ckpt verify: the good checkpoint" "${why[@]}"
why=(); run "$T/v-nan.out" "$M" ckpt verify "$T/nan.h5"; rc_is 1
has "$T/v-nan.out" "bad: non-finite value: /params/blocks.0.attn.wq \[0, 3\] = nan"
report "ckpt verify: a NaN parameter" "${why[@]}"
why=(); run "$T/v-inf.out" "$M" ckpt verify "$T/inf.h5"; rc_is 1
has "$T/v-inf.out" "bad: non-finite value: /params/embed.wte \[0, 3\] = inf"
report "ckpt verify: an Inf parameter" "${why[@]}"
why=(); run "$T/v-neg.out" "$M" ckpt verify "$T/negsq.h5"; rc_is 1
has "$T/v-neg.out" "bad: negative second moment: /optim/blocks.0.attn.wq/exp_avg_sq \[0, 3\] = -1"
report "ckpt verify: a negative AdamW second moment" "${why[@]}"
why=(); run "$T/skip.out" mpirun -np 1 "$M" train "$T/deck.toml" --set run.out_dir="$T/skip" --set run.steps=6; rc_is 0
has "$T/skip.out" "warning: skipping bad checkpoint .*/skip/ckpt/step_00000004.h5: non-finite value: /params/blocks.0.attn.wq"
has "$T/skip.out" "resuming from .*/skip/ckpt/step_00000002.h5: step 2"
report "resume auto skips a newest checkpoint holding NaN" "${why[@]}"
for bad in nan negsq; do
  why=(); run "$T/path-$bad.out" mpirun -np 2 "$M" train "$T/deck.toml" --set mesh.data=2 --set run.out_dir="$T/path-$bad" \
    --set run.resume="$T/$bad.h5" --set run.steps=6; rc_is 2
  has "$T/path-$bad.out" "meshmoe: error: checkpoint .*/$bad.h5 is bad: (non-finite value: /params/blocks.0.attn.wq \[0, 3\] = nan|negative second moment: /optim/blocks.0.attn.wq/exp_avg_sq \[0, 3\] = -1)"
  report "run.resume = PATH of a checkpoint holding $bad: exit 2 on every rank" "${why[@]}"
done

# ---- a run whose update makes the weights infinite --------------------------------------------
# Resumed from a good step 2 with lr = 1e39: step 3's loss and gradient are finite, its update
# overflows the weights to +-inf, steps 4 and 5 are non-finite (run.max_bad_steps = 2).
for mode in stop periodic; do
  rm -rf "$T/$mode"; mkdir -p "$T/$mode/ckpt"
  cp "$T/good/ckpt/step_00000002.h5" "$T/$mode/ckpt/"; echo step_00000002.h5 >"$T/$mode/ckpt/LATEST"
  every=100; [ $mode = periodic ] && every=1
  why=(); run "$T/$mode.out" mpirun -np 1 "$M" train "$T/deck.toml" --set run.out_dir="$T/$mode" --set run.steps=8 \
    --set optim.lr=1e39 --set optim.grad_clip=0 --set checkpoint.every=$every
  rc_is 1
  has "$T/$mode.out" "resuming from .*step_00000002.h5: step 2"
  has "$T/$mode.out" "meshmoe: error: the parameters at step 3 are not finite \([a-z0-9._]+ \[[0-9, ]+\] = -?inf\); no checkpoint written; the newest good checkpoint is .*/ckpt/LATEST -> step_00000002.h5"
  [ $mode = stop ] && has "$T/$mode.out" "2 consecutive non-finite steps"
  grep -q "^done:" "$T/$mode.out" && why+=("the run says done")
  [ "$(cat "$T/$mode/ckpt/LATEST")" = step_00000002.h5 ] || why+=("LATEST names $(cat "$T/$mode/ckpt/LATEST")")
  ls "$T/$mode/ckpt" | grep -q -v -x -e LATEST -e step_00000002.h5 && why+=("other files in ckpt/: $(ls "$T/$mode/ckpt" | tr '\n' ' ')")
  finite_ckpts "$T/$mode/ckpt"
  report "weights overflowed by an update: no checkpoint of them ($mode)" "${why[@]}"
done

# ---- datasets: loss_mask --------------------------------------------------------------------
$PYTHON - "$T" <<'PY'
import sys, shutil, h5py, numpy as np
T = sys.argv[1]
shutil.copy(f"{T}/data.h5", f"{T}/mask7.h5")
with h5py.File(f"{T}/mask7.h5", "r+") as f:
    m = f["train/loss_mask"][()]
    m[5] = 7
    f["train/loss_mask"][...] = m
shutil.copy(f"{T}/data.h5", f"{T}/mask0.h5")
with h5py.File(f"{T}/mask0.h5", "r+") as f:
    f["train/loss_mask"][...] = 0
PY
for np in 1 2; do
  why=(); run "$T/mask7-$np.out" mpirun -np $np "$M" train "$T/deck.toml" --set run.out_dir="$T/m7-$np" --set mesh.data=$np \
    --set data.path="$T/mask7.h5"
  rc_is 2; has "$T/mask7-$np.out" "meshmoe: error: .*mask7.h5 \(split /train\): loss_mask\[5\] = 7 is neither 0 nor 1"
  report "train: a loss_mask value 7 ($np rank(s))" "${why[@]}"
  why=(); run "$T/mask0-$np.out" mpirun -np $np "$M" train "$T/deck.toml" --set run.out_dir="$T/m0-$np" --set mesh.data=$np \
    --set data.path="$T/mask0.h5"
  rc_is 2; has "$T/mask0-$np.out" "meshmoe: error: no target token \(loss_mask = 1\) in .*mask0.h5 /train: nothing to train on"
  report "train: no loss_mask = 1 in /train ($np rank(s))" "${why[@]}"
done

# ---- prep: the output is one of the inputs; empty splits -------------------------------------
mkdir -p "$T/p/x"
cp src/model/layernorm.cpp "$T/p/a.txt"
ln -s "$T/p/a.txt" "$T/p/link.h5"
sum=$(sha256sum <"$T/p/a.txt")
for out in "$T/p/a.txt" "$T/p/x/../a.txt" "$T/p/link.h5"; do
  why=(); run "$T/same.out" "$M" prep text "$T/p/a.txt" -o "$out"; rc_is 2
  has "$T/same.out" "meshmoe: error: prep text: the output file .* is the input .*a.txt: refusing to overwrite it"
  [ "$(sha256sum <"$T/p/a.txt")" = "$sum" ] || { why+=("the input changed"); cp src/model/layernorm.cpp "$T/p/a.txt"; }
  report "prep text -o ${out#"$T/p/"} (its own input)" "${why[@]}"
done
cd "$T/p"; why=(); run "$T/same.out" "$M" prep text a.txt -o ./x/../a.txt; rc_is 2; cd - >/dev/null
[ "$(sha256sum <"$T/p/a.txt")" = "$sum" ] || why+=("the input changed")
report "prep text a.txt -o ./x/../a.txt (relative)" "${why[@]}"
if command -v msgfmt >/dev/null; then
  mkdir -p "$T/loc/de/LC_MESSAGES"
  printf 'msgid "Open"\nmsgstr "Aufmachen"\n' | msgfmt -o "$T/loc/de/LC_MESSAGES/a.mo" -
  mosum=$(sha256sum <"$T/loc/de/LC_MESSAGES/a.mo")
  why=(); run "$T/same.out" "$M" prep gettext --root "$T/loc" -o "$T/loc/de/LC_MESSAGES/a.mo"; rc_is 2
  has "$T/same.out" "prep gettext: the output file .* is the input .*a.mo: refusing to overwrite it"
  [ "$(sha256sum <"$T/loc/de/LC_MESSAGES/a.mo")" = "$mosum" ] || why+=("the catalog changed")
  report "prep gettext -o a catalog under --root" "${why[@]}"
fi
why=(); run "$T/v0.out" "$M" prep text -q src/model/*.cpp -o "$T/v0.h5" --valid-percent 0; rc_is 0
has "$T/v0.out" "prep text: warning: the valid split is empty \(--valid-percent 0\): a deck must set eval.every = 0"
report "prep text --valid-percent 0: warning" "${why[@]}"
why=(); run "$T/v100.out" "$M" prep text -q src/model/*.cpp -o "$T/v100.h5" --valid-percent 100; rc_is 2
has "$T/v100.out" "meshmoe: error: prep text: the train split is empty \(--valid-percent 100\)"
[ -e "$T/v100.h5" ] && why+=("a file was written")
report "prep text --valid-percent 100: refused" "${why[@]}"

echo
echo "$n cases, $failed failed"
[ "$failed" = 0 ]
