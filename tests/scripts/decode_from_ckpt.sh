#!/usr/bin/env bash
# The checkpoint is enough (docs/user-guide.md "Translation"): a small top-2 MoE model trained on
# data=2 x tensor=2 (4 ranks) is decoded from its checkpoint alone, without a deck and without the
# training mesh: `translate` and `generate` on 1 rank, on 3 ranks (data=3: every rank holds every
# expert) and on pipe=2 (the stored deck has optim.micro_batches = 1, a training key a decoding
# mesh no longer asks for) print the training mesh's output byte for byte; `eval` on 1 and 3 ranks
# writes the same translations and a validation loss within 1e-5 relative of the training mesh's
# (the same per-token losses, their fp32 GEMMs split otherwise over tensor, and each batch of 8
# padded with 4 rows without targets to split over 3 data ranks: the same examples and routing
# groups, other sums). A deck that gives
# another model key is refused (exit 2, naming the key, both values); a deck's data and decoding
# keys apply; other data is still refused without --allow-other-data; `ckpt info` names the model
# and `ckpt verify` refuses (exit 1) a checkpoint whose tensors are not its stored deck's model.
# Needs $MESHMOE (default build/meshmoe), msgfmt, /usr/bin/python3 with h5py.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir decode-from-ckpt
demo_pairs "$T"
write_tiny_deck "$T" "${DECODE_KEYS[@]}" run.name=decode run.steps=150 run.log_every=50 \
  eval.examples_per_language=8 checkpoint.every=150
train_or_fail run 4 --set mesh.data=2 --set mesh.tensor=2
printf 'Datei 7 kopiert\nOrdner 12 entfernt\nDatei 31 kopiert\nOrdner 3 entfernt\n' > "$T/in.txt"

decode() {  # name np command [args...]: $T/name.out (stdout), $T/name.err; the exit status checked
  local name=$1 np=$2 cmd=$3; shift 3
  mpirun -np "$np" "$M" "$cmd" --checkpoint "$T/run" "$@" >"$T/$name.out" 2>"$T/$name.err" ||
    { cat "$T/$name.err"; fail "$name: exit code $?"; }
}
both() {  # tag np [args...]: translations (beam 2, batches of 1) and greedy samples
  local tag=$1 np=$2; shift 2
  decode "$tag.tr" "$np" translate --lang de --input "$T/in.txt" --beam 2 --batch 1 "$@"
  decode "$tag.gen" "$np" generate --lang fr --prompt "fichier 3" --prompt "Datei" --max-new 12 "$@"
}
both train 4 --set mesh.data=2 --set mesh.tensor=2
grep -q "copied file 7" "$T/train.tr.out" || { cat "$T/train.tr.out"; fail "the trained model does not translate 'Datei 7 kopiert'"; }
both one 1
both three 3
both pipe2 2 --set mesh.pipe=2
for tag in one three pipe2; do
  for what in tr gen; do cmp "$T/train.$what.out" "$T/$tag.$what.out" || fail "$tag: $what differs from the training mesh's"; done
done
# With the training deck: its keys agree with the checkpoint's; on pipe=2 its optim.micro_batches = 1
# is no concern of decoding.
decode deck.pipe2 2 translate "$T/deck.toml" --lang de --input "$T/in.txt" --beam 2 --batch 1 --set mesh.pipe=2
cmp "$T/train.tr.out" "$T/deck.pipe2.out" || fail "with the deck on pipe=2: differs from the training mesh's"

# eval: the same translations, the validation loss within 1e-5 relative.
for mesh in "train 4 --set mesh.data=2 --set mesh.tensor=2" "one 1" "three 3" "pipe2 2 --set mesh.pipe=2"; do
  set -- $mesh
  tag=$1 np=$2; shift 2
  decode "eval.$tag" "$np" eval -o "$T/eval.$tag.h5" --write-text "$T/text.$tag" --max-examples 4 "$@"
done
grep -q "each validation batch padded to 12 rows without targets (the same examples and loss)" "$T/eval.three.err" || { cat "$T/eval.three.err"; fail "eval on 3 ranks: no note of its batch"; }
for tag in one three pipe2; do
  for lang in de fr; do cmp "$T/text.train/$lang.hyp" "$T/text.$tag/$lang.hyp" || fail "eval $tag: $lang translations differ"; done
