#!/usr/bin/env bash
# The host's waits for the device in a training step (tensor/device.hpp HostWaits, docs/gpu.md
# "Device work and transfer points"), counted on the deferred host device, which waits where the
# GPU's backend does: MESHMOE_TEST_HOST_WAITS prints each rank's waits per step (the copies to the
# host and the other waits, from the step's boundary through its update and its logged line).
# Dense and Switch, fp32 and bf16, on one rank and on data = 2, 3 steps each: every rank's every
# step waits at most the bound below, and the host path counts none. The step's scalars (each
# forward's per-token losses, its finite scans' flags and its MoE layers' routing totals, and the
# gradient norm's chunk sums) reach the host in one copy where the norm is read (StepScalars,
# tensor/step_scalars.hpp); the bounds, per step with one micro-batch and one MoE layer:
#   one rank, dense 1: the step's scalars (the clip scale and the skip decision are the host's,
#     before the update);
#   one rank, Switch 2: that and the MoE layer's dispatch plan's row counts, which size the plan's
#     maps on the host mid-step;
#   data = 2, dense 2: the scalars (both of the norm's sums, the replicated weights' share and the
#     experts' split over data, in the same copy) and the gradient all-reduce; Switch 9: its 2, the
#     gradient all-reduce's 2 ranges of replicated weights and the all-to-all's 5 (the plan's row
#     tokens, the forward's and the backward's two transfers of token rows). The deferred host
#     device's data axis is MPI, through host copies that wait (HostStaged): on a GPU NCCL queues
#     the all-reduce and the all-to-all instead (by this count 2 a step; not yet run on a GPU).
# Before the one copy of the scalars: dense 3 and Switch 5 on one rank, 4 and 13 on data = 2.
# The host's values that MPI reduces (the step's sums, the stop decision, the log's timings) wait
# for nothing (mesh/mpi_comm.cpp).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir host-waits
tiny_data "$T"
cat > "$T/deck.toml" <<DECK
[run]
name = "waits"
steps = 3
log_every = 1
seed = 9
[model]
seq_len = 16
d_model = 32
num_layers = 2
num_heads = 4
d_ff = 64
[moe]
num_experts = 4
every = 2
group_size = 16
router = "top1"
[optim]
batch_size = 8
lr = 0.003
[data]
path = "$T/data.h5"
[eval]
every = 0
[checkpoint]
every = 0
at_end = false
DECK
# check NAME BOUND DEVICE NP [--set ...]: trains with the waits printed; every step of every rank
# waits at most BOUND times (DEVICE = 0: the host path, none).
check() {
  local name=$1 bound=$2 device=$3 np=$4; shift 4
  MESHMOE_TEST_HOST_WAITS=1 train_deferred "$np" "$name" "$device" "$@"
  $PYTHON - "$T/$name.log" "$name" "$bound" "$np" <<'PY'
import re, sys
log, name, bound, np_ = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
waits = {}
for m in re.finditer(r"host waits: rank (\d+) step (\d+): (\d+) \((\d+) copies to the host, (\d+) other waits\)", open(log).read()):
    waits[(int(m[1]), int(m[2]))] = (int(m[3]), int(m[4]), int(m[5]))
assert len(waits) == 3 * np_, f"{name}: {len(waits)} lines of host waits, wanted {3 * np_}"
worst = max(waits.values())
print(f"  {name}: at most {worst[0]} host waits a step ({worst[1]} copies, {worst[2]} other), bound {bound}")
over = {k: v for k, v in waits.items() if v[0] > bound}
assert not over, f"{name}: (rank, step) over the bound {bound}: {over}"
if bound > 0:  # the counter counts: every step on the device reads its loss at least
    assert min(v[0] for v in waits.values()) >= 1, f"{name}: a step without a host wait: {waits}"
PY
}
for precision in fp32 bf16; do
  p="--set model.precision=$precision"
  check dense-$precision 1 1 1 --set moe.every=0 $p
  check switch-$precision 2 1 1 $p
  check dense-data2-$precision 2 1 2 --set moe.every=0 --set mesh.data=2 $p
  check switch-data2-$precision 9 1 2 --set mesh.data=2 $p
done
check switch-host 0 0 1
echo "host_waits: ok"
