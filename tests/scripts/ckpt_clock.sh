#!/usr/bin/env bash
# tok/s without the checkpoint writes (docs/user-guide.md "Training"): a run of 40 steps logging
# every 5, with checkpoint.every = 10 and a test hook (MESHMOE_TEST_CHECKPOINT_SLEEP) that makes each
# write take 2 s more (about 10 intervals' work): the intervals after a checkpoint (steps 15, 25 and
# 35 in metrics.h5's /tokens_per_s) stay within a factor 3 of the median of the others. Counted in
# the interval, a write would cut them 10x or more (mutation-checked).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "ckpt_clock: $M not built"; exit 1; }
test_dir ckpt_clock
tiny_data "$T"
cat >"$T/deck.toml" <<DECK
[run]
steps = 40
log_every = 5
peak_gflops = 100
[model]
seq_len = 32
d_model = 32
num_layers = 2
num_heads = 2
d_ff = 64
[moe]
every = 0
[optim]
batch_size = 16
[checkpoint]
every = 10
[data]
path = "$T/data.h5"
DECK
MESHMOE_TEST_CHECKPOINT_SLEEP=2 timeout 300 mpirun -np 1 "$M" train "$T/deck.toml" --set run.out_dir="$T/run" \
  >"$T/train.out" 2>&1 || { echo "FAIL: train exit $?"; tail -20 "$T/train.out"; exit 1; }
grep -E "^step" "$T/train.out" | sed 's/^/   /'
"$PYTHON" - "$T/run/metrics.h5" <<'PY'
import statistics, sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    rate = dict(zip(f["step"][:].tolist(), f["tokens_per_s"][:].tolist()))
after = [rate[s] for s in (15, 25, 35)]
others = [r for s, r in rate.items() if s not in (15, 25, 35)]
median = statistics.median(others)
ratio = min(after) / median
print(f"tok/s after a checkpoint {[round(a) for a in after]}, median of the others {median:.0f}: ratio {ratio:.2f}")
sys.exit(0 if ratio > 1 / 3 else 1)
PY
rc=$?
[ $rc = 0 ] && echo "ckpt_clock: ok" || echo "ckpt_clock: FAIL: a checkpoint's write is counted in the next interval's tok/s"
exit $rc
