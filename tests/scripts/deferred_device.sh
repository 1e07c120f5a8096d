#!/usr/bin/env bash
# The transfer points of the GPU path, checked without a GPU (tensor/device.hpp): with
# MESHMOE_TEST_DEFERRED_DEVICE=1 the host path runs as the GPU path does, every launch and GEMM
# queued until the next device_synchronize(), and the device Buffers' pages inaccessible while work
# is queued. A host read or write of a Buffer that does not wait for the device stops the run
# (SIGSEGV); a wait in the wrong place changes a value. Switch, GShard with Adafactor, dense,
# expert choice, dropless bf16 with bias balancing, Switch with No-Token-Left-Behind (capacity 3 of
# a group's 16 tokens per expert, so that choices overflow and are rerouted at every step: its
# metrics must show it), and on 2 ranks data = 2 (all-to-all; sharded
# optimizer state with a shared expert), tensor = 2 (index-select experts) and pipe = 2, and in bf16
# (the layers' bf16 copies of GEMM operands, tensor/blas.hpp, and the weights' bf16 copy that the
# optimizer writes, model/params.hpp) tensor = 2 with a shared expert, data = 2 with sharded
# Adafactor state (the gathered weights' copy), pipe = 2, encoder-decoder translation on tensor = 2
# (cross-attention), and the blocks of today's MoE
# models (RMSNorm, rope, SwiGLU, a leading dense block, softmax_topk) on tensor = 2, train 6 steps
# with evaluation and a checkpoint, deferred and not: every logged number is bitwise the same, and
# the deferred run resumes from its checkpoint to the same final loss. GShard on translation pairs
# also scores translations (eval.bleu_every) on 1 rank and on tensor = 2: decoding, host code,
# runs on a host copy of the weights (HostSection); a dense student distils from the Switch run
# (the teacher's soft targets each step). The deferred runs take the device-memory rule
# (MESHMOE_TEST_DEFERRED_DEVICE=copies, cudaMalloc's): the host reaches a Buffer only through the
# transfer points' copies (MPI through host copies), every other access stops the run. The Switch
# run also passes under the weaker rule of the queue's order alone (=1: any access after a wait).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir deferred-device
tiny_data "$T"
mkdir -p "$T/pairs"
demo_pairs "$T/pairs" long
write_tiny_deck "$T" run.name=deferred "${DEVICE_KEYS[@]}" run.seed=9 moe.jitter_eps=0.01
# compare NOW DEFERRED [RESUMED]: every logged number of the two runs bitwise equal; the resumed
# run's final loss the deferred run's.
compare() {
  $PYTHON - "$@" <<'PY'
import sys, h5py, numpy as np
now, deferred = sys.argv[1], sys.argv[2]
sys.path.insert(0, "tests/lib")
from compare_runs import logged_numbers
with h5py.File(f"{now}/metrics.h5") as a, h5py.File(f"{deferred}/metrics.h5") as b:
    x, y = logged_numbers(a), logged_numbers(b)
assert x.keys() == y.keys(), f"datasets differ: {sorted(set(x) ^ set(y))}"
if now.split("/")[-1].startswith("ntlb"):
    rerouted = [v for k, v in x.items() if k.endswith("/rerouted_fraction")]
    assert rerouted and all((v > 0).all() for v in rerouted), f"NTLB rerouted no choice at a step: {rerouted}"
if now.split("/")[-1].startswith("bleu"):
    scored = x["eval/chrf_all"][~np.isnan(x["eval/chrf_all"])]
    assert len(scored) == 2 and scored.max() > 0, f"translation scores of steps 3 and 6: {scored}"
for k in x:
    assert np.array_equal(x[k], y[k], equal_nan=True), f"{k}: deferred {y[k]} vs {x[k]}"
message = f"  {len(x)} datasets bitwise equal"
if len(sys.argv) > 3:
    with h5py.File(f"{sys.argv[3]}/metrics.h5") as r:
        last_r, last_d = r["loss"][()][-1], y["loss"][-1]
    assert last_r == last_d, f"resumed final loss {last_r} vs {last_d}"
    message += "; resumed: final loss equal"
print(message)
PY
}
# The blocks of today's MoE models (docs/ARCHITECTURE.md "Blocks"): RMSNorm, rope (its kernel and
# the positions the attention keeps for its backward), SwiGLU, a leading dense block, Mixtral's gate.
blocks="--set model.norm=rmsnorm --set model.position=rope --set model.activation=swiglu --set moe.every=1 --set moe.first_dense=1 --set moe.gate=softmax_topk"
bleu="--set data.path=$T/pairs/data.h5 --set model.seq_len=48 --set moe.router=top2 --set optim.lr=0.02 --set eval.bleu_every=3 --set eval.bleu_examples=2 --set eval.examples_per_language=6"
for variant in "switch:1:--set moe.router=top1" "gshard:1:--set moe.router=top2 --set optim.name=adafactor" \
               "dense:1:--set moe.every=0" "expert-choice:1:--set moe.router=expert_choice" \
               "dropless-bf16-bias:1:--set moe.dropless=true --set model.precision=bf16 --set moe.balance=bias" \
               "ntlb:1:--set moe.router=top1 --set moe.no_token_left_behind=true --set moe.capacity_factor_train=0.75" \
               "switch-data2:2:--set moe.router=top1 --set mesh.data=2" \
               "shard-state-shared:2:--set mesh.data=2 --set optim.shard_state=true --set moe.shared_experts=1" \
               "isel-tensor2:2:--set moe.expert_axis=tensor --set mesh.tensor=2" "pipe2:2:--set mesh.pipe=2 --set optim.micro_batches=4" \
               "bleu:1:$bleu" "bleu-tensor2:2:$bleu --set mesh.tensor=2" \
               "bf16-tensor2-shared:2:--set model.precision=bf16 --set mesh.tensor=2 --set moe.shared_experts=1" \
               "bf16-shard-state-adafactor:2:--set model.precision=bf16 --set mesh.data=2 --set optim.shard_state=true --set optim.name=adafactor" \
               "bf16-pipe2:2:--set model.precision=bf16 --set mesh.pipe=2 --set optim.micro_batches=4" \
               "mqa-rope-bf16-tensor2:2:--set model.kv_heads=1 --set model.position=rope --set model.precision=bf16 --set mesh.tensor=2" \
               "bleu-encdec-bf16-tensor2:2:$bleu --set model.arch=encdec --set mesh.tensor=2 --set model.precision=bf16" \
               "blocks-bf16-tensor2:2:$blocks --set model.precision=bf16 --set mesh.tensor=2"; do
  name=${variant%%:*}; rest=${variant#*:}; np=${rest%%:*}; sets=${rest#*:}
  echo "== $name ($np rank(s))"
  access=copies
  train_deferred $np "$name-now" 0 $sets
  train_deferred $np "$name-deferred" $access $sets
  grep -q "deferred as a GPU" "$T/$name-deferred.log" || fail "the deferred run does not say so"
  # The deferred run resumes from its own step-3 checkpoint.
  cp -r "$T/$name-deferred" "$T/$name-resumed"
  rm -f "$T/$name-resumed/ckpt/step_00000006.h5"; echo step_00000003.h5 > "$T/$name-resumed/ckpt/LATEST"
  train_deferred $np "$name-resumed" $access $sets --set run.resume=auto
  compare "$T/$name-now" "$T/$name-deferred" "$T/$name-resumed"
done
# Distillation (soft targets, the teacher's forward each step): a dense student of the Switch run.
echo "== distill (1 rank)"
for access in 0 copies; do
  deferred_run 1 "distill-$access" $access distill --set moe.every=0 --teacher "$T/switch-now"
done
compare "$T/distill-0" "$T/distill-copies"
echo "== switch under the queue-order rule (=1)"
train_deferred 1 switch-managed 1 --set moe.router=top1
$PYTHON - "$T" <<'PY'
import sys, h5py, numpy as np
with h5py.File(f"{sys.argv[1]}/switch-now/metrics.h5") as a, h5py.File(f"{sys.argv[1]}/switch-managed/metrics.h5") as b:
    assert np.array_equal(a["loss"][()], b["loss"][()]), "managed-rule deferred loss differs"
print("  loss bitwise equal")
PY
echo "deferred_device: ok"
