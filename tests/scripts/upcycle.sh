#!/usr/bin/env bash
# Sparse upcycling and the refusals of `train --init-from` (docs/export.md; Komatsuzaki et al.
# 2023, section 3). A dense decoder trained 8 steps is upcycled into a GShard top-2 deck (E = 4,
# capacity_factor_eval 2.0: C = S, no token dropped) on 1 rank and on data 2 x tensor 2, by runs of
# one step at lr 1e-30 (an update below the last bit of every weight: meshmoe writes no checkpoint
# of step 0, so this is how the upcycled initial state reaches a checkpoint):
#  - every expert tensor is bitwise the dense feed-forward of its block, everything else but the
#    router the dense model's, and both meshes give the same bytes;
#  - the validation loss (`meshmoe eval`) equals the dense model's within 1e-5 relative on both
#    meshes (top-2 gates sum to 1: y = (g1 + g2) FFN(x));
#  - Switch top-1: each MoE block's output is the dense FFN times the top probability (1e-6), and
#    meshmoe's validation loss of it is the PyTorch module's (1e-5);
#  - --upcycle-noise: the same bytes on both meshes, and not the noiseless ones.
# Refusals (exit 2, naming the tensors): a d_model-64 deck from the d_model-32 file (then
# --init-partial starts, listing what it left), a file with no tensor of the model, an expert
# width other than the dense d_ff, --upcycle into a deck without MoE blocks, --upcycle without
# --init-from.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "upcycle: $M not built"; exit 1; }
test_dir upcycle
demo_pairs "$T"
CHECK="/usr/bin/python3 tests/scripts/export_check.py"
write_tiny_deck "$T" "${EXPORT_KEYS[@]}" run.steps=8 run.log_every=4 run.seed=11 moe.router=top2 moe.every=0 \
  moe.capacity_factor_eval=2.0
export_or_fail() { "$M" export "$T/$1" -o "$T/$1.safetensors" >/dev/null 2>"$T/$1.export.log" || { cat "$T/$1.export.log"; fail "export $1"; }; }
eval_loss() {  # eval_loss NAME NP SET...: meshmoe eval's valid_loss of run NAME
  local name=$1 np=$2; shift 2
  mpirun -np "$np" "$M" eval "$T/deck.toml" "$@" --checkpoint "$T/$name" --max-examples 1 --max-len 4 -o "$T/$name.eval.h5" \
    >"$T/$name.eval.log" 2>&1 || { cat "$T/$name.eval.log" >&2; return 1; }
  /usr/bin/python3 -c "import h5py,sys; print(repr(float(h5py.File(sys.argv[1])['/'].attrs['valid_loss'])))" "$T/$name.eval.h5"
}
close() {  # close WHAT A B: |A - B| <= 1e-5 |B|
  /usr/bin/python3 -c "import sys; a, b = float(sys.argv[2]), float(sys.argv[3]); r = abs(a - b) / abs(b)
print(('ok   ' if r <= 1e-5 else 'FAIL ') + sys.argv[1] + ': %.9g against the dense %.9g, rel %.2e (limit 1e-5)' % (a, b, r))
sys.exit(r > 1e-5)" "$@"
}
train_or_fail dense 1
export_or_fail dense
dense_loss=$(eval_loss dense 1) || fail "eval dense"
moe=(--set moe.every=2 --set run.steps=1 --set optim.lr=1e-30 --set optim.warmup_steps=0)
d2t2=(--set mesh.data=2 --set mesh.tensor=2)

train_or_fail up1 1 "${moe[@]}" --init-from "$T/dense.safetensors" --upcycle
grep -q "2 upcycled" "$T/up1.log" || { cat "$T/up1.log"; fail "up1: not 2 expert tensors upcycled"; }
export_or_fail up1
$CHECK upcycled "$T/dense.safetensors" "$T/up1.safetensors" || fail "upcycled tensors"
close "upcycled top-2, 1 rank" "$(eval_loss up1 1 "${moe[@]}")" "$dense_loss" || fail "upcycled loss, 1 rank"

