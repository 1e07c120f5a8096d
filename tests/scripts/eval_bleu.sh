#!/usr/bin/env bash
# `meshmoe eval` and eval.bleu_every (docs/user-guide.md "Translation"): a small MoE model (GShard top-2) trains
# on a generated two-language gettext corpus with translation scores every 40 steps, and again
# without them: the losses (training and validation) must be bitwise equal. Then `meshmoe eval`
# of its checkpoint must give
#   - per-language validation losses bitwise equal to those the training logged at that step;
#   - for each language, the BLEU and chrF that `meshmoe score` gives on `meshmoe translate`'s
#     output for the sources and references it wrote (--write-text), bitwise; those sources and
#     references equal postprocess/valid_pairs.py's;
#   - with --beam 1 --max-examples 8, the BLEU and chrF the training logged (/eval/bleu, /eval/chrf),
#     on valid_pairs.py --max 8's pairs (a hashed sample per language, not the first 8);
#   - on data=2, tensor=2, 2x2 and pipe=2 meshes, and with --batch 3 on data=2, data=4 with expert
#     replicas and pipe=2 x data=2 (the batches split over the data ranks), the one-rank
#     translations and scores, losses to 1e-5;
# and the training's scores on data=2 (each data rank translating one language), on tensor=2 with
# experts over tensor and on pipe=2 equal one rank's (pipe=2: losses bitwise with and without); the same on and off, and 2x2 against one
# rank, for an encoder-decoder (model.arch = "encdec").
# Refusals (exit 2): an unknown --langs, an unwritable -o, eval.bleu_every without a count.
# Needs $MESHMOE (default build/meshmoe), msgfmt, /usr/bin/python3 with h5py.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir eval-bleu
demo_pairs "$T" long
write_tiny_deck "$T" "${DECODE_KEYS[@]}" run.name=evalbleu run.steps=120 run.log_every=10 model.seq_len=48 \
  eval.every=40 eval.examples_per_language=6 eval.bleu_every=0 eval.bleu_examples=8 checkpoint.every=120
train_or_fail on 1 --set eval.bleu_every=40
train_or_fail off 1
train_or_fail on2 2 --set eval.bleu_every=40 --set mesh.data=2
train_or_fail on_isel 2 --set eval.bleu_every=40 --set mesh.tensor=2 --set moe.expert_axis=tensor
train_or_fail on_pipe 2 --set eval.bleu_every=40 --set mesh.pipe=2 --set optim.micro_batches=2
train_or_fail off_pipe 2 --set mesh.pipe=2 --set optim.micro_batches=2
grep "bleu step" "$T/on.log" || fail "no translation scores in the log"
# The encoder-decoder of the same data: scores on and off, one rank and data=2 x tensor=2.
encdec="--set model.arch=encdec --set run.steps=40 --set checkpoint.every=40"
train_or_fail encdec_on 1 $encdec --set eval.bleu_every=20
train_or_fail encdec_off 1 $encdec
train_or_fail encdec_on4 4 $encdec --set eval.bleu_every=20 --set mesh.data=2 --set mesh.tensor=2
$PYTHON - "$T/encdec_on/metrics.h5" "$T/encdec_off/metrics.h5" "$T/encdec_on4/metrics.h5" <<'PY'
import sys, h5py, numpy as np
on, off, on4 = (h5py.File(p, "r") for p in sys.argv[1:4])
for name in ("loss", "aux_loss", "grad_norm", "eval/loss", "eval/lang_loss"):
    assert np.array_equal(on[name][()], off[name][()], equal_nan=True), f"encdec {name}: bleu_every on and off differ"
rows = np.flatnonzero(np.isfinite(on["eval/bleu_all"][()]))
assert list(on["step"][()][rows]) == [20, 40]
assert np.array_equal(on4["eval/bleu"][()][rows], on["eval/bleu"][()][rows]) and \
    np.array_equal(on4["eval/chrf"][()][rows], on["eval/chrf"][()][rows]), (on4["eval/chrf"][()][rows], on["eval/chrf"][()][rows])
print("encdec bleu_every on/off: losses bitwise equal; 2x2 scores = one rank's:", on["eval/chrf"][()][rows[-1]])
PY
$PYTHON - "$T/on/metrics.h5" "$T/off/metrics.h5" "$T/on2/metrics.h5" "$T/data.h5" "$T/on_isel/metrics.h5" \
  "$T/on_pipe/metrics.h5" "$T/off_pipe/metrics.h5" <<'PY'
import sys, h5py, numpy as np
on, off, on2 = (h5py.File(p, "r") for p in sys.argv[1:4])
valid_pairs = h5py.File(sys.argv[4], "r")["languages/valid_pairs"][()]
isel, pipe, pipe_off = (h5py.File(p, "r") for p in sys.argv[5:8])
for name in ("loss", "aux_loss", "grad_norm", "eval/loss", "eval/lang_loss"):
    for a, b, what in ((on, off, ""), (pipe, pipe_off, "pipe=2: ")):
        a, b = a[name][()], b[name][()]
        assert a.shape == b.shape and np.array_equal(a, b, equal_nan=True), f"{what}{name}: bleu_every on and off differ"
