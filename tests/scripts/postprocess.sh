#!/usr/bin/env bash
# postprocess/report.py and compare.py over real runs: a small multilingual dataset (a generated
# gettext tree of 4 languages of different sizes), two MoE runs that differ only in mesh.data (the
# sweep), a dense baseline, and a bench-comm file. tests/postprocess/check_report.py then checks every
# PNG (exists, > 200 px each way, not blank) and every number of every markdown table against the HDF5
# files (same rounding as printed), and that a changed number would be caught. Also: bad arguments
# exit 2 with a message. Needs $MESHMOE, msgfmt, /usr/bin/python3 (h5py, matplotlib, PIL).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "postprocess: $M not built"; exit 1; }
T=$(mktemp -d "${MESHMOE_TEST_TMPDIR:-/tmp}/postprocess.XXXXXX")
trap '[ -n "${KEEP:-}" ] || rm -rf "$T"' EXIT
PY=/usr/bin/python3

# Locale tree: the same English strings in every language, a different number of them per language,
# so the per-language table has a ranking to check.
$PY - "$T/locale" <<'PY'
import os, sys
root = sys.argv[1]
words = ["open", "close", "file", "save", "print", "the", "window", "new", "folder", "view", "help", "edit"]
english = [f"{words[i % 12]} {words[(i // 12) % 12]} {words[(i * 7) % 12]} {i}" for i in range(200)]
for lang, n in (("de", 200), ("fr", 120), ("ja", 70), ("sv", 40)):
    os.makedirs(f"{root}/{lang}/LC_MESSAGES")
    with open(f"{root}/{lang}.po", "w") as f:
        f.write('msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\n')
        for e in english[:n]:
            f.write(f'msgid "{e}"\nmsgstr "{lang} {" ".join(w[::-1] for w in e.split())}"\n\n')
PY
for l in de fr ja sv; do msgfmt -o "$T/locale/$l/LC_MESSAGES/t.mo" "$T/locale/$l.po"; done
$M prep gettext --root "$T/locale" --valid-percent 25 -o "$T/data.h5" >"$T/prep.log"

write_tiny_deck "$T" run.name=pp run.steps=12 run.log_every=2 run.seed=3 model.seq_len=64 moe.group_size=32 \
  moe.capacity_factor_train=1.0 optim.lr=0.01 eval.every=4 eval.batches=4
train_or_fail moe-d1 1
train_or_fail moe-d2 2 --set mesh.data=2
train_or_fail dense 2 --set mesh.data=2 --set moe.every=0
mpirun -np 2 "$M" bench-comm -q --sizes 1K,16K,256K --iters 2 -o "$T/bc.h5" >"$T/bc.log" 2>&1 || { cat "$T/bc.log"; fail "bench-comm failed"; }

$PY postprocess/report.py "$T/moe-d1" "$T/moe-d2" --baseline "$T/dense" --bench-comm "$T/bc.h5" -o "$T/report"
$PY postprocess/compare.py "$T/moe-d1" "$T/moe-d2" "$T/dense" -o "$T/compare.md"

$PY tests/postprocess/check_report.py --report "$T/report" --compare "$T/compare.md" \
  --runs "$T/moe-d1" "$T/moe-d2" --baseline "$T/dense" --bench "$T/bc.h5" --dataset "$T/data.h5" \
  --sweep-key mesh.data --expect-moe moe-d1 moe-d2

# lang_table.py (shares common.py) still runs and ranks de first.
$PY postprocess/lang_table.py "$T/moe-d1" --top 1 | tee "$T/lang.txt"
grep -q '^| 1 | de | ' "$T/lang.txt" || fail "lang_table: de is not ranked first"
# Its trained-tokens column is the last row of /data/lang_tokens.
$PY - "$T/moe-d1/metrics.h5" "$T/lang.txt" <<'PY' || fail "lang_table: trained tokens differ from /data/lang_tokens"
import sys, h5py
f = h5py.File(sys.argv[1], "r")
langs = [x.decode() if isinstance(x, bytes) else x for x in f.attrs["languages"]]  # a string array
want = dict(zip(langs, f["data/lang_tokens"][-1]))
rows = [l.split("|") for l in open(sys.argv[2]) if l.startswith("| ") and l.split("|")[2].strip() in want]
assert rows, "no language rows"
for r in rows:
    assert int(r[4].split()[0]) == int(want[r[2].strip()]) > 0, (r, want)
PY

# Bad input: exit 2 and a message naming the problem.
fails=0
bad() {  # pattern command...
  local pattern=$1; shift
  local rc=0; "$@" >"$T/bad.out" 2>&1 || rc=$?
  if [ "$rc" != 2 ] || ! grep -q -- "$pattern" "$T/bad.out"; then
    echo "FAIL: '$*' exit $rc, expected 2 and '$pattern':"; cat "$T/bad.out"; fails=$((fails + 1))
  fi
}
bad "no metrics.h5" $PY postprocess/compare.py "$T/moe-d1" "$T/no-such-run"
bad "not a meshmoe metrics file" $PY postprocess/compare.py "$T/bc.h5"
bad "not a file written by meshmoe bench-comm" $PY postprocess/report.py "$T/moe-d1" --bench-comm "$T/data.h5" -o "$T/r2"
bad "--sweep-key run.nope" $PY postprocess/report.py "$T/moe-d1" "$T/moe-d2" --sweep-key run.nope -o "$T/r3"
echo "postprocess: $fails bad-input failure(s)"
[ "$fails" -eq 0 ]
