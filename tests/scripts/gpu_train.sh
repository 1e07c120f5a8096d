#!/usr/bin/env bash
# The CUDA model path end to end (run.device = "cuda", docs/ARCHITECTURE.md "Principles" 4), on a machine with a
# GPU: a Switch and a GShard deck (dropout, jitter, random routing, Adafactor for one) train 20 steps
# on 1 rank on the host and on the GPU; every logged loss agrees to 1e-5 relative,
# aux loss, z loss and gradient norm to 1e-4 (fp32 without TF32; only the summation order of cuBLAS
# and the kernels differs, and it compounds over the steps), expert loads exactly for the first step.
# The GPU run is deterministic: run twice, its metrics are bitwise equal (no float atomics in sums).
# Then a checkpoint written on the GPU run resumes on the host and finishes with the host run's
# final loss (1e-5).
# GShard on translation pairs also scores translations (eval.bleu_every): decoding, host code,
# runs on a host copy of the GPU's weights, and the scores are logged as on the host.
# Without a GPU (or in a build without CUDA) it prints "skipped" and passes: it cannot run here.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
if "$M" --version 2>/dev/null | grep -q "built without CUDA"; then echo "skipped: this meshmoe was built without CUDA"; exit 0; fi
if ! have_gpu; then echo "skipped: no GPU"; exit 0; fi
test_dir gpu-train
tiny_data "$T"
mkdir -p "$T/pairs"
demo_pairs "$T/pairs" long
cat > "$T/deck.toml" <<DECK
[run]
name = "gpu"
steps = 20
log_every = 1
seed = 9
[model]
seq_len = 32
d_model = 32
num_layers = 2
num_heads = 4
d_ff = 64
dropout = 0.1
[moe]
num_experts = 4
every = 2
group_size = 32
jitter_eps = 0.01
[optim]
batch_size = 8
lr = 0.003
warmup_steps = 3
[data]
path = "$T/data.h5"
[eval]
every = 6
batches = 2
[checkpoint]
every = 6
DECK
train() {  # dir overrides...
  local dir=$1; shift
  timeout 300 mpirun -np 1 $M train "$T/deck.toml" --set run.out_dir="$T/$dir" "$@" >"$T/$dir.log" 2>&1 ||
    { tail -20 "$T/$dir.log"; fail "run $dir"; }
}
bleu="--set moe.router=top2 --set data.path=$T/pairs/data.h5 --set model.seq_len=48 --set eval.bleu_every=6 --set eval.bleu_examples=2 --set eval.examples_per_language=6"
for variant in "switch:--set moe.router=top1" "gshard:--set moe.router=top2 --set optim.name=adafactor" "bleu:$bleu"; do
  name=${variant%%:*}; sets=${variant#*:}
  echo "== $name"
  train "$name-cpu" $sets --set run.device=cpu
  train "$name-gpu" $sets --set run.device=cuda
  grep -q "device: cuda" "$T/$name-gpu.log" || fail "the cuda run does not say it ran on the GPU"
  train "$name-gpu2" $sets --set run.device=cuda
  # Resume the GPU run's step-6 checkpoint on the host.
  cp -r "$T/$name-gpu" "$T/$name-resumed"
  rm -f "$T/$name-resumed/ckpt/step_000000"{12,18,20}.h5; echo step_00000006.h5 > "$T/$name-resumed/ckpt/LATEST"
  train "$name-resumed" $sets --set run.device=cpu --set run.resume=auto
  $PYTHON - "$T/$name" <<'PY'
import sys, h5py, numpy as np
base = sys.argv[1]
def series(d, k):
    with h5py.File(f"{d}/metrics.h5", "r") as f:
        return f["step"][()], f[k][()]
worst = 0.0
for k in ["loss", "aux_loss", "z_loss", "grad_norm", "eval/loss"]:
    s_c, c = series(base + "-cpu", k)
    s_g, g = series(base + "-gpu", k)
    assert list(s_c) == list(s_g), f"{k}: steps differ"
    ok = np.isfinite(c)  # eval/loss is NaN at the steps without an evaluation
    assert np.array_equal(ok, np.isfinite(g)) and ok.any(), f"{k}: finite entries differ"
    c, g = c[ok], g[ok]
    rel = np.max(np.abs(g - c) / np.maximum(np.abs(c), 1.0 if k == "z_loss" else 1e-12))
    worst = max(worst, rel)
    bound = 1e-5 if k == "loss" else 1e-4
    assert rel <= bound, f"{k}: GPU vs host max rel diff {rel:.2e} > {bound:.0e}"
skip = ("time", "tokens_per_s", "mfu", "deck")  # timings, and the deck (its out_dir)
def numbers(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) and o.dtype.kind in "fiub"
                     and not any(s in n for s in skip) else None)
    return out
once, twice = numbers(f"{base}-gpu/metrics.h5"), numbers(f"{base}-gpu2/metrics.h5")
assert once.keys() == twice.keys() and len(once) > 10, f"GPU run twice: datasets {sorted(set(once) ^ set(twice))}"
for n in once:
    assert np.array_equal(once[n], twice[n], equal_nan=True), f"GPU run twice: {n} differs: {once[n]} vs {twice[n]}"
with h5py.File(f"{base}-cpu/metrics.h5") as fc, h5py.File(f"{base}-gpu/metrics.h5") as fg:
    for layer in fc["moe"]:
        a, b = fc[f"moe/{layer}/expert_load"][0], fg[f"moe/{layer}/expert_load"][0]
        assert np.array_equal(a, b), f"moe/{layer}: step-1 expert loads differ: {a} vs {b}"
if base.endswith("bleu"):
    for side in ("cpu", "gpu"):
        _, chrf = series(f"{base}-{side}", "eval/chrf_all")
        assert np.isfinite(chrf).sum() == 4, f"{side}: translation scores of steps 6, 12, 18 and the last: {chrf}"
_, c = series(base + "-cpu", "loss")
_, r = series(base + "-resumed", "loss")
rel = abs(r[-1] - c[-1]) / abs(c[-1])
assert rel <= 1e-5, f"GPU checkpoint resumed on the host: final loss {r[-1]} vs {c[-1]} (rel {rel:.2e})"
print(f"  GPU vs host: max rel diff {worst:.1e} (loss 1e-5, others 1e-4); GPU twice: bitwise equal; resumed on host: final loss rel diff {rel:.1e}")
PY
done
echo "gpu_train: ok"