step = on["step"][()]
bleu, chrf, sent = on["eval/bleu"][()], on["eval/chrf"][()], on["eval/bleu_sentences"][()]
rows = np.flatnonzero(np.isfinite(on["eval/bleu_all"][()]))
assert list(step[rows]) == [40, 80, 120], step[rows]
assert bleu.shape[1] == 2 and np.all(sent[rows] == np.minimum(8, valid_pairs)), sent[rows]
assert np.all(bleu[rows[-1]] > 0), bleu[rows[-1]]
assert on["eval/bleu"].attrs["units"] and on["eval/chrf"].attrs["description"]
assert "eval/bleu" not in off
# data=2 (each data rank translates one language's pairs), tensor=2 with experts over tensor and
# pipe=2 train to float tolerance of one rank; the greedy translations agree
for other in (on2, isel, pipe):
    assert np.allclose(other["loss"][()], on["loss"][()], rtol=1e-4, atol=1e-5)
    assert np.array_equal(other["eval/bleu"][()][rows], bleu[rows]) and np.array_equal(other["eval/chrf"][()][rows], chrf[rows]), \
        (other["eval/bleu"][()][rows], bleu[rows])
print("bleu_every on/off: losses bitwise equal; BLEU per language at 120:", bleu[rows[-1]], "chrF", chrf[rows[-1]])
PY

# meshmoe eval of the step-120 checkpoint, beam 4, every validation pair; the default output name.
mpirun -np 1 "$M" eval "$T/deck.toml" --checkpoint "$T/on" --write-text "$T/text" >"$T/eval.out" 2>"$T/eval.err" ||
  { cat "$T/eval.out" "$T/eval.err"; fail "eval failed"; }
cat "$T/eval.out"
[ -f "$T/on/eval-120.h5" ] || fail "no eval-120.h5 in the run directory"
grep -q "\[2/2\] fr" "$T/eval.err" || { cat "$T/eval.err"; fail "no progress lines"; }
for lang in de fr; do
  $PYTHON postprocess/valid_pairs.py "$T/data.h5" $lang "$T/$lang.src" "$T/$lang.ref" >/dev/null
  cmp "$T/$lang.src" "$T/text/$lang.src" && cmp "$T/$lang.ref" "$T/text/$lang.ref" ||
    fail "$lang: eval's sources or references differ from valid_pairs.py's"
  mpirun -np 1 "$M" translate "$T/deck.toml" --checkpoint "$T/on" --lang $lang --input "$T/$lang.src" >"$T/$lang.hyp"
  cmp "$T/$lang.hyp" "$T/text/$lang.hyp" || fail "$lang: eval's translations differ from translate's"
  "$M" score --hyp "$T/$lang.hyp" --ref "$T/$lang.ref" --json >"$T/$lang.json"
done
$PYTHON - "$T/on/eval-120.h5" "$T/on/metrics.h5" "$T/de.json" "$T/fr.json" "$T/data.h5" <<'PY'
import json, sys, h5py, numpy as np
ev, met = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
data = h5py.File(sys.argv[5], "r")
g = ev["languages"]
names = [n.decode() for n in g["name"][()]]
assert names == ["de", "fr"], names
assert ev.attrs["step"] == 120 and ev.attrs["beam"] == 4 and ev.attrs["checkpoint"].endswith("step_00000120.h5")
for i, (lang, path) in enumerate(zip(names, sys.argv[3:5])):
    s = json.load(open(path))
    assert g["bleu"][i] == s["bleu"] and g["chrf"][i] == s["chrf"], (lang, g["bleu"][i], s["bleu"], g["chrf"][i], s["chrf"])
    assert g["sentences"][i] == s["sentences"] and list(g["bleu_matches"][i]) == s["matches"]
# The per-language validation losses: what training logged at step 120, bitwise (same mesh).
step = met["step"][()]
row = int(np.flatnonzero((step == 120) & np.isfinite(met["eval/loss"][()]))[0])
langs = [x.decode() if isinstance(x, bytes) else x for x in met.attrs["languages"]]  # a string array
logged = met["eval/lang_loss"][row]
for i, lang in enumerate(names):
    assert g["valid_loss"][i] == logged[langs.index(lang)], (lang, g["valid_loss"][i], logged)
assert ev.attrs["valid_loss"] == met["eval/loss"][row]
assert np.array_equal(g["train_examples"][()], data["languages/train_pairs"][()]), g["train_examples"][()]
assert all(g["trained_tokens"][()] > 0)
for d in ("bleu", "chrf", "valid_loss", "sentences"):
    assert g[d].attrs["units"] and g[d].attrs["description"], d
