#!/usr/bin/env bash
# optim.shard_state (ZeRO stage 1, docs/ARCHITECTURE.md "Sharded optimizer state"): the same deck
# trained with and without sharded optimizer state, for AdamW and Adafactor, on data = 2 and 4,
# data x tensor = 2x2 and pipe x data = 2x2 (tied embedding over pipe), an MoE deck with experts
# split over data. Oracle: the unsharded run on the same mesh. Expected: losses, gradient norms and
# the final checkpoint (every parameter and every optimizer state tensor) BITWISE equal on every
# mesh: with 2 data ranks the reduce-scatter adds each gradient element's 2 terms as the all-reduce
# does, with 4 the sharded run reduces with the unsharded run's all-reduce (a reduce-scatter adds
# 4 terms in another order, which Adam's m / sqrt(v) turned into up to 1.5e-5 of a parameter's
# scale in four steps on some data), and the norm is assembled from per-parameter sums in the
# unsharded order. Dense and experts-over-tensor decks (no parameter split over data): one copy of
# the weights per node, bitwise the same.
# Checkpoints: a sharded run's checkpoint resumes unsharded on another mesh and an unsharded one
# resumes sharded on another mesh (1e-5, the mesh-invariance tolerance of train_invariance.sh),
# and bitwise on the same mesh; a NaN weight resumed into one copy stops the run, named.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir shard_state
tiny_data "$T"
write_tiny_deck "$T" run.name=zero run.seed=11 model.dropout=0.1 moe.router=top2 moe.jitter_eps=0.01 \
  optim.micro_batches=2 optim.lr=0.01 optim.grad_clip=0.5 checkpoint.every=2
declare -A mesh=(
  [d2]="2 --set mesh.data=2" [d4]="4 --set mesh.data=4" [d2t2]="4 --set mesh.data=2 --set mesh.tensor=2"
  [p2d2]="4 --set mesh.pipe=2 --set mesh.data=2"
)
pairs=""
for opt in adamw adafactor; do
  for k in d2 d4 d2t2 p2d2; do
    for sh in false true; do
      # shellcheck disable=SC2086
      train_or_fail "$opt-$k-$sh" ${mesh[$k]} --set optim.name=$opt --set optim.shard_state=$sh
    done
    tol=0
    pairs+="$opt-$k-false:$opt-$k-true:$tol "
  done
done
# No parameter split over data (dense; experts over tensor): the data ranks of the node hold one
# copy of the weights between them, which the owners update in place (no all-gather).
for k in dense-d2 dense-d4 exptensor-d2t2; do
  case $k in
    dense-d2) args="2 --set mesh.data=2 --set moe.every=0" ;;
    dense-d4) args="4 --set mesh.data=4 --set moe.every=0 --set optim.name=adafactor" ;;
    exptensor-d2t2) args="4 --set mesh.data=2 --set mesh.tensor=2 --set moe.expert_axis=tensor" ;;
  esac
  for sh in false true; do
    # shellcheck disable=SC2086
    train_or_fail "$k-$sh" $args --set optim.shard_state=$sh
  done
  grep -q "one copy of the weights per node" "$T/$k-true.log" ||
    { cat "$T/$k-true.log"; fail "$k: the sharded run does not hold one copy of the weights per node"; }
  if grep -q "one copy of the weights per node" "$T/$k-false.log"; then fail "$k: one copy of the weights without optim.shard_state"; fi
  pairs+="$k-false:$k-true:0 "
done
grep -q "one copy of the weights" "$T/adamw-d2-true.log" && fail "one copy of the weights with experts split over data"
# A resume into one copy and out of it: the one copy's first rank reads the weights for the node.
train_or_fail res-one-copy 2 --set mesh.data=2 --set moe.every=0 --set optim.shard_state=true \
  --set run.resume="$T/dense-d2-false/ckpt/step_00000002.h5"
train_or_fail res-one-copy-back 2 --set mesh.data=2 --set moe.every=0 --set optim.shard_state=false \
  --set run.resume="$T/dense-d2-true/ckpt/step_00000002.h5"
pairs+="dense-d2-false:res-one-copy:0 dense-d2-true:res-one-copy-back:0 "
# Only that rank checks the weights it reads: a NaN in the checkpoint still stops both ranks,
# named, with exit 2 (an input error; not a hang, not a run).
$PYTHON - "$T" <<'PY'
import sys, shutil, h5py, numpy as np
T = sys.argv[1]
shutil.copy(f"{T}/dense-d2-false/ckpt/step_00000002.h5", f"{T}/nan.h5")
with h5py.File(f"{T}/nan.h5", "r+") as f:
    d = f["params/blocks.1.mlp.w_in"]
    a = d[()]
    a.flat[5] = np.nan
    d[...] = a
PY
rc=0
timeout 120 mpirun -np 2 "$M" train "$T/deck.toml" --set run.out_dir="$T/res-nan" --set mesh.data=2 --set moe.every=0 \
  --set optim.shard_state=true --set run.resume="$T/nan.h5" >"$T/res-nan.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat "$T/res-nan.log"; fail "a NaN weight resumed into one copy: exit $rc, not 2"; }
