#!/usr/bin/env bash
# `meshmoe prep gettext` on a small generated locale tree: exit codes, pair counts per language,
# split, attributes and example layout, read back with h5py. Needs $MESHMOE, msgfmt, /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
MESHMOE=${MESHMOE:-$PWD/build/meshmoe}
tmp=$(mktemp -d "${MESHMOE_TEST_TMPDIR:-/tmp}/prep_gettext.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
root=$tmp/locale

mo() {  # mo <lang> <name> <po entries>
  mkdir -p "$root/$1/LC_MESSAGES"
  printf 'msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\n%s' "$3" >"$tmp/x.po"
  msgfmt -o "$root/$1/LC_MESSAGES/$2.mo" "$tmp/x.po"
}
# Expected pairs (FNV-1a 64 % 100 of the English: Open 93, Close 63, Help 14; --valid-percent 70
# puts Close and Help in valid):
#   de: Open/Öffnen, Close/Schließen, Help/Hilfe, Open/Aufmachen (Close/Schließen again in b: duplicate;
#       File/File identical; Save untranslated; Quit fuzzy) -> train 2, valid 2
#   pt_BR: Open/Abrir, Close/Fechar (context stripped; same pair twice -> 1) -> train 1, valid 1
#   sr@latin: Open/Otvori (+ a corrupt catalog, skipped with a warning) -> train 1, valid 0
#   en: identical only -> no pairs -> not in the vocabulary
mo de a 'msgid "Open"
msgstr "Öffnen"

msgid "Close"
msgstr "Schließen"

msgid "File"
msgstr "File"

msgid "Save"
msgstr ""

#, fuzzy
msgid "Quit"
msgstr "Beenden"

msgid "Help"
msgid_plural "Helps"
msgstr[0] "Hilfe"
msgstr[1] "Hilfen"
'
mo de b 'msgid "Open"
msgstr "Aufmachen"

msgid "Close"
msgstr "Schließen"
'
mo pt_BR a 'msgid "Open"
msgstr "Abrir"

msgid "Close"
msgstr "Fechar"

msgctxt "button"
msgid "Close"
msgstr "Fechar"
'
mo sr@latin a 'msgid "Open"
msgstr "Otvori"
'
printf '\xde\x12\x04\x95\x00\x00\x00\x00\xff\xff\xff\x7f\x1c\x00\x00\x00\x1c\x00\x00\x00' >"$root/sr@latin/LC_MESSAGES/broken.mo"
mo en a 'msgid "Open"
msgstr "Open"
'

out=$tmp/g.h5
"$MESHMOE" prep gettext --root "$root" -o "$out" --valid-percent 70 >"$tmp/stdout" 2>"$tmp/stderr"
cat "$tmp/stdout" "$tmp/stderr"
grep -q 'broken.mo' "$tmp/stderr" || { echo "no warning naming broken.mo"; exit 1; }
grep -q '7 examples' "$tmp/stdout" || { echo "summary does not say 7 examples"; exit 1; }
grep -q 'direction xx-en' "$tmp/stdout" || { echo "summary does not name the direction xx-en"; exit 1; }
# The other direction: the same pairs with English as the source (the split stays a hash of the English).
out_en=$tmp/g_en.h5
"$MESHMOE" prep gettext --root "$root" -o "$out_en" --valid-percent 70 --direction en-xx >"$tmp/stdout_en" 2>&1
grep -q 'direction en-xx' "$tmp/stdout_en" || { cat "$tmp/stdout_en"; echo "summary does not name the direction en-xx"; exit 1; }

ROOT="$root" OUT="$out" OUT_EN="$out_en" /usr/bin/python3 - <<'PY'
import os, h5py, numpy as np
f = h5py.File(os.environ["OUT"], "r")
a = f.attrs
def s(x): return x.decode() if isinstance(x, bytes) else str(x)
assert s(a["tokenizer"]) == "bytes+specials+langtags", a["tokenizer"]
assert s(a["created_by"]) == "meshmoe prep gettext"
assert s(a["root"]) == os.environ["ROOT"]
assert (int(a["vocab_size"]), int(a["pad_id"]), int(a["bos_id"]), int(a["eos_id"]), int(a["sep_id"])) == (263, 256, 257, 258, 259)
langs = [s(x) for x in f["languages/name"][()]]
assert langs == ["de", "pt_BR", "sr@latin"], langs
assert s(a["languages"]) == "de,pt_BR,sr@latin"
assert list(f["languages/train_pairs"][()]) == [2, 1, 1], f["languages/train_pairs"][()]
assert list(f["languages/valid_pairs"][()]) == [2, 1, 0], f["languages/valid_pairs"][()]
assert [s(x) for x in f["sources"][()]] == ["de/LC_MESSAGES/a.mo", "de/LC_MESSAGES/b.mo", "pt_BR/LC_MESSAGES/a.mo",
                                         "sr@latin/LC_MESSAGES/a.mo"], f["sources"][()]

def examples(g):
    t, o, m, l = f[g + "/tokens"][()], f[g + "/doc_offsets"][()], f[g + "/loss_mask"][()], f[g + "/lang"][()]
    assert t.dtype == np.uint16 and o.dtype == np.int64 and m.dtype == np.uint8 and l.dtype == np.int32
    assert o[0] == 0 and o[-1] == len(t) == len(m) and len(o) == len(l) + 1
    out = []
    for i in range(len(l)):
        e, em = t[o[i]:o[i + 1]], m[o[i]:o[i + 1]]
        assert e[0] == 260 + l[i] and e[-1] == 258
        sep = int(np.where(e == 259)[0][0])
        assert list(em) == [0] * (sep + 1) + [1] * (len(e) - sep - 1), (list(e), list(em))
        out.append((langs[l[i]], bytes(e[1:sep].astype(np.uint8)).decode(), bytes(e[sep + 1:-1].astype(np.uint8)).decode()))
    return sorted(out)

train, valid = examples("train"), examples("valid")
assert train == sorted([("de", "Aufmachen", "Open"), ("de", "Öffnen", "Open"), ("pt_BR", "Abrir", "Open"),
                        ("sr@latin", "Otvori", "Open")]), train
assert valid == sorted([("de", "Schließen", "Close"), ("de", "Hilfe", "Help"), ("pt_BR", "Fechar", "Close")]), valid
assert not ({e for _, _, e in train} & {e for _, _, e in valid})
assert s(a["direction"]) == "xx-en", a["direction"]

# en-xx: <lang> English SEP translation EOS, loss on the translation; same languages, pairs and split.
f_xx = f
f = h5py.File(os.environ["OUT_EN"], "r")
assert s(f.attrs["direction"]) == "en-xx", f.attrs["direction"]
assert [s(x) for x in f["languages/name"][()]] == langs
for k in ("languages/train_pairs", "languages/valid_pairs"):
    assert list(f[k][()]) == list(f_xx[k][()]), k
swap = lambda ex: sorted((l, tgt, src) for l, src, tgt in ex)
assert examples("train") == swap(train), examples("train")
assert examples("valid") == swap(valid), examples("valid")
print("h5py checks passed")
PY

# User mistakes: exit code 2 and a message naming the problem, never a hang.
expect_input_error() {  # <text the message must contain> <args...>
  local want=$1; shift
  set +e; timeout 60 "$MESHMOE" prep gettext "$@" >"$tmp/err.out" 2>&1; local rc=$?; set -e
  cat "$tmp/err.out"
  [ "$rc" -eq 2 ] || { echo "expected exit 2, got $rc for: $*"; exit 1; }
  grep -q -- "$want" "$tmp/err.out" || { echo "message lacks '$want'"; exit 1; }
}
expect_input_error "nowhere" --root "$tmp/nowhere" -o "$tmp/x.h5"
expect_input_error "klingon" --root "$root" --languages de,klingon -o "$tmp/x.h5"
expect_input_error "valid-percent" --root "$root" --valid-percent 101 -o "$tmp/x.h5"
expect_input_error "min-pairs" --root "$root" --min-pairs 99 -o "$tmp/x.h5"
expect_input_error "does not exist" --root "$root" -o "$tmp/no/such/dir/x.h5"
expect_input_error "direction must be xx-en" --root "$root" --direction de-en -o "$tmp/x.h5"
echo "prep_gettext.sh: all checks passed"