print("eval = translate + score, bitwise:", dict(zip(names, g["bleu"][()])), "losses = training's")
PY

# Greedy on a sample of 8 pairs per language: what the training logged at step 120; the pairs are
# valid_pairs.py --max 8's (the same hashed sample), not the first 8 of the language.
mpirun -np 1 "$M" eval "$T/deck.toml" --checkpoint "$T/on" --beam 1 --max-examples 8 -o "$T/greedy.h5" \
  --write-text "$T/text8" >/dev/null 2>&1 || fail "eval --beam 1 failed"
for lang in de fr; do
  $PYTHON postprocess/valid_pairs.py "$T/data.h5" $lang "$T/$lang.8.src" "$T/$lang.8.ref" --max 8 >/dev/null
  cmp "$T/$lang.8.src" "$T/text8/$lang.src" && cmp "$T/$lang.8.ref" "$T/text8/$lang.ref" ||
    fail "$lang: eval --max-examples 8's sources or references differ from valid_pairs.py --max 8's"
  [ "$(wc -l <"$T/$lang.8.src")" = 8 ] || fail "$lang: not 8 sampled pairs"
  head -n 8 "$T/$lang.src" | cmp -s - "$T/$lang.8.src" && fail "$lang: the sample of 8 is the first 8 pairs"
done
$PYTHON - "$T/greedy.h5" "$T/on/metrics.h5" "$T/data.h5" <<'PY'
import sys, h5py, numpy as np
ev, met = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
valid_pairs = h5py.File(sys.argv[3], "r")["languages/valid_pairs"][()]
row = int(np.flatnonzero(met["step"][()] == 120)[-1])
assert np.array_equal(ev["languages/bleu"][()], met["eval/bleu"][row]), (ev["languages/bleu"][()], met["eval/bleu"][row])
assert np.array_equal(ev["languages/chrf"][()], met["eval/chrf"][row])
assert np.array_equal(ev["languages/sentences"][()], np.minimum(8, valid_pairs))
print("eval --beam 1 --max-examples 8 = the training's /eval/bleu, /eval/chrf")
PY

# Other meshes: the same translations and scores, losses to float tolerance; --batch 3 splits each
# language's pairs into batches that the data ranks share out (one more on some ranks than others).
for mesh in "2 --set mesh.data=2" "2 --set mesh.tensor=2" "4 --set mesh.data=2 --set mesh.tensor=2" \
            "2 --set mesh.pipe=2 --set optim.micro_batches=2" "2 --set mesh.data=2 --batch 3" \
            "4 --set mesh.data=4 --set mesh.expert_parallel=2 --batch 3" \
            "4 --set mesh.pipe=2 --set mesh.data=2 --set optim.micro_batches=2 --batch 3"; do
  set -- $mesh
  np=$1; shift
  mpirun -np "$np" "$M" eval "$T/deck.toml" --checkpoint "$T/on" -o "$T/mesh.h5" "$@" >/dev/null 2>"$T/mesh.err" ||
    { cat "$T/mesh.err"; fail "eval on $mesh failed"; }
  $PYTHON - "$T/on/eval-120.h5" "$T/mesh.h5" "$mesh" <<'PY'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r")["languages"] for p in sys.argv[1:3])
for d in ("bleu", "chrf", "sentences", "bleu_matches"):
    assert np.array_equal(a[d][()], b[d][()]), (sys.argv[3], d, a[d][()], b[d][()])
assert np.allclose(a["valid_loss"][()], b["valid_loss"][()], rtol=1e-5, atol=0), (a["valid_loss"][()], b["valid_loss"][()])
print("mesh", sys.argv[3], "= one rank")
PY
done

expect_exit2() {  # name grep-pattern command...
  local name=$1 pat=$2; shift 2
  set +e
  "$@" >"$T/$name.out" 2>&1
  local rc=$?
  set -e
  [ $rc = 2 ] && grep -q "$pat" "$T/$name.out" || { cat "$T/$name.out"; fail "$name: exit $rc, expected 2 and '$pat'"; }
}
expect_exit2 langs "not a language" mpirun -np 1 "$M" eval "$T/deck.toml" --checkpoint "$T/on" --langs de,xx -o "$T/x.h5"
expect_exit2 unwritable "cannot create" mpirun -np 1 "$M" eval "$T/deck.toml" --checkpoint "$T/on" -o "$T/no/such/dir/x.h5"
expect_exit2 nocount "eval.bleu_examples" mpirun -np 1 "$M" train "$T/deck.toml" --set eval.bleu_every=10 \
  --set eval.bleu_examples=0 --set eval.examples_per_language=0 --set run.out_dir="$T/x"
"$M" eval --help | grep -q -- "--max-examples" || fail "eval --help"
echo "eval_bleu: ok"
