#!/usr/bin/env bash
# The encoder-decoder learns a task only cross-attention can solve (issue 12): a tiny model.arch =
# "encdec" model (2 + 2 blocks, top-2 MoE in each stack) trains 400 steps on the reverse task of
# tiny_pairs (2000 generated words of 3-6 letters, their reversal as the source) and must reach a
# validation loss below 0.1 nats per target token on held-out words (about 0.016 when written;
# without the source the letters of a word are random: about log 26 = 3.3 nats per letter).
# Exact translation by decoding is checked where decoding lives.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir encdec-reverse
tiny_pairs "$T" 2000
cat > "$T/deck.toml" <<DECK
[run]
name = "reverse"
steps = 400
log_every = 50
seed = 3
[model]
arch = "encdec"
seq_len = 16
d_model = 64
num_layers = 2
num_heads = 4
d_ff = 128
[moe]
num_experts = 4
every = 2
router = "top2"
group_size = 64
[optim]
batch_size = 16
lr = 3e-3
warmup_steps = 40
[data]
path = "$T/data.h5"
[eval]
every = 100
batches = 4
[checkpoint]
every = 0
DECK
mpirun -np 1 "$M" train "$T/deck.toml" --set run.out_dir="$T/run" >"$T/run.log" 2>&1 || { cat "$T/run.log"; fail "training failed"; }
grep "eval step" "$T/run.log"
$PYTHON - "$T/run/metrics.h5" <<'PY'
import sys, h5py, numpy as np
ev = h5py.File(sys.argv[1], "r")["eval/loss"][()]
ev = ev[np.isfinite(ev)]
print(f"validation loss after 400 steps: {ev[-1]:.4f} (limit 0.1)")
sys.exit(0 if len(ev) == 4 and ev[-1] < 0.1 else 1)
PY
