#!/usr/bin/env bash
# `meshmoe prep gettext --tokenizer spm` on a generated locale tree (4 languages): the SentencePiece
# model is stored in the file, every example is <lang> pieces SEP pieces EOS with the loss from the
# English pieces on, and Debian's spm_decode (an independent decoder) turns each example's pieces back
# into its translation and English text; a deck with data.tokenizer = spm trains on it; a deck that
# says bytes, or another data.spm_pieces, is refused with exit 2 naming the prep command; the same
# inputs give the same tokens and model twice. Needs $MESHMOE, msgfmt, spm_decode, /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
test_dir prep_spm
PY=/usr/bin/python3

$PY - "$T/locale" <<'PY'
import os, sys
root = sys.argv[1]
words = ["open", "close", "file", "save", "print", "the", "window", "new", "folder", "view", "help", "edit"]
english = [f"{words[i % 12]} {words[(i // 12) % 12]} {words[(i * 7) % 12]} {i}" for i in range(300)]
for lang, n in (("de", 300), ("fr", 200), ("ja", 120), ("sv", 80)):
    os.makedirs(f"{root}/{lang}/LC_MESSAGES")
    with open(f"{root}/{lang}.po", "w") as f:
        f.write('msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\n')
        for e in english[:n]:
            f.write(f'msgid "{e}"\nmsgstr "{lang}: {" ".join(w[::-1] for w in e.split())} \u00e9"\n\n')
PY
for po in "$T"/locale/*.po; do l=$(basename "$po" .po); msgfmt -o "$T/locale/$l/LC_MESSAGES/app.mo" "$po"; done

"$M" prep gettext --root "$T/locale" --tokenizer spm --spm-pieces 300 --valid-percent 10 -q -o "$T/data.h5" >"$T/prep.log" 2>&1 ||
  { cat "$T/prep.log"; fail "prep --tokenizer spm failed"; }
"$M" prep gettext --root "$T/locale" --tokenizer spm --spm-pieces 300 --valid-percent 10 -q -o "$T/data2.h5" >/dev/null 2>&1

$PY - "$T" <<'PY' || fail "the spm dataset is not what it should be"
import subprocess, sys
import h5py, numpy as np
T = sys.argv[1]
f = h5py.File(f"{T}/data.h5", "r")
assert f.attrs["tokenizer"] == "spm+specials+langtags", f.attrs["tokenizer"]
langs = [x.decode() for x in f["languages/name"][()]]
first_piece = 260 + len(langs)
assert f.attrs["vocab_size"] == first_piece + 300, f.attrs["vocab_size"]
open(f"{T}/spm.model", "wb").write(bytes(f["tokenizer/spm_model"][()]))
tok, off, mask, lang = (f[f"train/{k}"][()] for k in ("tokens", "doc_offsets", "loss_mask", "lang"))
lines, want = [], []
for e in range(len(lang)):
    t, m = tok[off[e]:off[e + 1]], mask[off[e]:off[e + 1]]
    assert t[0] == 260 + lang[e] and t[-1] == 258, (e, t)
    sep = int(np.where(t == 259)[0][0])
    assert m[:sep + 1].sum() == 0 and m[sep + 1:].all(), (e, m)   # loss on the English pieces and EOS
    src, eng = t[1:sep], t[sep + 1:-1]
    assert (src >= first_piece).all() and (eng >= first_piece).all(), e
    lines += [" ".join(str(x - first_piece) for x in src), " ".join(str(x - first_piece) for x in eng)]
    want.append(langs[lang[e]])
out = subprocess.run(["spm_decode", f"--model={T}/spm.model", "--input_format=id"], input="\n".join(lines) + "\n",
                     capture_output=True, text=True, check=True).stdout.split("\n")
for e, l in enumerate(want):
    src, eng = out[2 * e], out[2 * e + 1]
    assert src.startswith(f"{l}: ") and src.endswith(" \u00e9"), (src, l)
    words = eng.split()
    assert len(words) == 4 and src[len(l) + 2:].split()[:3] == [w[::-1] for w in words[:3]], (src, eng)
print(f"{len(lang)} train examples decode to their translation and English text; vocab {f.attrs['vocab_size']}")
PY

cat >"$T/deck.toml" <<EOF
[run]
name = "spm"
steps = 3
log_every = 1
[model]
d_model = 32
num_layers = 2
num_heads = 2
d_ff = 64
seq_len = 32
[moe]
num_experts = 2
group_size = 32
[optim]
batch_size = 4
[data]
path = "$T/data.h5"
tokenizer = "spm"
spm_pieces = 300
[eval]
every = 3
batches = 1
[checkpoint]
every = 0
EOF
train_or_fail run 1
grep -q '^step      3/3' "$T/run.log" || { cat "$T/run.log"; fail "no step 3"; }
grep -q 'vocab 564' "$T/run.log" || { cat "$T/run.log"; fail "the run's vocabulary is not the dataset's (564)"; }

for bad in "data.tokenizer=bytes:prepared with the spm tokenizer" "data.spm_pieces=500:has 300 SentencePiece pieces"; do
  set +e
  "$M" train "$T/deck.toml" --set "${bad%%:*}" --set run.out_dir="$T/bad" >"$T/bad.log" 2>&1; rc=$?
  set -e
  [ $rc -eq 2 ] || { cat "$T/bad.log"; fail "${bad%%:*}: exit $rc, want 2"; }
  grep -q "${bad#*:}" "$T/bad.log" && grep -q 'meshmoe prep gettext --tokenizer' "$T/bad.log" ||
    { cat "$T/bad.log"; fail "${bad%%:*}: no message naming the prep command"; }
done

# Same inputs, same model and tokens.
$PY - "$T" <<'PY' || fail "two preps of the same inputs differ"
import sys, h5py, numpy as np
T = sys.argv[1]
a, b = h5py.File(f"{T}/data.h5", "r"), h5py.File(f"{T}/data2.h5", "r")
for k in ("tokenizer/spm_model", "train/tokens", "valid/tokens", "train/loss_mask"):
    assert np.array_equal(a[k][()], b[k][()]), k
PY
echo "prep_spm: ok"
