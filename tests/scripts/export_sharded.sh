#!/usr/bin/env bash
# `meshmoe export` of sharded checkpoints and postprocess/meshmoe_torch.py (docs/export.md), the
# long part (tier all; export_torch.sh is the quick one): the PyTorch module's validation loss of
# the exported file equals `meshmoe eval`'s on the training mesh within 1e-5 relative for
#  - a GShard top-2 decoder trained on data 2 x tensor 2 (experts over data, their hidden units
#    over tensor: Switch 5.5), with a shared expert, No-Token-Left-Behind and selection biases
#    (moe.balance = bias), evaluated on eval.batches seeded batches (the shuffled order);
#  - a top-2 encoder-decoder (geglu, untied head) trained on pipe 2, on the
#    eval.examples_per_language sample;
# and each file's tensors are docs/export.md's table for its deck.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "export_sharded: $M not built"; exit 1; }
test_dir export_sharded
demo_pairs "$T"
CHECK="/usr/bin/python3 tests/scripts/export_check.py"

# case NAME NP ARCH_KEYS...: train the deck with the extra [model]/[moe]/[eval]/[mesh] lines on NP
# ranks, export, evaluate with meshmoe on the same mesh, compare with the PyTorch module.
case_run() {
  local name=$1 np=$2
  train_or_fail "$name" "$np"
  "$M" export "$T/$name" -o "$T/$name.safetensors" >"$T/$name.export.log" 2>&1 || { cat "$T/$name.export.log"; fail "export $name"; }
  $CHECK table "$T/$name.safetensors" || fail "$name: tensor table"
  mpirun -np "$np" "$M" eval "$T/deck.toml" --checkpoint "$T/$name" --max-examples 1 \
    --max-len 4 -o "$T/$name.eval.h5" >"$T/$name.eval.log" 2>&1 || { cat "$T/$name.eval.log"; fail "meshmoe eval $name"; }
  $CHECK loss "$T/$name.safetensors" "$T/data.h5" "$T/$name.eval.h5" || fail "$name: PyTorch loss"
}

cat >"$T/deck.toml" <<EOF
[run]
steps = 6
log_every = 3
seed = 9
[model]
seq_len = 48
d_model = 32
num_layers = 2
num_heads = 2
d_ff = 64
[moe]
num_experts = 4
router = "top2"
every = 2
group_size = 16
capacity_factor_eval = 0.75
shared_experts = 1
no_token_left_behind = true
balance = "bias"
bias_update_rate = 0.01
[optim]
batch_size = 4
lr = 1e-2
warmup_steps = 2
schedule = "constant"
[eval]
every = 0
batches = 3
[mesh]
data = 2
tensor = 2
[data]
path = "$T/data.h5"
EOF
case_run gshard_d2t2 4

cat >"$T/deck.toml" <<EOF
[run]
steps = 6
log_every = 3
seed = 3
[model]
arch = "encdec"
seq_len = 24
d_model = 32
num_layers = 2
num_heads = 2
d_ff = 32
activation = "geglu"
tied_embeddings = false
[moe]
num_experts = 4
router = "top2"
every = 2
group_size = 16
capacity_factor_eval = 1.0
[optim]
batch_size = 4
micro_batches = 2
lr = 1e-2
warmup_steps = 2
schedule = "constant"
[eval]
every = 0
examples_per_language = 6
[mesh]
pipe = 2
[data]
path = "$T/data.h5"
EOF
case_run encdec_p2 2
echo "PASS export_sharded"