grep -q "is bad: non-finite value: /params/blocks.1.mlp.w_in" "$T/res-nan.log" ||
  { cat "$T/res-nan.log"; fail "a NaN weight resumed into one copy is not named"; }
# Resume across meshes and across shard_state, from the step-2 checkpoints.
ck() { echo "$T/$1/ckpt/step_00000002.h5"; }
train_or_fail res-same 2 --set mesh.data=2 --set optim.shard_state=true --set run.resume="$(ck adamw-d2-false)"
train_or_fail res-same-back 2 --set mesh.data=2 --set optim.shard_state=false --set run.resume="$(ck adamw-d2-true)"
train_or_fail res-d4-to-d2t2 4 --set mesh.data=2 --set mesh.tensor=2 --set run.resume="$(ck adamw-d4-true)"
train_or_fail res-d2-to-d4 4 --set mesh.data=4 --set optim.shard_state=true --set run.resume="$(ck adamw-d2-false)"
train_or_fail res-af-p2d2-to-d2t2 4 --set mesh.data=2 --set mesh.tensor=2 --set optim.name=adafactor \
  --set optim.shard_state=true --set run.resume="$(ck adafactor-p2d2-false)"
pairs+="adamw-d2-false:res-same:0 adamw-d2-true:res-same-back:0 adamw-d4-true:res-d4-to-d2t2:1e-5 "
pairs+="adamw-d2-false:res-d2-to-d4:1e-5 adafactor-p2d2-false:res-af-p2d2-to-d2t2:1e-5 "
# The deck refuses gradient buckets with sharded state, naming both keys.
if "$M" train "$T/deck.toml" --set optim.shard_state=true --set run.grad_bucket_mb=1 >"$T/buckets.log" 2>&1; then
  fail "optim.shard_state with run.grad_bucket_mb > 0 was accepted"
fi
grep -q "optim.shard_state = true does not combine with run.grad_bucket_mb" "$T/buckets.log" ||
  { cat "$T/buckets.log"; fail "no clear error for optim.shard_state with buckets"; }
grep -q "optimizer state sharded over 4 data ranks" "$T/adamw-d4-true.log" ||
  { cat "$T/adamw-d4-true.log"; fail "the memory report does not show the sharded optimizer state"; }
$PYTHON - "$T" $pairs <<'PY'
import sys, h5py, numpy as np
T, pairs = sys.argv[1], [p.split(":") for p in sys.argv[2:]]
bad = 0
def datasets(path, group):
    out = {}
    with h5py.File(path, "r") as f:
        f[group].visititems(lambda n, d: out.__setitem__(n, d[()]) if isinstance(d, h5py.Dataset) else None)
    return out
def compare(what, a, b, tol, tensor=False):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if tol == 0:
        ok = a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
        return ok, "bitwise"
    if a.shape != b.shape: return False, f"shape {b.shape} instead of {a.shape}"
    scale = np.maximum(np.max(np.abs(a)), 1e-30) if tensor else np.maximum(np.abs(a), 1e-30)
    rel = np.max(np.abs(a - b) / scale) if a.size else 0.0
    return rel <= tol, f"max rel diff {rel:.1e} (tolerance {tol:g})"
for ref_name, run, tol in pairs:
    tol = float(tol)
    ref, f = h5py.File(f"{T}/{ref_name}/metrics.h5", "r"), h5py.File(f"{T}/{run}/metrics.h5", "r")
    steps = f["step"][()]
    rows = np.searchsorted(ref["step"][()], steps)
    assert np.array_equal(ref["step"][()][rows], steps), run
    for key in ["loss", "aux_loss", "grad_norm"]:
        ok, how = compare(key, ref[key][()][rows], f[key][()], tol)
        bad += not ok
        print(f"{run:24s} vs {ref_name:22s} {key:12s} {how} {'ok' if ok else 'MISMATCH'}")
    # The final checkpoint: every parameter and optimizer state tensor (logical shapes).
    a, b = f"{T}/{ref_name}/ckpt/step_00000004.h5", f"{T}/{run}/ckpt/step_00000004.h5"
    for group in ["params", "optim"]:
        da, db = datasets(a, group), datasets(b, group)
        if sorted(da) != sorted(db):
            bad += 1
            print(f"{run}: /{group} holds other tensors than {ref_name}'s: {sorted(set(da) ^ set(db))[:5]}")
            continue
        results = [(compare(n, da[n], db[n], tol, tensor=True), n) for n in sorted(da)]
        ok = all(r[0][0] for r in results)
        bad += not ok
        how = "bitwise" if tol == 0 else f"within {tol:g} of each tensor's largest magnitude"
        print(f"{run:24s} vs {ref_name:22s} /{group:10s} {len(da)} tensors {how} {'ok' if ok else 'MISMATCH'}")
        for (good, detail), n in results:
            if not good: print(f"    /{group}/{n}: {detail}")
sys.exit(1 if bad else 0)
PY
