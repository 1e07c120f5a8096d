#!/usr/bin/env bash
# postprocess/bleu_report.py on small synthetic files: two `meshmoe eval`-style files (MoE and dense,
# four languages of different training sizes, one scored on the MoE side only) and a metrics.h5 with
# /eval/bleu beside its dataset. The table must list the languages largest training set first with
# BLEU(MoE) - BLEU(dense) as computed here, name the language left out, and the figure must be a
# non-blank PNG; a run directory resolves to its newest eval file; bad inputs exit 2.
# Needs /usr/bin/python3 (h5py, matplotlib, PIL).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
test_dir bleu-report
$PYTHON - "$T" <<'PY'
import os, sys, h5py, numpy as np
t = sys.argv[1]
def eval_file(path, names, train, bleu, step):
    with h5py.File(path, "w") as f:
        f.attrs.update(created_by="meshmoe eval test", step=step, beam=4, checkpoint="x")
        g = f.create_group("languages")
        g["name"] = np.array(names, dtype=h5py.string_dtype())
        g["train_examples"] = np.array(train, dtype=np.int64)
        g["bleu"] = np.array(bleu, dtype=np.float64)
os.makedirs(f"{t}/moe")
eval_file(f"{t}/moe/eval-100.h5", ["de", "fr", "ja", "sv"], [50, 400, 7, 120], [1.0, 2.0, 3.0, 4.0], 100)
eval_file(f"{t}/moe/eval-2000.h5", ["de", "fr", "ja", "sv"], [50, 400, 7, 120], [20.5, 31.25, 4.0, 12.0], 2000)
eval_file(f"{t}/dense.h5", ["de", "fr", "ja", "sv"], [50, 400, 7, 120], [18.5, 32.0, 1.5, float("nan")], 2000)
with h5py.File(f"{t}/data.h5", "w") as d:
    d["languages/name"] = np.array(["de", "fr", "ja", "sv"], dtype=h5py.string_dtype())
    d["languages/train_pairs"] = np.array([50, 400, 7, 120], dtype=np.int64)
    d["languages/valid_pairs"] = np.array([5, 5, 5, 5], dtype=np.int64)
with h5py.File(f"{t}/metrics.h5", "w") as m:
    m.attrs.update(languages="de,fr,ja,sv", data_path=f"{t}/data.h5")
    m["step"] = np.array([10, 20], dtype=np.int64)
    m["loss"] = np.array([3.0, 2.0])
    m["eval/bleu"] = np.array([[1, 1, 1, 1], [10.0, 30.0, 2.0, 11.0]])
PY
P=postprocess/bleu_report.py
$PYTHON $P "$T/moe" "$T/dense.h5" -o "$T/fig.png" >"$T/table.txt" || { cat "$T/table.txt"; fail "report failed"; }
cat "$T/table.txt"
$PYTHON - "$T/table.txt" "$T/fig.png" <<'PY'
import sys
from PIL import Image
rows = [l.split() for l in open(sys.argv[1]) if l.strip() and l.split()[0].isdigit()]
assert [r[1] for r in rows] == ["fr", "de", "ja"], rows  # training pairs 400, 50, 7; sv not scored on the dense side
assert [r[2] for r in rows] == ["400", "50", "7"]
assert [r[5] for r in rows] == ["-0.75", "+2.00", "+2.50"], rows
text = open(sys.argv[1]).read()
assert "eval-2000.h5" in text and "left out, not scored on both sides (1): sv" in text and "mean delta +1.25" in text
im = Image.open(sys.argv[2]).convert("L")
assert im.size[0] > 200 and im.size[1] > 200 and im.getextrema()[0] < 128, (im.size, im.getextrema())
PY
# The training's scores (metrics.h5 /eval/bleu, sizes from its dataset): MoE eval file vs a run's metrics.
$PYTHON $P "$T/moe/eval-2000.h5" "$T/metrics.h5" -o "$T/fig2.png" >"$T/table2.txt"
grep -q "^   1  fr .* 31.25 *30.00 *+1.25" "$T/table2.txt" || { cat "$T/table2.txt"; fail "metrics.h5 as the baseline"; }
for bad in "$T/none.h5" "$T/data.h5"; do
  set +e
  $PYTHON $P "$T/moe" "$bad" -o "$T/x.png" >"$T/bad.out" 2>&1
  rc=$?
  set -e
  [ $rc = 2 ] && grep -q "error:" "$T/bad.out" || { cat "$T/bad.out"; fail "$bad: exit $rc, expected 2"; }
done
echo "bleu_report: ok"
