#!/usr/bin/env bash
# `meshmoe prep gettext --tokenizer spm --spm-sample N` on a generated locale tree (4 languages, 3
# scripts, characters rare enough to fall back to bytes): the vocabulary learns from N of the train
# texts (the log says so; the model differs from the one of every text) and is the same twice, on 1
# and on 2 encoding threads (model, tokens, masks, languages bit for bit); every pair of every
# language is encoded, and Debian's spm_decode (an independent decoder) turns each example's pieces
# back into exactly its translation and English text; a bad --spm-sample or --threads exits 2.
# Needs $MESHMOE, msgfmt, spm_decode, /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
test_dir prep_spm_sample
PY=/usr/bin/python3

# Texts are NFKC-normal without runs of spaces, so SentencePiece's normalisation leaves them as
# they are and decoding must give them back byte for byte. pairs.tsv: language, translation, English.
$PY - "$T/locale" <<'PY'
import os, sys
root = sys.argv[1]
words = ["open", "close", "file", "save", "print", "the", "window", "new", "folder", "view", "help", "edit"]
scripts = {"de": "\u00e4\u00f6\u00fc\u00df", "ru": "\u0430\u0431\u0432\u0433\u0434\u0435\u0436\u0437",
           "ja": "\u3042\u3044\u3046\u3048\u304a\u304b\u304d\u304f", "sv": "\u00e5\u00e4\u00f6"}
rows = []
for lang, n in (("de", 300), ("ru", 250), ("ja", 200), ("sv", 150)):
    os.makedirs(f"{root}/{lang}/LC_MESSAGES")
    c = scripts[lang]
    with open(f"{root}/{lang}.po", "w") as f:
        f.write('msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\n')
        for i in range(n):
            eng = f"{words[i % 12]} {words[(i // 12) % 12]} {words[(i * 7) % 12]} {i}"
            tr = " ".join(c[(i + j) % len(c)] + w[::-1] for j, w in enumerate(eng.split()))
            if i % 50 == 7:
                tr += " " + chr(0x4E00 + 97 * i)  # a CJK character seen once: below the coverage, bytes
            f.write(f'msgid "{eng}"\nmsgstr "{tr}"\n\n')
            rows.append(f"{lang}\t{tr}\t{eng}")
open(f"{root}/../pairs.tsv", "w").write("\n".join(rows) + "\n")
PY
for po in "$T"/locale/*.po; do l=$(basename "$po" .po); msgfmt -o "$T/locale/$l/LC_MESSAGES/app.mo" "$po"; done

prep() {  # prep NAME ARGS...
  local name=$1; shift
  "$M" prep gettext --root "$T/locale" --tokenizer spm --spm-pieces 400 --valid-percent 10 --max-len 1024 "$@" \
    -o "$T/$name.h5" >"$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "prep $name failed"; }
}
prep a --spm-sample 600 --threads 1
prep b --spm-sample 600 --threads 2
prep all --spm-sample 0 -q
grep -q 'SentencePiece model of 400 pieces on 600 of the [0-9]* texts of the train split (--spm-sample)' "$T/a.log" ||
  { cat "$T/a.log"; fail "the log does not say that the vocabulary learns from a sample"; }
grep -q 'spm .*Making suffix array' "$T/a.log" || { cat "$T/a.log"; fail "no progress line of the trainer's phases"; }
grep -q 'encoded [0-9]* texts .* on 2 threads' "$T/b.log" || { cat "$T/b.log"; fail "no encoding line on 2 threads"; }

$PY - "$T" <<'PY' || fail "the sampled spm dataset is not what it should be"
import subprocess, sys
import h5py, numpy as np
T = sys.argv[1]
a, b, full = (h5py.File(f"{T}/{n}.h5", "r") for n in ("a", "b", "all"))
for k in ("tokenizer/spm_model", "languages/name", "train/tokens", "train/loss_mask", "train/doc_offsets", "train/lang",
          "valid/tokens", "valid/loss_mask", "valid/doc_offsets", "valid/lang"):
    assert np.array_equal(a[k][()], b[k][()]), f"{k} differs between two preps (1 and 2 threads)"
assert not np.array_equal(a["tokenizer/spm_model"][()], full["tokenizer/spm_model"][()]), "the sample changed nothing"
want = {}
for line in open(f"{T}/pairs.tsv", encoding="utf-8").read().splitlines():
    lang, tr, eng = line.split("\t")
    want[(lang, tr, eng)] = 0
langs = [x.decode() for x in a["languages/name"][()]]
first_piece = 260 + len(langs)
open(f"{T}/spm.model", "wb").write(bytes(a["tokenizer/spm_model"][()]))
lines, keys = [], []
for split in ("train", "valid"):
    tok, off, lang = (a[f"{split}/{k}"][()] for k in ("tokens", "doc_offsets", "lang"))
    for e in range(len(lang)):
        t = tok[off[e]:off[e + 1]]
        sep = int(np.where(t == 259)[0][0])
        src, eng = t[1:sep], t[sep + 1:-1]
        assert (src >= first_piece).all() and (eng >= first_piece).all(), e
        lines += [" ".join(str(x - first_piece) for x in src), " ".join(str(x - first_piece) for x in eng)]
        keys.append(langs[lang[e]])
out = subprocess.run(["spm_decode", f"--model={T}/spm.model", "--input_format=id"], input="\n".join(lines) + "\n",
                     capture_output=True, text=True, check=True).stdout.split("\n")
for e, lang in enumerate(keys):
    key = (lang, out[2 * e], out[2 * e + 1])
    assert key in want, f"example {e} decodes to {key}, not a pair of the catalogs"
    want[key] += 1
assert all(n == 1 for n in want.values()), [k for k, n in want.items() if n != 1][:3]
print(f"{len(keys)} pairs of {len(langs)} languages decode to their texts; vocab {a.attrs['vocab_size']}")
PY

for bad in "--spm-sample 50:--spm-sample must be 0" "--threads -1:--threads must be in 0..1024"; do
  set +e
  # shellcheck disable=SC2086
  "$M" prep gettext --root "$T/locale" --tokenizer spm --spm-pieces 400 ${bad%%:*} -o "$T/bad.h5" >"$T/bad.log" 2>&1; rc=$?
  set -e
  [ $rc -eq 2 ] && grep -q -- "${bad#*:}" "$T/bad.log" || { cat "$T/bad.log"; fail "${bad%%:*}: exit $rc, want 2 and '${bad#*:}'"; }
done
echo "prep_spm_sample: ok"
