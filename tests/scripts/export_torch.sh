#!/usr/bin/env bash
# `meshmoe export` and postprocess/meshmoe_torch.py (docs/export.md), quick part (tier check): a
# Switch decoder trained on 1 rank, exported; the file's tensors are docs/export.md's table for
# its deck (names and shapes); the PyTorch module's validation loss of the file equals `meshmoe
# eval`'s of the checkpoint within 1e-5 relative (the eval.examples_per_language sample, with
# capacity drops: capacity_factor_eval 1.0); `train --init-from` the file round-trips bitwise (a
# run from it of one step at lr 1e-30, an update below the last bit of every weight, exported
# again, holds the same bytes: meshmoe writes no checkpoint of step 0) and a run from it is bitwise the run
# from the checkpoint (the same logged losses, the same exported tensors); export refuses an
# output that is its input (exit 2); a multi-query model (model.kv_heads = 1) exports with its
# [M, M / heads] key/value projections and the module reproduces its loss. The sharded and encoder-decoder cases: export_sharded.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "export_torch: $M not built"; exit 1; }
test_dir export_torch
demo_pairs "$T"
write_tiny_deck "$T" "${EXPORT_KEYS[@]}" run.name=export run.steps=6 run.seed=5 moe.router=top1 \
  moe.capacity_factor_eval=1.0
CHECK="/usr/bin/python3 tests/scripts/export_check.py"
train_or_fail src 1
"$M" export "$T/src" -o "$T/src.safetensors" >"$T/export.log" 2>&1 || { cat "$T/export.log"; fail "export failed"; }
cat "$T/export.log"
$CHECK table "$T/src.safetensors" || fail "tensor table"
"$M" eval "$T/deck.toml" --checkpoint "$T/src" --max-examples 1 --max-len 4 -o "$T/eval.h5" >"$T/eval.log" 2>&1 ||
  { cat "$T/eval.log"; fail "meshmoe eval failed"; }
$CHECK loss "$T/src.safetensors" "$T/data.h5" "$T/eval.h5" || fail "PyTorch loss"
/usr/bin/python3 postprocess/meshmoe_torch.py "$T/src.safetensors" --data "$T/data.h5" | grep -q "^validation loss " ||
  fail "meshmoe_torch.py's command line"

# The round trip: a run from the file whose one update is below every weight's last bit.
train_or_fail rt 1 --set run.steps=1 --set optim.lr=1e-30 --set optim.warmup_steps=0 --init-from "$T/src.safetensors"
grep -q "init from $T/src.safetensors: 25 parameters copied, 0 kept" "$T/rt.log" ||
  { cat "$T/rt.log"; fail "init from the safetensors file: not every parameter copied"; }
"$M" export "$T/rt" -o "$T/rt.safetensors" >/dev/null || fail "export of the round trip"
$CHECK same "$T/src.safetensors" "$T/rt.safetensors" || fail "round trip"

# A run from the file is the run from the checkpoint, bitwise.
train_or_fail from_h5 1 --set run.steps=3 --init-from "$T/src"
train_or_fail from_st 1 --set run.steps=3 --init-from "$T/src.safetensors"
steps() { grep -E "^step +[0-9]+/" "$1" | sed -E 's/\| +[0-9]+ tok\/s.*//'; }  # the losses, not the times
[ -n "$(steps "$T/from_h5.log")" ] || { cat "$T/from_h5.log"; fail "no step lines"; }
diff <(steps "$T/from_h5.log") <(steps "$T/from_st.log") || fail "the run from the safetensors file differs"
"$M" export "$T/from_h5" -o "$T/from_h5.safetensors" >/dev/null && "$M" export "$T/from_st" -o "$T/from_st.safetensors" >/dev/null ||
  fail "export after the runs"
$CHECK same "$T/from_h5.safetensors" "$T/from_st.safetensors" || fail "the runs' weights differ"

# Grouped-query attention (model.kv_heads = 1 of 2 heads: multi-query): wk, wv [M, M / 2] in the
# table, and the PyTorch module's repeat_kv reproduces meshmoe eval's loss.
train_or_fail gqa 1 --set run.steps=3 --set model.kv_heads=1
"$M" export "$T/gqa" -o "$T/gqa.safetensors" >/dev/null || fail "export of the kv_heads run"
$CHECK table "$T/gqa.safetensors" || fail "tensor table with kv_heads"
"$M" eval "$T/deck.toml" --set model.kv_heads=1 --checkpoint "$T/gqa" --max-examples 1 --max-len 4 -o "$T/gqa-eval.h5" \
  >"$T/gqa-eval.log" 2>&1 || { cat "$T/gqa-eval.log"; fail "meshmoe eval of the kv_heads run failed"; }
$CHECK loss "$T/gqa.safetensors" "$T/data.h5" "$T/gqa-eval.h5" || fail "PyTorch loss with kv_heads"
# Refusals.
ck=$(ls "$T"/src/ckpt/step_*.h5 | tail -1)
"$M" export "$ck" -o "$ck" >"$T/self.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "is the checkpoint itself" "$T/self.log" || { cat "$T/self.log"; fail "export onto its input: exit $rc"; }
"$M" export "$T/src" -o "$T/nodir/x.safetensors" >"$T/nodir.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "does not exist" "$T/nodir.log" || { cat "$T/nodir.log"; fail "export into a missing directory: exit $rc"; }
echo "ok   export refuses its input as output and a missing directory (exit 2)"
# The PyTorch module refuses a model of a deck choice it does not compute (here RMSNorm).
train_or_fail rms 1 --set run.steps=1 --set model.norm=rmsnorm
"$M" export "$T/rms" -o "$T/rms.safetensors" >/dev/null || fail "export of the rmsnorm run"
/usr/bin/python3 postprocess/meshmoe_torch.py "$T/rms.safetensors" --data "$T/data.h5" >"$T/rms.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "model.norm = 'rmsnorm': this module computes model.norm = 'layernorm' only" "$T/rms.log" ||
  { cat "$T/rms.log"; fail "meshmoe_torch.py on an rmsnorm model: exit $rc"; }
echo "ok   meshmoe_torch.py refuses a deck choice it does not compute (exit 2)"
echo "PASS export_torch"
