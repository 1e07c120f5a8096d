#!/usr/bin/env bash
# Language-balanced sampling (data.temperature) and the per-language counts and losses of a run, on
# a tiny skewed gettext corpus: languages de, fr, sv with 400, 100 and 25 pairs, every example 13
# tokens with 6 targets (5 English bytes + EOS), so that a sequence of 32 + 1 tokens holds exactly
# two examples and a step of 8 rows draws 16 examples (96 target tokens).
#   1. T = 1: the target tokens trained per language (/data/lang_tokens) are proportional to the
#      languages' training examples; T = 100: they follow p_l = (n_l / n)^(1/T) (normalised),
#      nearly uniform. Bound: every share within 5 binomial standard deviations sqrt(p (1 - p) / N)
#      of its p, N = examples drawn (sampling without replacement, T = 1, varies less).
#   2. T = 5: 40 steps straight vs 20 + resume + 20 on the same mesh: losses and counts bitwise.
#   3. T = 5 on 2 data ranks: the same counts; losses within 1e-5 of the 1-rank run.
#   4. Evaluation rows of the 2-rank run: the per-language validation losses weighted by their
#      tokens give the overall validation loss (relative 1e-9: both are sums of the same per-token
#      losses), and the per-language tokens sum to /eval/tokens.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir lang-sampling
root=$T/locale
for spec in de:400 fr:100 sv:25; do
  lang=${spec%%:*} n=${spec##*:}
  mkdir -p "$root/$lang/LC_MESSAGES"
  { printf 'msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\n'
    for ((i = 0; i < n; ++i)); do printf 'msgid "s%04d"\nmsgstr "%s%03d"\n\n' "$i" "$lang" "$i"; done; } >"$T/$lang.po"
  msgfmt -o "$root/$lang/LC_MESSAGES/t.mo" "$T/$lang.po"
done
"$M" prep gettext -q --root "$root" --valid-percent 10 -o "$T/data.h5" >"$T/prep.log"
cat > "$T/deck.toml" <<DECK
[run]
name = "lang-sampling"
steps = 60
log_every = 1
seed = 5
[model]
seq_len = 32
d_model = 16
num_layers = 1
num_heads = 2
d_ff = 32
[moe]
every = 0
[optim]
batch_size = 8
lr = 0.01
[data]
path = "$T/data.h5"
[eval]
every = 0
[checkpoint]
every = 20
DECK

train_or_fail t1 1 --set data.temperature=1
train_or_fail t100 1 --set data.temperature=100
$PYTHON - "$T" <<'PY'
import sys, h5py, numpy as np
T = sys.argv[1]
d = h5py.File(T + "/data.h5", "r")
n_l = d["languages/train_pairs"][()].astype(float)
assert [x.decode() if isinstance(x, bytes) else x for x in d["languages/name"][()]] == ["de", "fr", "sv"]
for temp, name in [(1, "t1"), (100, "t100")]:
    m = h5py.File(f"{T}/{name}/metrics.h5", "r")
    counts = m["data/lang_tokens"][-1]
    assert m["data/lang_tokens"].shape == (60, 3), m["data/lang_tokens"].shape
    assert np.all(np.diff(m["data/lang_tokens"][()], axis=0) >= 0), "counts are cumulative"
    assert counts.sum() == 60 * 16 * 6, counts  # every step: 16 examples of 6 targets
    p = (n_l / n_l.sum()) ** (1.0 / temp)
    p /= p.sum()
    attr = m.attrs["lang_sampling_probability"]  # a float array, one value per language of the root's `languages`
    assert isinstance(attr, np.ndarray) and attr.dtype == np.float64 and attr.shape == (3,), attr
    assert [x.decode() if isinstance(x, bytes) else x for x in m.attrs["languages"]] == ["de", "fr", "sv"], m.attrs["languages"]
    assert np.allclose(attr, p, rtol=1e-12, atol=0), (attr, p)
    draws = counts.sum() / 6
    share = counts / counts.sum()
    bound = 5 * np.sqrt(p * (1 - p) / draws)
    print(f"T = {temp}: n_l {n_l}, p {p.round(4)}, shares {share.round(4)}, bound {bound.round(4)}")
    assert np.all(np.abs(share - p) <= bound), (share, p, bound)
    if temp == 1:
        assert share.max() / share.min() > 8, share
    else:
        assert share.max() / share.min() < 1.3, share
print("sampling shares within their bounds")
PY

# 2 and 3: resume and mesh invariance at T = 5, with evaluations (4).
common=(--set data.temperature=5 --set run.steps=40 --set eval.every=20 --set eval.batches=3)
train_or_fail straight 1 "${common[@]}"
train_or_fail resumed 1 "${common[@]}" --set run.steps=20
train_or_fail resumed 1 "${common[@]}"
grep -q "resuming from" "$T/resumed.log" || { cat "$T/resumed.log"; fail "the second part did not resume"; }
train_or_fail data2 2 "${common[@]}" --set mesh.data=2
$PYTHON - "$T" <<'PY'
import sys, h5py, numpy as np
T = sys.argv[1]
a, b, c = (h5py.File(f"{T}/{n}/metrics.h5", "r") for n in ("straight", "resumed", "data2"))
for k in ["step", "loss", "grad_norm", "data/lang_tokens", "eval/loss", "eval/lang_loss", "eval/lang_tokens"]:
    assert np.array_equal(a[k][()], b[k][()], equal_nan=True), ("resume", k)
    assert np.array_equal(a[k][()], c[k][()], equal_nan=True) or np.allclose(a[k][()], c[k][()], rtol=1e-5, atol=1e-6, equal_nan=True), ("mesh", k)
assert np.array_equal(a["data/lang_tokens"][()], c["data/lang_tokens"][()]), "the sampled stream depends on the mesh"
assert a["data/lang_tokens"][-1].min() > 0
rows = np.where(~np.isnan(c["eval/loss"][()]))[0]
assert len(rows) == 2, rows
for r in rows:
    ll, lt, loss, tok = c["eval/lang_loss"][r], c["eval/lang_tokens"][r], c["eval/loss"][r], c["eval/tokens"][r]
    has = lt > 0
    assert has.sum() == 3, lt
    assert lt.sum() == tok, (lt, tok)
    mean = (ll[has] * lt[has]).sum() / lt[has].sum()
    print(f"eval row {r}: overall {loss:.12f}, token-weighted per-language mean {mean:.12f}")
    assert abs(mean - loss) <= 1e-9 * abs(loss), (mean, loss)
print("resume, mesh and per-language evaluation checks passed")
PY
echo "lang_sampling.sh: all checks passed"
