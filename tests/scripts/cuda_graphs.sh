#!/usr/bin/env bash
# run.cuda_graphs (tensor/device_graph.hpp, docs/gpu.md "Device graphs"), checked without a GPU on
# the deferred host device, which records a capture's work and replays copies of it at each launch
# as a CUDA graph does: a value the update took by value at the capture (the learning rate, t's
# bias corrections, the clipping factor) would stay the first step's. A dense model with dropout,
# warm-up (the learning rate changes each step), weight decay and active clipping, fp32 and bf16
# (the weights' bf16 copy written by the captured update), a Switch model, and bf16 on data = 2
# with sharded optimizer state (each rank's graph updates its owned entries), train 6 steps with
# evaluation and a checkpoint, with the key and without, both deferred (device-memory access rule):
# every logged number and every step line (timings aside) bitwise equal. The fp32 dense run with the
# key resumes from its step-3 checkpoint (a new capture) to the same final loss, and the key on the
# host path changes nothing. optim.name = adafactor with the key is an input error (exit 2).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir cuda-graphs
tiny_data "$T"
write_tiny_deck "$T" run.name=graphs "${DEVICE_KEYS[@]}" run.seed=5 moe.every=0 optim.warmup_steps=3 \
  optim.weight_decay=0.1 optim.grad_clip=0.5
# compare OFF ON: metrics.h5's numbers bitwise equal, the step lines too with their timings out.
compare() {
  $PYTHON - "$T/$1" "$T/$2" <<'PY'
import re, sys, h5py, numpy as np
off, on = sys.argv[1], sys.argv[2]
sys.path.insert(0, "tests/lib")
from compare_runs import logged_numbers
with h5py.File(f"{off}/metrics.h5") as a, h5py.File(f"{on}/metrics.h5") as b:
    x, y = logged_numbers(a), logged_numbers(b)
assert x.keys() == y.keys(), f"datasets differ: {sorted(set(x) ^ set(y))}"
for k in x:
    assert np.array_equal(x[k], y[k], equal_nan=True), f"{k}: with graphs {y[k]} vs {x[k]}"
assert len(x["loss"]) == 6 and len(set(x["lr"].tolist())) >= 3, "6 steps with a changing learning rate"
def steps(log):  # the step lines' fields but the timings (tok/s, MFU, ETA)
    timed = ("tok/s", "MFU", "ETA")
    return ["|".join(f.strip() for f in l.split("|") if not any(t in f for t in timed))
            for l in open(log) if re.match(r"\s*step\s+\d", l)]
s_off, s_on = steps(f"{off}.log"), steps(f"{on}.log")
assert len(s_off) == 6 and all("loss" in l for l in s_off) and s_off == s_on, f"step lines differ:\n{s_off}\n{s_on}"
print(f"  {len(x)} datasets and {len(s_off)} step lines bitwise equal")
PY
}
for variant in "dense-fp32:1:" "dense-bf16:1:--set model.precision=bf16" "switch:1:--set moe.every=2 --set moe.router=top1" \
               "bf16-shard-state:2:--set model.precision=bf16 --set mesh.data=2 --set optim.shard_state=true"; do
  name=${variant%%:*}; rest=${variant#*:}; np=${rest%%:*}; sets=${rest#*:}
  echo "== $name ($np rank(s))"
  train_deferred $np "$name-off" copies $sets
  train_deferred $np "$name-on" copies $sets --set run.cuda_graphs=true
  grep -q "launched as a device graph" "$T/$name-on.log" || fail "the run with the key does not say so"
  compare "$name-off" "$name-on"
done
echo "== dense-fp32 resumed from step 3 with the key; the key on the host path"
cp -r "$T/dense-fp32-on" "$T/resumed"
rm -f "$T/resumed/ckpt/step_00000006.h5"; echo step_00000003.h5 > "$T/resumed/ckpt/LATEST"
train_deferred 1 resumed copies --set run.cuda_graphs=true --set run.resume=auto
train_deferred 1 host-on 0 --set run.cuda_graphs=true
$PYTHON - "$T" <<'PY'
import sys, h5py
t = sys.argv[1]
with h5py.File(f"{t}/dense-fp32-on/metrics.h5") as a, h5py.File(f"{t}/resumed/metrics.h5") as r, \
     h5py.File(f"{t}/host-on/metrics.h5") as h:
    assert r["loss"][-1] == a["loss"][-1], f"resumed final loss {r['loss'][-1]} vs {a['loss'][-1]}"
    assert (h["loss"][()] == a["loss"][()]).all(), "the host path with the key"
print("  resumed: final loss equal; host path: losses equal")
PY
echo "== optim.name = adafactor with the key"
rc=0
$M train "$T/deck.toml" --set run.out_dir="$T/adafactor" --set optim.name=adafactor --set run.cuda_graphs=true \
  >"$T/adafactor.log" 2>&1 || rc=$?
[ "$rc" = 2 ] || { cat "$T/adafactor.log"; fail "adafactor with run.cuda_graphs: exit $rc, wanted 2"; }
grep -q "run.cuda_graphs = true captures AdamW's update" "$T/adafactor.log" || { cat "$T/adafactor.log"; fail "no reason given"; }
echo "cuda_graphs: ok"