train_or_fail up4 4 "${moe[@]}" "${d2t2[@]}" --init-from "$T/dense/ckpt" --upcycle
export_or_fail up4
$CHECK same "$T/up1.safetensors" "$T/up4.safetensors" || fail "upcycled on data 2 x tensor 2"
close "upcycled top-2, data 2 x tensor 2" "$(eval_loss up4 4 "${moe[@]}" "${d2t2[@]}")" "$dense_loss" || fail "upcycled loss, 4 ranks"

train_or_fail top1 1 "${moe[@]}" --set moe.router=top1 --set moe.capacity_factor_eval=4.0 --init-from "$T/dense.safetensors" --upcycle
export_or_fail top1
$CHECK top1 "$T/dense.safetensors" "$T/top1.safetensors" "$T/data.h5" || fail "Switch top-1 upcycled"
eval_loss top1 1 "${moe[@]}" --set moe.router=top1 --set moe.capacity_factor_eval=4.0 >/dev/null || fail "eval top1"
$CHECK loss "$T/top1.safetensors" "$T/data.h5" "$T/top1.eval.h5" || fail "Switch top-1 upcycled: meshmoe's loss is not the PyTorch module's"

train_or_fail noise1 1 "${moe[@]}" --init-from "$T/dense.safetensors" --upcycle --upcycle-noise 0.05
train_or_fail noise4 4 "${moe[@]}" "${d2t2[@]}" --init-from "$T/dense.safetensors" --upcycle --upcycle-noise 0.05
export_or_fail noise1
export_or_fail noise4
$CHECK same "$T/noise1.safetensors" "$T/noise4.safetensors" || fail "upcycle noise differs between meshes"
$CHECK same "$T/noise1.safetensors" "$T/up1.safetensors" >/dev/null && fail "upcycle noise changed nothing"
echo "ok   --upcycle-noise: the same bytes on 1 rank and on data 2 x tensor 2, not the noiseless ones"

# refused NAME WANT ARGS...: `train` exits 2 on 2 ranks with WANT in its output.
refused() {
  local name=$1 want=$2; shift 2
  timeout 60 mpirun -np 2 "$M" train "$T/deck.toml" --set run.out_dir="$T/$name" --set run.steps=1 --set mesh.data=2 "$@" \
    >"$T/$name.log" 2>&1
  local rc=$?
  [ $rc = 2 ] && grep -qF -- "$want" "$T/$name.log" || { cat "$T/$name.log"; fail "$name: exit $rc, wanted 2 and '$want'"; }
  echo "ok   $name refused: $(grep -m1 -F -- "$want" "$T/$name.log")"
}
refused wider "blocks.0.attn.wq: [32, 32] in the file, [64, 64] in this model" --set model.d_model=64 --init-from "$T/dense.safetensors"
train_or_fail partial 2 --set model.d_model=64 --set run.steps=1 --set mesh.data=2 --init-from "$T/dense.safetensors" --init-partial
grep -q "left at initialisation: blocks.0.attn.wq: \[32, 32\] in the file, \[64, 64\] in this model" "$T/partial.log" ||
  { cat "$T/partial.log"; fail "--init-partial does not list what it left"; }
echo "ok   --init-partial starts and lists the tensors of another shape"
/usr/bin/python3 -c "
import json, struct, sys
h = json.dumps({'other.w': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]}}).encode()
h += b' ' * (-len(h) % 8)
open(sys.argv[1], 'wb').write(struct.pack('<Q', len(h)) + h + struct.pack('<2f', 1, 2))" "$T/other.safetensors"
refused nothing "nothing would be copied" --init-from "$T/other.safetensors"
refused narrow "cannot be upcycled from blocks.1.mlp.w_in [32, 64]: one expert is [32, 32]" "${moe[@]}" --set moe.expert_d_ff=32 \
  --init-from "$T/dense.safetensors" --upcycle
refused no_moe "--upcycle: no expert tensor" --init-from "$T/dense.safetensors" --upcycle
refused no_file "--upcycle requires --init-from" --upcycle
echo "PASS upcycle"
