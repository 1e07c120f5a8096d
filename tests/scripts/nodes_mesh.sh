#!/usr/bin/env bash
# Every mesh kind on 2 nodes x 2 ranks (two fake nodes: tools/fake-nodes.sh; shared memory inside a
# node, TCP between them) trains as one rank does, within the bounds of the single-node invariance
# test (tests/scripts/train_invariance.sh: loss, aux loss, z loss, gradient norm and eval loss
# within 1e-5 relative, expert loads and routing counts equal; its comparison,
# tests/lib/compare_runs.py): the data axis across nodes (its gradient all-reduce over TCP), the
# expert all-to-all across nodes (GShard top-2, Switch top-1), Pipeline-MoE's index-select
# dispatch (experts over tensor, section 3.3) inside a node with data across, the tensor axis
# across nodes (4 tensor ranks, Switch 5.5's split experts), pipe across nodes (stage 0 on one
# node, stage 1 on the other), expert replicas (expert groups inside a node, replica groups
# across: mesh.expert_parallel = 2) and sharded optimizer state over data across nodes.
# docs/ARCHITECTURE.md "Principles" 1. First asserts that MPI sees 2 hosts of 2 ranks.
# The hierarchical all-reduce (docs/ARCHITECTURE.md "Hierarchical collectives") on the real
# split: the Catch case "[nodes]" (bitwise against the serial node order), and a wider model whose
# gradient sums (over 256 KiB) take it in training, against one rank, with its weights and
# gradients node-shared within each node.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
source tests/lib/fake_nodes.sh
M=${MESHMOE:-build/meshmoe}
test_dir nodes-mesh
tiny_data "$T"
cat > "$T/deck.toml" <<DECK
[run]
name = "nodes"
steps = 3
log_every = 1
seed = 7
[model]
seq_len = 16
d_model = 16
num_layers = 2
num_heads = 4
d_ff = 32
dropout = 0.1
[moe]
num_experts = 4
every = 2
router = "top2"
second_expert = "random"
group_size = 16
capacity_factor_train = 1.0
jitter_eps = 0.01
z_loss_coef = 0.001
[optim]
batch_size = 8
micro_batches = 2
lr = 0.01
warmup_steps = 2
[data]
path = "$T/data.h5"
[eval]
every = 3
batches = 1
DECK
assert_two_nodes "$T/deck.toml" --set mesh.data=4
MESHMOE_TEST_NODES=2 MPIRUN_ARGS="-x MESHMOE_TEST_NODES" timeout 120 tools/fake-nodes.sh build/meshmoe_tests '[nodes]' \
  >"$T/catch-nodes.log" 2>&1 || { cat "$T/catch-nodes.log"; fail "the [nodes] case failed on 2 nodes x 2 ranks"; }
grep -q "All tests passed" "$T/catch-nodes.log" && ! grep -qi "skipped" "$T/catch-nodes.log" ||
  { cat "$T/catch-nodes.log"; fail "the [nodes] case did not run on 2 nodes x 2 ranks"; }
echo "ok   hierarchical all-reduce on 2 nodes x 2 ranks: $(grep -o 'All tests passed.*' "$T/catch-nodes.log" | head -1)"
wide="--set model.d_model=96 --set model.d_ff=384"
switch="--set moe.router=top1"
pmoe="--set moe.expert_axis=tensor --set moe.dropless=true"
train_or_fail gshard-1 1
# shellcheck disable=SC2086
train_or_fail switch-1 1 $switch
# shellcheck disable=SC2086
train_or_fail pmoe-1 1 $pmoe
# shellcheck disable=SC2086
train_or_fail wide-1 1 $wide
train_on_nodes gshard-d4 --set mesh.data=4
# shellcheck disable=SC2086
train_on_nodes switch-d4 --set mesh.data=4 $switch
# shellcheck disable=SC2086
train_on_nodes pmoe-d2t2 --set mesh.data=2 --set mesh.tensor=2 $pmoe
train_on_nodes gshard-t4 --set mesh.tensor=4
train_on_nodes gshard-p2d2 --set mesh.pipe=2 --set mesh.data=2
train_on_nodes gshard-rep-ep2-d4 --set mesh.data=4 --set mesh.expert_parallel=2
train_on_nodes gshard-shard-d4 --set mesh.data=4 --set optim.shard_state=true
# shellcheck disable=SC2086
train_on_nodes wide-d4 --set mesh.data=4 $wide
grep -q "weights and gradients: node-shared within each node over the data axis (hierarchical" "$T/wide-d4.log" ||
  { cat "$T/wide-d4.log"; fail "the data axis across nodes did not take the hierarchical sums"; }
export PAIRS="gshard-1:gshard-d4 switch-1:switch-d4 pmoe-1:pmoe-d2t2 gshard-1:gshard-t4 gshard-1:gshard-p2d2
gshard-1:gshard-rep-ep2-d4 gshard-1:gshard-shard-d4 wide-1:wide-d4"
$PYTHON - "$T" <<'PY'
import os, sys, h5py
sys.path.insert(0, "tests/lib")
from compare_runs import compare_scalars, compare_routing
T = sys.argv[1]
bad = 0
for pair in os.environ["PAIRS"].split():
    ref_name, run = pair.split(":")
    ref, f = h5py.File(f"{T}/{ref_name}/metrics.h5", "r"), h5py.File(f"{T}/{run}/metrics.h5", "r")
    bad += compare_scalars(ref, f, run, tol=1e-5)
    bad += compare_routing(ref, f, run)
print(f"{bad} mismatches")
sys.exit(1 if bad else 0)
PY
echo "nodes_mesh: every mesh kind on 2 nodes x 2 ranks equals one rank"
