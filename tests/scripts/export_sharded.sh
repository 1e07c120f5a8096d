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

write_tiny_deck "$T" run.steps=6 run.log_every=3 run.seed=9 model.seq_len=48 model.d_model=32 model.d_ff=64 \
  moe.router=top2 moe.capacity_factor_eval=0.75 moe.shared_experts=1 moe.no_token_left_behind=true moe.balance=bias \
  moe.bias_update_rate=0.01 optim.batch_size=4 optim.lr=1e-2 optim.schedule=constant eval.every=0 eval.batches=3 \
  mesh.data=2 mesh.tensor=2
case_run gshard_d2t2 4

write_tiny_deck "$T" run.steps=6 run.log_every=3 run.seed=3 model.arch=encdec model.seq_len=24 model.d_model=32 \
  model.activation=geglu model.tied_embeddings=false moe.router=top2 moe.capacity_factor_eval=1.0 optim.batch_size=4 \
  optim.micro_batches=2 optim.lr=1e-2 optim.schedule=constant eval.every=0 eval.examples_per_language=6 mesh.pipe=2
case_run encdec_p2 2
echo "PASS export_sharded"