done
$PYTHON - "$T" <<'PY'
import sys, h5py
t = sys.argv[1]
tags = ("train", "one", "three", "pipe2")
loss = {tag: float(h5py.File(f"{t}/eval.{tag}.h5", "r").attrs["valid_loss"]) for tag in tags}
tokens = {tag: float(h5py.File(f"{t}/eval.{tag}.h5", "r").attrs["valid_tokens"]) for tag in tags}
print("eval losses", loss, "tokens", tokens)
assert len(set(tokens.values())) == 1, tokens
for tag in tags[1:]:
    assert abs(loss[tag] - loss["train"]) <= 1e-5 * loss["train"], (tag, loss)
PY

# A deck of another model: exit 2 naming the key, the file and line, both values.
sed 's/^d_model = 32/d_model = 64/' "$T/deck.toml" >"$T/other.toml"
set +e
mpirun -np 1 "$M" translate "$T/other.toml" --checkpoint "$T/run" --lang de --input "$T/in.txt" >"$T/other.out" 2>&1
rc=$?
set -e
[ $rc = 2 ] && grep -q "other.toml:.*model.d_model = 64, but the checkpoint .* was trained with model.d_model = 32" "$T/other.out" ||
  { cat "$T/other.out"; fail "a deck of another model: exit $rc"; }
# A deck's decoding keys apply: capacity_factor_eval 0.5 with moe.decode_capacity = eval drops choices.
printf '[moe]\ndecode_capacity = "eval"\ncapacity_factor_eval = 0.5\n' >"$T/decode.toml"
decode uncapped 1 translate --lang de --input "$T/in.txt" --beam 3 --batch 4
decode capped 1 translate "$T/decode.toml" --lang de --input "$T/in.txt" --beam 3 --batch 4
decode capped.set 1 translate --lang de --input "$T/in.txt" --beam 3 --batch 4 --set moe.decode_capacity=eval --set moe.capacity_factor_eval=0.5
cmp "$T/capped.out" "$T/capped.set.out" || fail "the deck's decoding keys and --set differ"
cmp -s "$T/capped.out" "$T/uncapped.out" && fail "the deck's moe.capacity_factor_eval = 0.5 changed nothing"
# Other data: refused (exit 2) unless --allow-other-data.
mkdir -p "$T/other" && demo_pairs "$T/other" long
set +e
mpirun -np 1 "$M" translate --checkpoint "$T/run" --lang de --input "$T/in.txt" --set data.path="$T/other/data.h5" >"$T/od.out" 2>&1
rc=$?
set -e
[ $rc = 2 ] || { cat "$T/od.out"; fail "a checkpoint of other data: exit $rc, not 2"; }
decode od.allowed 1 translate --lang de --input "$T/in.txt" --set data.path="$T/other/data.h5" --allow-other-data
# ckpt info names the model of the stored deck.
"$M" ckpt info "$T/run" >"$T/info.out"
grep -q "^model  *decoder, d_model 32, 2 blocks, 4 heads, d_ff 64, seq_len 40, 4 experts every 2 blocks (top2); trained on mesh 1x2x2" "$T/info.out" ||
  { cat "$T/info.out"; fail "ckpt info: no model line of the stored deck"; }
# ckpt verify checks the tensors against the stored deck's model: a deck forged to another d_ff is bad.
"$M" ckpt verify "$T/run" >"$T/verify.out" 2>&1 || { cat "$T/verify.out"; fail "ckpt verify of the run: exit $?"; }
cp "$(ls "$T"/run/ckpt/step_*.h5 | tail -1)" "$T/forged.h5"
$PYTHON - "$T/forged.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    deck = f.attrs["deck"]
    deck = deck.decode() if isinstance(deck, bytes) else deck
    assert "d_ff = 64\n" in deck
    f.attrs["deck"] = deck.replace("d_ff = 64\n", "d_ff = 128\n")
PY
set +e
"$M" ckpt verify "$T/forged.h5" >"$T/forged.out" 2>&1
rc=$?
set -e
[ $rc = 1 ] && grep -q "its tensors are not the model its stored deck defines: blocks.0.mlp.w_in is \[32, 64\], its stored deck's model has \[32, 128\]" "$T/forged.out" ||
  { cat "$T/forged.out"; fail "ckpt verify of a checkpoint whose deck was forged: exit $rc"; }
echo "decode_from_ckpt: ok"
