#!/usr/bin/env bash
# The encoder-decoder learns a task only cross-attention can solve: a tiny model.arch =
# "encdec" model (2 + 2 blocks, top-2 MoE in each stack) trains 800 steps (cosine schedule) on the
# reverse task of tiny_pairs (2000 generated words of 3-6 letters, their reversal as the source)
# and must reach a validation loss below 0.1 nats per target token on held-out words (about 3e-4
# when written; without the source the letters of a word are random: about log 26 = 3.3 nats per
# letter). Then `meshmoe translate` (greedy and beam 4) must translate every held-out word exactly,
# and `meshmoe score` must give chrF 100 and BLEU 100 (BLEU on the letters: a one-word line has no
# word 2-grams); `meshmoe eval` must give the same words (chrF 100) and `meshmoe score`'s BLEU.
# (At 600 steps one seed of five, the seed here, still missed 3 of 193 words: the held-out loss had
# not settled; 800 steps got every word right for seeds 1-5.)
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir encdec-reverse
tiny_pairs "$T" 2000
cat > "$T/deck.toml" <<DECK
[run]
name = "reverse"
steps = 800
log_every = 50
seed = 3
[model]
arch = "encdec"
seq_len = 16
d_model = 64
num_layers = 2
num_heads = 4
d_ff = 128
[moe]
num_experts = 4
every = 2
router = "top2"
group_size = 64
[optim]
batch_size = 16
lr = 3e-3
warmup_steps = 40
schedule = "cosine"
[data]
path = "$T/data.h5"
[eval]
every = 100
batches = 4
[checkpoint]
every = 0
DECK
mpirun -np 1 "$M" train "$T/deck.toml" --set run.out_dir="$T/run" >"$T/run.log" 2>&1 || { cat "$T/run.log"; fail "training failed"; }
grep "eval step" "$T/run.log"
$PYTHON - "$T/run/metrics.h5" <<'PY'
import sys, h5py, numpy as np
ev = h5py.File(sys.argv[1], "r")["eval/loss"][()]
ev = ev[np.isfinite(ev)]
print(f"validation loss after 800 steps: {ev[-1]:.4f} (limit 0.1)")
sys.exit(0 if len(ev) == 8 and ev[-1] < 0.1 else 1)
PY
# Exact translation of every held-out pair (src: the reversed word, ref: the word).
$PYTHON postprocess/valid_pairs.py "$T/data.h5" rv "$T/src.txt" "$T/ref.txt" >/dev/null
[ "$(wc -l <"$T/src.txt")" -ge 100 ] || fail "fewer held-out pairs than expected"
for beam in 1 4; do
  "$M" translate "$T/deck.toml" --checkpoint "$T/run" --input "$T/src.txt" --beam $beam >"$T/out$beam.txt" ||
    fail "translate --beam $beam failed"
  wrong=$(paste -d '|' "$T/out$beam.txt" "$T/ref.txt" | awk -F '|' '$1 != $2' | wc -l)
  echo "beam $beam: $wrong of $(wc -l <"$T/ref.txt") held-out words translated wrong"
  [ "$(wc -l <"$T/out$beam.txt")" = "$(wc -l <"$T/ref.txt")" ] && [ "$wrong" = 0 ] ||
    { paste "$T/src.txt" "$T/out$beam.txt" "$T/ref.txt" | awk '$2 != $3' | head; fail "beam $beam: not every held-out word exact"; }
  "$M" score --hyp "$T/out$beam.txt" --ref "$T/ref.txt" --json >"$T/words$beam.json"
  sed 's/./& /g' "$T/out$beam.txt" >"$T/out$beam.letters"
  sed 's/./& /g' "$T/ref.txt" >"$T/ref.letters"
  "$M" score --hyp "$T/out$beam.letters" --ref "$T/ref.letters" --json >"$T/letters$beam.json"
  $PYTHON - "$T/words$beam.json" "$T/letters$beam.json" <<'PY'
import json, sys
words, letters = (json.load(open(f)) for f in sys.argv[1:3])
print(f"chrF {words['chrf']:.6f}, BLEU on letters {letters['bleu']:.6f}")
sys.exit(0 if abs(words["chrf"] - 100) < 1e-9 and abs(letters["bleu"] - 100) < 1e-9 else 1)
PY
done
# meshmoe eval (beam 4): the same held-out pairs, every one exact, so chrF 100 in its file, and its
# BLEU is what `meshmoe score` gives on the words.
mpirun -np 1 "$M" eval "$T/deck.toml" --checkpoint "$T/run" --write-text "$T/eval" -o "$T/eval.h5" >"$T/eval.out" 2>&1 ||
  { cat "$T/eval.out"; fail "eval failed"; }
cmp "$T/eval/rv.ref" "$T/ref.txt" && cmp "$T/eval/rv.hyp" "$T/ref.txt" || fail "eval's translations are not the references"
$PYTHON - "$T/eval.h5" "$T/words4.json" <<'PY'
import json, sys, h5py
g, words = h5py.File(sys.argv[1], "r")["languages"], json.load(open(sys.argv[2]))
print(f"meshmoe eval: chrF {g['chrf'][0]:.6f}, BLEU {g['bleu'][0]:.6f} over {g['sentences'][0]} words")
sys.exit(0 if g["chrf"][0] == 100 and g["bleu"][0] == words["bleu"] and g["sentences"][0] == words["sentences"] else 1)
PY
