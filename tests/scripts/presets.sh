#!/usr/bin/env bash
# The model presets of inputs/presets/ (docs/user-guide.md "Presets and their published sizes"):
#   1. `meshmoe plan` of the full-size decks gives the parameter counts of the published
#      configurations (the Hugging Face config.json of each checkpoint, written out below, not read
#      from the decks): the total and active counts equal, parameter for parameter, the formula
#      over those figures (OLMoE less its QK-norm gains, which meshmoe does not have), and rounded
#      to the published precision (0.1B) they are the published figures: Mixtral 8x7B 46.7B /
#      12.9B, DeepSeekMoE 16B 16.4B / 2.8B, OLMoE-1B-7B 6.9B / 1.3B;
#   2. the tiny decks train 30 steps on tiny data and their loss falls (the last logged training
#      loss below 0.9 x the first).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir presets
presets=(mixtral-8x7b deepseekmoe-16b olmoe-1b-7b)
for preset in "${presets[@]}"; do
  timeout 120 mpirun -np 1 "$M" plan "inputs/presets/$preset.toml" >"$T/$preset.plan" 2>&1 ||
    { cat "$T/$preset.plan"; fail "plan of inputs/presets/$preset.toml failed"; }
done
$PYTHON - "$T" <<'PY'
import re, sys
T = sys.argv[1]
# The published configurations (config.json of each checkpoint) and the figures their papers and
# model cards give, in billions. swiglu: 3 matrices of M x F per feed-forward; no linear biases;
# RMSNorm gains: 2 per block and a final one; untied head.
PRESETS = {
    "mixtral-8x7b": dict(V=32000, M=4096, L=32, heads=32, kv=8, dense_ff=0, first_dense=0, E=8, F=14336, k=2,
                         shared=0, extra=0, published=(46.7, 12.9)),
    "deepseekmoe-16b": dict(V=102400, M=2048, L=28, heads=16, kv=16, dense_ff=10944, first_dense=1, E=64, F=1408,
                            k=6, shared=2, extra=0, published=(16.4, 2.8)),
    # OLMoE's q_norm and k_norm (RMSNorm gains over the 2048-wide projections, 2 per block): not in meshmoe
    "olmoe-1b-7b": dict(V=50304, M=2048, L=16, heads=16, kv=16, dense_ff=0, first_dense=0, E=64, F=1024, k=8,
                        shared=0, extra=16 * 2 * 2048, published=(6.9, 1.3)),
}
bad = 0
import os
for name, c in PRESETS.items():
    M, L = c["M"], c["L"]
    D = M // c["heads"]
    attention = M * M + 2 * M * c["kv"] * D + M * M
    norms = 2 * M * L + M
    embed = 2 * c["V"] * M
    dense = c["first_dense"] * 3 * M * c["dense_ff"]
    moe_layers = L - c["first_dense"]
    router = moe_layers * M * c["E"]
    expert = 3 * M * c["F"]
    total = embed + L * attention + norms + dense + router + moe_layers * (c["E"] + c["shared"]) * expert
    active = embed + L * attention + norms + dense + router + moe_layers * (c["k"] + c["shared"]) * expert
    text = open(f"{T}/{name}.plan").read()
    m = re.search(r"model: (\d+) parameters, (\d+) activated per token", text)
    if not m:
        print(f"FAIL {name}: no parameter line in the plan"); bad += 1; continue
    plan_total, plan_active = int(m.group(1)), int(m.group(2))
    pub_total, pub_active = c["published"]
    for what, got, formula, pub in (("total", plan_total, total, pub_total), ("active", plan_active, active, pub_active)):
        ok = got == formula and round(got / 1e9, 1) == pub
        print(f"{'ok  ' if ok else 'FAIL'} {name} {what}: plan {got} ({got / 1e9:.3f}B), formula {formula}, "
              f"published {pub}B ({100 * (got / 1e9 - pub) / pub:+.2f}%; the checkpoint {formula + c['extra']})")
        bad += not ok
sys.exit(1 if bad else 0)
PY

tiny_data "$T"
for preset in "${presets[@]%%-*}"; do
  mpirun -np 1 "$M" train "inputs/presets/$preset-tiny.toml" --set run.out_dir="$T/$preset" \
    --set data.path="$T/data.h5" >"$T/$preset.log" 2>&1 || { cat "$T/$preset.log"; fail "training $preset-tiny failed"; }
  $PYTHON - "$T/$preset/metrics.h5" "$preset" <<'PY'
import sys, h5py, numpy as np
loss = h5py.File(sys.argv[1], "r")["loss"][()]
loss = loss[np.isfinite(loss)]
ok = len(loss) >= 6 and loss[-1] < 0.9 * loss[0]
print(f"{'ok  ' if ok else 'FAIL'} {sys.argv[2]}-tiny: training loss {loss[0]:.4f} -> {loss[-1]:.4f} ({len(loss)} rows)")
sys.exit(0 if ok else 1)
PY
done
