#!/usr/bin/env bash
# `meshmoe export --layout hf` (docs/export.md "The Hugging Face Mixtral layout"): a Mixtral-shaped
# decoder (RMSNorm, rope, grouped-query attention (2 key/value heads of 4), SwiGLU experts in every
# block, softmax_topk top-2, untied head, dropless)
# trained on 1 rank and exported with -o DIR; the file's header holds docs/export.md's Mixtral
# table for its config.json (names, shapes, F32) and config.json the deck's model; a Mixtral forward
# written from Hugging Face's modeling_mixtral.py equations, reading only the file and config.json,
# gives `meshmoe eval`'s validation loss within 1e-5 relative; `train --init-from` the file round-trips
# bitwise (one step at lr 1e-30, exported again: the same bytes) and a run from it is bitwise the run
# from the checkpoint; a tied model's file has no lm_head.weight; export refuses a deck the layout
# cannot hold (exit 2, naming each key) and --config without --layout hf; meshmoe_torch.py refuses
# the file (exit 2, pointing to Hugging Face's MixtralForCausalLM).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "export_hf: $M not built"; exit 1; }
test_dir export_hf
demo_pairs "$T"
write_tiny_deck "$T" "${EXPORT_KEYS[@]}" run.name=export_hf run.steps=6 run.seed=7 model.num_heads=4 \
  model.kv_heads=2 model.norm=rmsnorm model.position=rope model.activation=swiglu model.tied_embeddings=false \
  moe.router=topk moe.top_k=2 moe.gate=softmax_topk moe.every=1 moe.expert_d_ff=24 moe.dropless=true
CHECK="/usr/bin/python3 tests/scripts/export_hf_check.py"
train_or_fail src 1
mkdir -p "$T/hf"
"$M" export "$T/src" -o "$T/hf" --layout hf >"$T/export.log" 2>&1 || { cat "$T/export.log"; fail "export --layout hf failed"; }
cat "$T/export.log"
$CHECK table "$T/hf/model.safetensors" "$T/hf/config.json" || fail "Mixtral tensor table"
"$M" eval "$T/deck.toml" --checkpoint "$T/src" --max-examples 1 --max-len 4 -o "$T/eval.h5" >"$T/eval.log" 2>&1 ||
  { cat "$T/eval.log"; fail "meshmoe eval failed"; }
$CHECK loss "$T/hf/model.safetensors" "$T/hf/config.json" "$T/data.h5" "$T/eval.h5" || fail "Mixtral forward's loss"

# The round trip: a run from the file whose one update is below every weight's last bit.
train_or_fail rt 1 --set run.steps=1 --set optim.lr=1e-30 --set optim.warmup_steps=0 --init-from "$T/hf/model.safetensors"
grep -q "init from $T/hf/model.safetensors: 21 parameters copied, 0 kept" "$T/rt.log" ||
  { cat "$T/rt.log"; fail "init from the hf file: not every parameter copied"; }
"$M" export "$T/rt" -o "$T/rt.safetensors" --layout hf --config "$T/rt.json" >/dev/null || fail "export of the round trip"
/usr/bin/python3 tests/scripts/export_check.py same "$T/hf/model.safetensors" "$T/rt.safetensors" || fail "round trip"
cmp -s "$T/hf/config.json" "$T/rt.json" || fail "the round trip's config.json differs"

# A run from the hf file is the run from the checkpoint, bitwise.
train_or_fail from_h5 1 --set run.steps=3 --init-from "$T/src"
train_or_fail from_hf 1 --set run.steps=3 --init-from "$T/hf/model.safetensors"
steps() { grep -E "^step +[0-9]+/" "$1" | sed -E 's/\| +[0-9]+ tok\/s.*//'; }  # the losses, not the times
[ -n "$(steps "$T/from_h5.log")" ] || { cat "$T/from_h5.log"; fail "no step lines"; }
diff <(steps "$T/from_h5.log") <(steps "$T/from_hf.log") || fail "the run from the hf file differs"
"$M" export "$T/from_h5" -o "$T/from_h5.safetensors" >/dev/null && "$M" export "$T/from_hf" -o "$T/from_hf.safetensors" >/dev/null ||
  fail "export after the runs"
/usr/bin/python3 tests/scripts/export_check.py same "$T/from_h5.safetensors" "$T/from_hf.safetensors" || fail "the runs' weights differ"

# Tied embeddings, top2 with moe.gate = softmax (the same gates): no lm_head.weight, tie_word_embeddings true.
train_or_fail tied 1 --set run.steps=1 --set model.tied_embeddings=true --set moe.router=top2 --set moe.gate=softmax
"$M" export "$T/tied" -o "$T/tied.safetensors" --layout hf --config "$T/tied.json" >/dev/null || fail "export of the tied run"
$CHECK table "$T/tied.safetensors" "$T/tied.json" || fail "Mixtral tensor table, tied"

# Refusals.
train_or_fail gshard 1 --set run.steps=1 --set model.norm=layernorm --set model.activation=gelu --set moe.every=2
"$M" export "$T/gshard" -o "$T/gshard.safetensors" --layout hf >"$T/gshard.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q 'model.norm = "layernorm": the Hugging Face Mixtral layout needs "rmsnorm"' "$T/gshard.log" &&
  grep -q 'model.activation = "gelu"' "$T/gshard.log" && grep -q 'moe.every = 2' "$T/gshard.log" &&
  [ ! -e "$T/gshard.safetensors" ] || { cat "$T/gshard.log"; fail "export --layout hf of a GShard-era deck: exit $rc"; }
"$M" export "$T/src" -o "$T/x.safetensors" --config "$T/x.json" >"$T/cfg.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "needs --layout hf" "$T/cfg.log" || { cat "$T/cfg.log"; fail "--config without --layout hf: exit $rc"; }
/usr/bin/python3 postprocess/meshmoe_torch.py "$T/hf/model.safetensors" --data "$T/data.h5" >"$T/torch.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "an export of --layout hf" "$T/torch.log" || { cat "$T/torch.log"; fail "meshmoe_torch.py on an hf file: exit $rc"; }
echo "ok   export --layout hf refuses a deck it cannot hold (each key named) and --config without it, meshmoe_torch.py the file (exit 2)"
echo "PASS export_hf"
