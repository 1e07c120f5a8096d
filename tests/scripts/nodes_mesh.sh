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
# One copy of the weights per node with optim.shard_state across nodes (docs/ARCHITECTURE.md
# "Sharded optimizer state"): a dense wide deck on data 4 over the 2 nodes, whose owners' updates
# are all-gathered between the nodes' copies, BITWISE the unsharded run on the same nodes (the
# same hierarchical gradient sums; the gather copies bits) in its losses, norms and final
# checkpoint, and within the invariance bound above of one rank (the nodes' order of the sums,
# ((r0 + r1) + (r2 + r3)), is not one rank's; parameters are not compared with one rank: Adam's
# m / sqrt(v) turns last-bit differences of near-zero gradients into ~1e-4 of a tensor's scale);
# its step-2 checkpoint resumed on the nodes (each node's first rank reads it into its copy)
# bitwise the uninterrupted run, and resumed on one rank, and one rank's resumed on the nodes,
# within the invariance bound of one rank; `meshmoe plan` shows the weights once per node.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
source tests/lib/fake_nodes.sh
M=${MESHMOE:-build/meshmoe}
test_dir nodes-mesh
tiny_data "$T"
write_tiny_deck "$T" run.name=nodes run.steps=3 run.seed=7 model.num_heads=4 model.dropout=0.1 moe.router=top2 \
  moe.second_expert=random moe.capacity_factor_train=1.0 moe.jitter_eps=0.01 moe.z_loss_coef=0.001 \
  optim.micro_batches=2 optim.lr=0.01 eval.every=3 eval.batches=1
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
# One copy of the weights per node across nodes (dense: no parameter split over data).
dense="--set moe.every=0 --set checkpoint.every=2"
# shellcheck disable=SC2086
train_or_fail densewide-1 1 $wide $dense
# shellcheck disable=SC2086
train_on_nodes densewide-d4 --set mesh.data=4 $wide $dense
# shellcheck disable=SC2086
train_on_nodes densewide-shard-d4 --set mesh.data=4 --set optim.shard_state=true $wide $dense
grep -q "weights and gradients: one copy of the weights per node over the data axis (optim.shard_state: the owners' updates all-gathered between the nodes' copies)" "$T/densewide-shard-d4.log" ||
  { cat "$T/densewide-shard-d4.log"; fail "the sharded run across nodes does not hold one copy of the weights per node"; }
# shellcheck disable=SC2086
timeout 120 tools/fake-nodes.sh "$M" plan "$T/deck.toml" --set mesh.data=4 --set optim.shard_state=true $wide $dense \
  >"$T/plan-one-copy.out" 2>&1 || { cat "$T/plan-one-copy.out"; fail "meshmoe plan of the one copy per node failed"; }
grep -q "^weights: one copy per node for a stage's data ranks on it .*: stage 0 [0-9.]* [KM]iB per node$" "$T/plan-one-copy.out" ||
  { cat "$T/plan-one-copy.out"; fail "meshmoe plan does not show the weights once per node"; }
# shellcheck disable=SC2086
train_on_nodes densewide-res-same --set mesh.data=4 --set optim.shard_state=true $wide $dense \
  --set run.resume="$T/densewide-shard-d4/ckpt/step_00000002.h5"
# shellcheck disable=SC2086
train_on_nodes densewide-res-nodes --set mesh.data=4 --set optim.shard_state=true $wide $dense \
  --set run.resume="$T/densewide-1/ckpt/step_00000002.h5"
# shellcheck disable=SC2086
train_or_fail densewide-res-1 1 $wide $dense --set run.resume="$T/densewide-shard-d4/ckpt/step_00000002.h5"
$PYTHON - "$T" <<'PY'
import sys, h5py, numpy as np
T = sys.argv[1]
bad = 0
def params(run):
    out = {}
    with h5py.File(f"{T}/{run}/ckpt/step_00000003.h5", "r") as f:
        f["params"].visititems(lambda n, d: out.__setitem__(n, d[()]) if isinstance(d, h5py.Dataset) else None)
    return out
def compare(ref, run, tol):
    """tol = 0: losses, norms and the final parameters bitwise; else the scalars within tol relative."""
    global bad
    a, b = h5py.File(f"{T}/{ref}/metrics.h5", "r"), h5py.File(f"{T}/{run}/metrics.h5", "r")
    rows = np.searchsorted(a["step"][()], b["step"][()])
    for key in ["loss", "grad_norm"]:
        x, y = a[key][()][rows], b[key][()]
        rel = np.max(np.abs(x - y) / np.abs(x))
        ok = np.array_equal(x, y) if tol == 0 else rel <= tol
        bad += not ok
        print(f"{run:20s} vs {ref:18s} {key:9s} max rel diff {rel:.1e} (tolerance {tol:g}) {'ok' if ok else 'MISMATCH'}")
    if tol == 0:
        pa, pb = params(ref), params(run)
        ok = sorted(pa) == sorted(pb) and all(np.array_equal(pa[n], pb[n]) for n in pa)
        bad += not ok
        print(f"{run:20s} vs {ref:18s} params    {len(pa)} tensors bitwise {'ok' if ok else 'MISMATCH'}")
compare("densewide-d4", "densewide-shard-d4", 0)
compare("densewide-shard-d4", "densewide-res-same", 0)
for run in ["densewide-shard-d4", "densewide-res-nodes", "densewide-res-1"]:
    compare("densewide-1", run, 1e-5)
sys.exit(1 if bad else 0)
PY
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
