#!/usr/bin/env bash
# What a run reports about itself (docs/user-guide.md "Training", "metrics.h5"), on one GShard run
# (top-2, random routing, No-Token-Left-Behind, capacity 0.5: choices dropped, rerouted and
# declined) of 2 data ranks on a 2-language dataset:
#   - the per-expert counts /moe/layer<i>/expert_dropped, expert_rerouted and expert_declined
#     [rows, E] are whole numbers whose rows sum to the layer's fractions times their denominators
#     (wanted_choices; the tokens x (k - 1)), each kind non-zero somewhere;
#   - the root attributes `languages` (a string array) and `lang_sampling_probability` (a float
#     array summing to 1);
#   - the banner's parameters: the whole model's (the checkpoint's tensors) and rank 0's share
#     (the experts split over the 2 data ranks), apart;
#   - tok/s without the evaluations: an evaluation of 60 batches between two logging intervals
#     (about 20 intervals' work) leaves the interval after it within a factor 3 of the others;
#   - the start-up summary: one line naming RUN/deck.toml, the deck printed only with --verbose,
#     that print equal to RUN/deck.toml;
#   - postprocess/valid_pairs.py writes the bytes `meshmoe eval --write-text` writes (a source
#     with a byte that is not UTF-8: no U+FFFD).
# Each check fails on the code before these were added (mutation-checked when written).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "monitoring: $M not built"; exit 1; }
test_dir monitoring
PY=/usr/bin/python3

demo_pairs "$T"
# Every German validation source gets the bytes C3 28 (not UTF-8) in place of its first two letters.
$PY - "$T/data.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    names = [n.decode() if isinstance(n, bytes) else n for n in f["languages/name"][()]]
    lang, offsets, tokens = f["valid/lang"][()], f["valid/doc_offsets"][()], f["valid/tokens"][()]
    for e in np.flatnonzero(lang == names.index("de")):
        tokens[offsets[e] + 1:offsets[e] + 3] = [0xC3, 0x28]
    f["valid/tokens"][...] = tokens
PY

write_tiny_deck "$T" run.name=mon run.steps=12 run.log_every=2 run.seed=5 mesh.data=2 model.seq_len=32 \
  moe.router=top2 moe.second_expert=random moe.capacity_factor_train=0.5 moe.no_token_left_behind=true \
  optim.lr=0.01 eval.every=6 eval.batches=60
train_or_fail run 2
train_or_fail verbose 2 --set run.steps=2 --set eval.every=0 --verbose

$PY - "$T" <<'PY' || fail "monitoring checks"
import glob, re, sys, h5py, numpy as np
T = sys.argv[1]
errors = []
def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        errors.append(what)

m = h5py.File(f"{T}/run/metrics.h5", "r")
n = int(m.attrs["rows"])
B, S, k = 8 * 32, 16, 2
seen = {"dropped": 0.0, "rerouted": 0.0, "declined": 0.0}
for layer in sorted(m["moe"]):
    g = m["moe"][layer]
    wanted = g["wanted_choices"][:n]
    ok = np.isfinite(wanted)
    for kind, denom in (("dropped", wanted), ("rerouted", wanted), ("declined", np.full(n, B * (k - 1.0)))):
        counts = g[f"expert_{kind}"][:n][ok]
        frac = g[f"{kind}_fraction"][:n][ok]
        check(counts.shape[1] == 4 and np.all(counts == np.round(counts)) and np.all(counts >= 0),
              f"{layer}/expert_{kind}: [rows, E = 4] whole counts")
        err = np.abs(counts.sum(axis=1) - frac * denom[ok])
        check(np.all(err <= 1e-9 * np.maximum(denom[ok], 1)),
              f"{layer}/expert_{kind}: each row sums to {kind}_fraction x its denominator (max error {err.max():.3g})")
        seen[kind] += counts.sum()
for kind, total in seen.items():
    check(total > 0, f"the run {kind} some choices ({total:.0f}): the counts are exercised")

langs = m.attrs["languages"]
check(isinstance(langs, np.ndarray) and [str(x) for x in langs] == ["de", "fr"], f"root languages is a string array: {langs!r}")
p = m.attrs["lang_sampling_probability"]
check(isinstance(p, np.ndarray) and p.dtype == np.float64 and p.shape == (2,) and abs(p.sum() - 1) < 1e-12,
      f"root lang_sampling_probability is a float array summing to 1: {p!r}")

log = open(f"{T}/run.log").read()
ck = h5py.File(sorted(glob.glob(f"{T}/run/ckpt/step_*.h5"))[-1], "r")
sizes = {}
ck["params"].visititems(lambda name, o: sizes.__setitem__(name, o.size) if isinstance(o, h5py.Dataset) else None)
total = sum(sizes.values())
experts = sum(v for name, v in sizes.items() if ".experts." in name)
b = re.search(r"model: .* (\d+) parameters \((\d+) used per token\), rank 0 holds (\d+);", log)
check(b is not None and int(b.group(1)) == total and int(b.group(3)) == total - experts // 2 and int(b.group(2)) < total,
      f"banner: the model's {total} parameters, rank 0 holds {total - experts // 2} (half of {experts} expert "
      f"parameters): {b.group(0) if b else 'no banner line'}")

step, tps, ev = m["step"][:n], m["tokens_per_s"][:n], m["eval/loss"][:n]
evals = set(step[np.isfinite(ev)].tolist())
after = [i for i in range(1, n) if np.isfinite(tps[i]) and step[i - 1] in evals and step[i] - step[i - 1] == 2]
others = [i for i in range(1, n) if np.isfinite(tps[i]) and i not in after and step[i - 1] not in evals]
ratio = min(tps[after]) / np.median(tps[others]) if after and others else 0
check(ratio > 1 / 3, f"tok/s of the intervals after an evaluation / the others' median: {ratio:.2f} (> 1/3; "
                     f"with the evaluation charged to them ~1/20)")

first = log.splitlines()[0]
check(first.startswith("# deck ") and f"{T}/run/deck.toml" in first and "[model]" not in log,
      f"train prints one line on the deck, not the deck: {first!r}")
vlog = open(f"{T}/verbose.log").read()
stored = open(f"{T}/verbose/deck.toml").read().split("\n", 1)[1]  # after its "# effective deck of run" line
check("[moe]" in stored and "\n# effective deck (" in vlog and stored.strip() in vlog,
      "train --verbose prints the effective deck, the one RUN/deck.toml holds")
sys.exit(1 if errors else 0)
PY

# valid_pairs.py against eval --write-text: the same bytes, the byte that is not UTF-8 kept.
mpirun -np 2 "$M" eval "$T/deck.toml" --checkpoint "$T/run" --langs de --max-examples 5 --write-text "$T/text" \
  -o "$T/eval.h5" >"$T/eval.log" 2>&1 || { cat "$T/eval.log"; fail "eval --write-text failed"; }
$PY postprocess/valid_pairs.py "$T/data.h5" de "$T/de.src" "$T/de.ref" --max 5
cmp "$T/text/de.src" "$T/de.src" || fail "valid_pairs.py's sources differ from eval --write-text's"
cmp "$T/text/de.ref" "$T/de.ref" || fail "valid_pairs.py's references differ from eval --write-text's"
LC_ALL=C grep -q $'\xc3(' "$T/de.src" || fail "the byte C3 (not UTF-8) is not in the sources"
echo "ok   valid_pairs.py writes the bytes eval --write-text writes (a byte that is not UTF-8 kept)"
echo "monitoring: all checks passed"
