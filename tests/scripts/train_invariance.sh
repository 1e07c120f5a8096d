#!/usr/bin/env bash
# The same deck on different meshes and micro-batch splits gives the same training: per-step loss,
# aux loss and gradient norm within 1e-5 relative of the single-rank run, and identical per-expert
# loads (docs/ARCHITECTURE.md "Principles" 1; the central test of the project, here for the data axis, gradient
# accumulation, the tensor axis, pipeline stages on the 1F1B schedule, tied and untied
# embeddings, both optimizers, the encoder-decoder model, expert-choice routing, sigmoid gates, and expert
# replicas: expert groups smaller than the data axis, mesh.expert_parallel). Also checks
# that a run writes deck.toml and a complete metrics.h5.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
test_dir invariance
tiny_data "$T"
write_tiny_deck "$T" run.name=inv run.seed=7 model.dropout=0.1 moe.router=top2 moe.second_expert=random \
  moe.capacity_factor_train=1.0 moe.jitter_eps=0.01 moe.expert_dropout=0.1 moe.z_loss_coef=0.001 optim.lr=0.01 \
  eval.every=2 eval.batches=2
# The matrix: four models on eight meshes (micro_batches = 2 everywhere, so pipe = 2 can run).
declare -A model=(
  [dense]="--set moe.every=0 --set moe.num_experts=1"
  [switch]="--set moe.router=top1"
  [gshard]="--set moe.router=top2 --set moe.second_expert=random"
  [pmoe]="--set moe.expert_axis=tensor --set moe.dropless=true"
)
declare -A mesh=(
  [1]="1" [d2]="2 --set mesh.data=2" [d4]="4 --set mesh.data=4" [t2]="2 --set mesh.tensor=2"
  [d2t2]="4 --set mesh.data=2 --set mesh.tensor=2" [p2]="2 --set mesh.pipe=2"
  [p2d2]="4 --set mesh.pipe=2 --set mesh.data=2" [p2t2]="4 --set mesh.pipe=2 --set mesh.tensor=2"
)
pairs=""
for m in dense switch gshard pmoe; do
  for k in 1 d2 d4 t2 d2t2 p2 p2d2 p2t2; do
    # shellcheck disable=SC2086
    train_or_fail "$m-$k" ${mesh[$k]} --set optim.micro_batches=2 ${model[$m]}
    [ "$k" = 1 ] || pairs+="$m-1:$m-$k "
  done
done
# More: gradient accumulation, tied/untied, Switch 5.5 with 4 tensor ranks, NTLB, geglu with
# Adafactor on the expert meshes.
train_or_fail ref 1
train_or_fail micro2 1 --set optim.micro_batches=2
train_or_fail data2-micro2 2 --set mesh.data=2 --set optim.micro_batches=2
train_or_fail untied 1 --set model.tied_embeddings=false
train_or_fail untied-pipe2 2 --set model.tied_embeddings=false --set mesh.pipe=2 --set optim.micro_batches=2
train_or_fail ref-h4 1 --set model.num_heads=4
train_or_fail switch55-t4 4 --set mesh.tensor=4 --set model.num_heads=4
train_or_fail ntlb 1 --set moe.no_token_left_behind=true
train_or_fail ntlb-d2t2 4 --set moe.no_token_left_behind=true --set mesh.data=2 --set mesh.tensor=2
train_or_fail geglu-adafactor 1 --set model.activation=geglu --set optim.name=adafactor
train_or_fail geglu-adafactor-d2t2 4 --set model.activation=geglu --set optim.name=adafactor --set mesh.data=2 --set mesh.tensor=2
train_or_fail geglu-adafactor-pmoe-t2 2 --set model.activation=geglu --set optim.name=adafactor --set moe.expert_axis=tensor --set mesh.tensor=2
# GShard's aux-loss normalisation (1/E^2 of Switch's), weighted 16 = E^2 times more: the same
# training as the reference, to rounding; on expert meshes as on one rank.
train_or_fail auxg 1 --set moe.aux_loss_form=gshard --set moe.aux_loss_coef=0.16
train_or_fail auxg-d2t2 4 --set moe.aux_loss_form=gshard --set moe.aux_loss_coef=0.16 --set mesh.data=2 --set mesh.tensor=2
# Shared experts (moe.shared_experts): their hidden units split over tensor with their own
# all-reduce (experts over data), or summed in the combine's all-reduce (experts over tensor).
train_or_fail shared 1 --set moe.shared_experts=2
train_or_fail shared-d2t2 4 --set moe.shared_experts=2 --set mesh.data=2 --set mesh.tensor=2
train_or_fail shared-pmoe-1 1 --set moe.shared_experts=2 ${model[pmoe]}
train_or_fail shared-pmoe-p2t2 4 --set moe.shared_experts=2 ${model[pmoe]} --set mesh.pipe=2 --set mesh.tensor=2 --set optim.micro_batches=2
pairs+="shared:shared-d2t2 shared-pmoe-1:shared-pmoe-p2t2 "
# Auxiliary-loss-free balancing (moe.balance = bias): the biases follow the step's loads summed
# over the mesh, so every mesh selects alike; bias_max_abs is compared below.
train_or_fail bias 1 --set moe.balance=bias --set moe.bias_update_rate=0.01 --set optim.micro_batches=2
train_or_fail bias-p2d2 4 --set moe.balance=bias --set moe.bias_update_rate=0.01 --set optim.micro_batches=2 --set mesh.pipe=2 --set mesh.data=2
train_or_fail bias-d2t2 4 --set moe.balance=bias --set moe.bias_update_rate=0.01 --set optim.micro_batches=2 --set mesh.data=2 --set mesh.tensor=2
pairs+="bias:bias-p2d2 bias:bias-d2t2 "
# Sigmoid gates (moe.gate = sigmoid, DeepSeek-V3 section 2.1.2): top-3 by score + selection bias,
# gates normalised over the 3 and scaled by moe.routed_scale, a shared expert; experts over 4 data
# ranks (one each) against one rank.
sigmoid="--set moe.gate=sigmoid --set moe.z_loss_coef=0 --set moe.router=topk --set moe.top_k=3 --set moe.balance=bias"
sigmoid+=" --set moe.bias_update_rate=0.01 --set moe.routed_scale=2.5 --set moe.shared_experts=1 --set optim.micro_batches=2"
# shellcheck disable=SC2086
train_or_fail sigmoid 1 $sigmoid
# shellcheck disable=SC2086
train_or_fail sigmoid-d4 4 $sigmoid --set mesh.data=4
pairs+="sigmoid:sigmoid-d4 "
# A run where the biases balance: top-1 without an aux loss collapses onto one expert within a few
# steps; with moe.balance = bias the busiest expert's share stays far lower (checked below).
collapse="--set run.steps=30 --set eval.every=0 --set moe.aux_loss_coef=0 --set moe.router=top1 --set optim.micro_batches=2"
# shellcheck disable=SC2086
train_or_fail unbalanced 1 $collapse
# shellcheck disable=SC2086
train_or_fail bias-balanced 1 $collapse --set moe.balance=bias --set moe.bias_update_rate=0.02
train_or_fail evalsub 1 --set eval.examples_per_language=3
train_or_fail evalsub-d2t2 4 --set eval.examples_per_language=3 --set mesh.data=2 --set mesh.tensor=2
pairs+="evalsub:evalsub-d2t2 "
# model.recompute (docs/ARCHITECTURE.md "Pipeline activations"): parking the in-flight
# micro-batches' activations (none, the default) and recomputing the forward (block) are the same
# arithmetic: bitwise equal; also with 4 micro-batches, which match one rank to 1e-5.
train_or_fail gshard-p2-block 2 --set mesh.pipe=2 --set optim.micro_batches=2 ${model[gshard]} --set model.recompute=block
train_or_fail dense-p2-block 2 --set mesh.pipe=2 --set optim.micro_batches=2 ${model[dense]} --set model.recompute=block
train_or_fail gshard-p2-m4 2 --set mesh.pipe=2 --set optim.micro_batches=4 ${model[gshard]}
train_or_fail gshard-p2-m4-block 2 --set mesh.pipe=2 --set optim.micro_batches=4 ${model[gshard]} --set model.recompute=block
pairs+="gshard-1:gshard-p2-m4 "
export BITWISE="gshard-p2:gshard-p2-block dense-p2:dense-p2-block gshard-p2-m4:gshard-p2-m4-block encdec-p2:encdec-p2-block"
pairs+="ref:micro2 ref:data2-micro2 untied:untied-pipe2 ref-h4:switch55-t4 ntlb:ntlb-d2t2 "
pairs+="geglu-adafactor:geglu-adafactor-d2t2 auxg:auxg-d2t2 "
# The blocks of today's MoE models (docs/ARCHITECTURE.md "Blocks"): RMSNorm, rotary positions,
# SwiGLU (dense, experts and shared experts), the first block dense then MoE in every block; rope
# with pipe = 2, swiglu experts over data (data = 2) and over tensor (rope's heads split too).
blocks="--set model.norm=rmsnorm --set model.position=rope --set model.rope_base=100 --set model.activation=swiglu --set moe.every=1 --set moe.first_dense=1 --set moe.shared_experts=1 --set optim.micro_batches=2"
for k in 1 p2 d2; do
  # shellcheck disable=SC2086
  train_or_fail "blocks-$k" ${mesh[$k]} $blocks
  [ "$k" = 1 ] || pairs+="blocks-1:blocks-$k "
done
# shellcheck disable=SC2086
train_or_fail blocks-pmoe-1 1 $blocks ${model[pmoe]}
# shellcheck disable=SC2086
train_or_fail blocks-pmoe-t2 2 $blocks ${model[pmoe]} --set mesh.tensor=2
pairs+="blocks-pmoe-1:blocks-pmoe-t2 "
# Grouped-query attention (model.kv_heads) with the blocks: 2 key/value heads of 4 split over
# tensor = 2, and multi-query (1) replicated on both tensor ranks, each against one rank.
for kv in 2 1; do
  gqa="$blocks --set model.num_heads=4 --set model.kv_heads=$kv"
  # shellcheck disable=SC2086
  train_or_fail "gqa$kv-1" 1 $gqa
  # shellcheck disable=SC2086
  train_or_fail "gqa$kv-t2" 2 $gqa --set mesh.tensor=2
  pairs+="gqa$kv-1:gqa$kv-t2 "
done
# The blocks on data 2 x tensor 2. With optim.eps at its 1e-8 this deck's first update is
# ill-conditioned: AdamW moves an element by lr g / (|g| + eps) at step 1 (bias-corrected), whose
# derivative in g is lr eps / (|g| + eps)^2: up to lr / eps = 1e6 (lr <= 1e-2) for |g| near 0.
# Gradient element blocks.0.mlp.w_out[5, 3] is a cancellation to 8e-10 (its neighbours ~5e-4), and
# its absolute rounding delta, 2.6e-10 (which order differs: tensor = 2 sums the residual gradient
# dy as an all-reduce of two partial GEMMs, over its heads and hidden units, where one rank does
# one GEMM; its bound n u sum_t |h_t dy_t| holds for any order and OpenBLAS kernel), moved that
# weight by 4.6e-4 against one rank after step 1: loss 1.6e-6, z-loss 2.4e-5 and grad_norm 2.2e-5
# apart by step 3, beyond the suite's 1e-5 (seeds 8 and 9: below 1e-7, no such element). With
# eps = 1e-6 a weight moves by at most lr delta / eps = 1e-2 x 3e-10 / 1e-6 = 3e-6 (1e-5 of the
# weights' ~0.3, one element among 1e4), the conditioning under which the suite's 1e-5 holds for
# the other runs; seen: at most 8.7e-7 over seeds 7-9.
blocks_eps="$blocks --set optim.eps=1e-6"
# shellcheck disable=SC2086
train_or_fail blocks-eps6-1 1 $blocks_eps
# shellcheck disable=SC2086
train_or_fail blocks-eps6-d2t2 ${mesh[d2t2]} $blocks_eps
pairs+="blocks-eps6-1:blocks-eps6-d2t2 "
# The data-parallel gradient all-reduce overlapped with the backward in tiny buckets (26 floats,
# parallel/gradient_sync.hpp) gives bitwise the blocking all-reduce's training (tied embedding
# over pipe and experts over data included).
exact=""
for k in d2 d4 p2d2; do
  for mb in 0 0.0001; do
    # shellcheck disable=SC2086
    train_or_fail "buckets$mb-$k" ${mesh[$k]} --set optim.micro_batches=2 --set run.grad_bucket_mb=$mb
  done
  exact+="buckets0-$k:buckets0.0001-$k "
done
# model.arch = "encdec": the GShard and Pipeline-MoE models as encoder-decoders on a reverse-task
# translation set, on the eight meshes. With pipe = 2 the stages split at the encoder's end; with
# 3 layers (6 blocks) on pipe = 3 the middle stage holds the last encoder block, ln_enc and the first
# decoder block; pipe = 4 passes the encoder residual, then the encoder output, between stages.
mkdir -p "$T/pairs"
tiny_pairs "$T/pairs"
encdec="--set model.arch=encdec --set data.path=$T/pairs/data.h5 --set optim.micro_batches=2"
for k in 1 d2 d4 t2 d2t2 p2 p2d2 p2t2; do
  # shellcheck disable=SC2086
  train_or_fail "encdec-$k" ${mesh[$k]} $encdec ${model[gshard]}
  [ "$k" = 1 ] || pairs+="encdec-1:encdec-$k "
done
# shellcheck disable=SC2086
train_or_fail encdec-p4 4 --set mesh.pipe=4 $encdec ${model[gshard]} --set optim.micro_batches=4
# shellcheck disable=SC2086
train_or_fail encdec-p2-block 2 --set mesh.pipe=2 $encdec ${model[gshard]} --set model.recompute=block
# shellcheck disable=SC2086
train_or_fail encdec-l3-1 1 $encdec ${model[gshard]} --set model.num_layers=3
# shellcheck disable=SC2086
train_or_fail encdec-l3-p3 3 --set mesh.pipe=3 $encdec ${model[gshard]} --set model.num_layers=3 --set optim.micro_batches=4
pairs+="encdec-1:encdec-p4 encdec-l3-1:encdec-l3-p3 "
# shellcheck disable=SC2086
train_or_fail encdec-pmoe-1 1 $encdec ${model[pmoe]}
# shellcheck disable=SC2086
train_or_fail encdec-pmoe-t2 2 --set mesh.tensor=2 $encdec ${model[pmoe]}
pairs+="encdec-pmoe-1:encdec-pmoe-t2 "
# Expert-choice routing (docs/user-guide.md "Expert-choice routing"): C = ceil(16 * 1.5 / 4) = 6 tokens per
# expert and group, on data, tensor (Switch 5.5), data x tensor, pipe meshes and experts over tensor
# (index-select); also as an encoder-decoder.
echoice="--set moe.router=expert_choice --set moe.capacity_factor_train=1.5 --set optim.micro_batches=2"
for k in 1 d2 t2 d2t2 p2; do
  # shellcheck disable=SC2086
  train_or_fail "echoice-$k" ${mesh[$k]} $echoice
  [ "$k" = 1 ] || pairs+="echoice-1:echoice-$k "
done
# shellcheck disable=SC2086
train_or_fail echoice-x-1 1 $echoice --set moe.expert_axis=tensor
# shellcheck disable=SC2086
train_or_fail echoice-x-t2 2 $echoice --set moe.expert_axis=tensor --set mesh.tensor=2
# shellcheck disable=SC2086
train_or_fail echoice-x-d2t2 4 $echoice --set moe.expert_axis=tensor --set mesh.tensor=2 --set mesh.data=2
# shellcheck disable=SC2086
train_or_fail encdec-echoice-1 1 $encdec $echoice
# shellcheck disable=SC2086
train_or_fail encdec-echoice-d2t2 4 $encdec $echoice --set mesh.data=2 --set mesh.tensor=2
pairs+="echoice-x-1:echoice-x-t2 echoice-x-1:echoice-x-d2t2 encdec-echoice-1:encdec-echoice-d2t2 "
# Expert replicas (mesh.expert_parallel, docs/ARCHITECTURE.md "Expert replicas"): E = 2 on data = 4
# (expert groups of 2 by default, each expert on 2 replicas); E = 4 on data = 4 in expert groups of
# 2 (top-2, dropless, Adafactor with geglu, sharded optimizer state); every rank holding every
# expert (expert_parallel = 1) on data = 4, data 2 x tensor 2 (Switch 5.5 hidden split) and pipe 2
# x data 2; the overlapped buckets bitwise the blocking all-reduce with replicas.
rep="--set optim.micro_batches=2"
# shellcheck disable=SC2086
train_or_fail rep-e2-1 1 $rep --set moe.num_experts=2
# shellcheck disable=SC2086
train_or_fail rep-e2-d4 4 $rep --set moe.num_experts=2 --set mesh.data=4
# shellcheck disable=SC2086
train_or_fail rep-e2-d4-switch 4 $rep --set moe.num_experts=2 --set mesh.data=4 ${model[switch]}
# shellcheck disable=SC2086
train_or_fail rep-e2-1-switch 1 $rep --set moe.num_experts=2 ${model[switch]}
pairs+="rep-e2-1:rep-e2-d4 rep-e2-1-switch:rep-e2-d4-switch "
# shellcheck disable=SC2086
train_or_fail rep-ep2-d4 4 $rep --set mesh.data=4 --set mesh.expert_parallel=2 ${model[gshard]}
# shellcheck disable=SC2086
train_or_fail rep-ep1-d4 4 $rep --set mesh.data=4 --set mesh.expert_parallel=1 ${model[gshard]}
# shellcheck disable=SC2086
train_or_fail rep-ep1-d2t2 4 $rep --set mesh.data=2 --set mesh.tensor=2 --set mesh.expert_parallel=1 ${model[gshard]}
# shellcheck disable=SC2086
train_or_fail rep-ep1-p2d2 4 $rep --set mesh.pipe=2 --set mesh.data=2 --set mesh.expert_parallel=1 ${model[gshard]}
pairs+="gshard-1:rep-ep2-d4 gshard-1:rep-ep1-d4 gshard-1:rep-ep1-d2t2 gshard-1:rep-ep1-p2d2 "
# shellcheck disable=SC2086
train_or_fail rep-dropless-1 1 $rep --set moe.dropless=true ${model[switch]}
# shellcheck disable=SC2086
train_or_fail rep-dropless-ep2-d4 4 $rep --set moe.dropless=true ${model[switch]} --set mesh.data=4 --set mesh.expert_parallel=2
# shellcheck disable=SC2086
train_or_fail rep-adafactor-ep2-d4 4 --set model.activation=geglu --set optim.name=adafactor --set mesh.data=4 --set mesh.expert_parallel=2
# shellcheck disable=SC2086
train_or_fail rep-shard-ep2-d4 4 $rep --set optim.shard_state=true --set mesh.data=4 --set mesh.expert_parallel=2 ${model[gshard]}
pairs+="rep-dropless-1:rep-dropless-ep2-d4 geglu-adafactor:rep-adafactor-ep2-d4 gshard-1:rep-shard-ep2-d4 "
for mb in 0 0.0001; do
  # shellcheck disable=SC2086
  train_or_fail "rep-buckets$mb" 4 $rep --set mesh.data=4 --set mesh.expert_parallel=2 --set run.grad_bucket_mb=$mb
done
exact+="rep-buckets0:rep-buckets0.0001 "
export PAIRS=$pairs EXACT=$exact
for r in ref gshard-d2 pmoe-p2t2; do [ -s "$T/$r/deck.toml" ] || fail "no deck.toml in $r"; done
$PYTHON - "$T" <<'PY'
import sys, h5py, numpy as np
import os
sys.path.insert(0, "tests/lib")
from compare_runs import compare_scalars, compare_routing
T = sys.argv[1]
bad = 0
pairs = [tuple(p.split(":")) for p in os.environ["PAIRS"].split()]
for ref_name, run in pairs:
    ref = h5py.File(f"{T}/{ref_name}/metrics.h5", "r")
    f = h5py.File(f"{T}/{run}/metrics.h5", "r")
    bad += compare_scalars(ref, f, run, tol=1e-5)
    bad += compare_routing(ref, f, run)
# recompute = none equals block bitwise; none never recomputes, block does (stage 0 of 2).
for pair in os.environ["BITWISE"].split():
    none_name, block_name = pair.split(":")
    a, b = h5py.File(f"{T}/{none_name}/metrics.h5", "r"), h5py.File(f"{T}/{block_name}/metrics.h5", "r")
    bad += compare_scalars(a, b, block_name, tol=0)
    rn, rb = a["time/pipeline_recompute"][()], b["time/pipeline_recompute"][()]
    ok = np.all(rn == 0) and np.all(rb > 0)
    bad += not ok
    print(f"{block_name:24s} pipeline_recompute none {rn.sum():.4f} s, block {rb.sum():.4f} s {'ok' if ok else 'MISMATCH'}")
    bub, ideal = a["pipeline_bubble"][()], a["pipeline_bubble_ideal"][()]
    ok = np.all((bub >= 0) & (bub < 1)) and np.all(ideal == ideal[0]) and ideal[0] > 0
    bad += not ok
    print(f"{none_name:24s} pipeline_bubble {bub.mean():.3f} (ideal {ideal[0]:.3f}) {'ok' if ok else 'MISMATCH'}")
for ref_name, run in [tuple(p.split(":")) for p in os.environ["EXACT"].split()]:
    ref = h5py.File(f"{T}/{ref_name}/metrics.h5", "r")
    f = h5py.File(f"{T}/{run}/metrics.h5", "r")
    bad += compare_scalars(ref, f, run, tol=0)
# eval.examples_per_language scores every language that has validation examples.
sub = h5py.File(f"{T}/evalsub/metrics.h5", "r")
toks = sub["eval/lang_tokens"][()]
toks = toks[np.isfinite(toks).all(axis=1)]
assert toks.shape[0] >= 1 and (toks[-1] > 0).all(), f"a language was not scored: {toks[-1]}"
ref = h5py.File(f"{T}/ref/metrics.h5", "r")
assert ref["loss"].shape[0] == 4 and np.all(np.isfinite(ref["loss"][()])), "ref run incomplete"
# moe.balance = bias against no balancing: the largest expert share over the last 10 of 30 steps.
busiest = {r: h5py.File(f"{T}/{r}/metrics.h5", "r")["moe/layer1/expert_load"][()].max(axis=1)[-10:].mean()
           for r in ["unbalanced", "bias-balanced"]}
print(f"busiest expert's share, last 10 steps: no balancing {busiest['unbalanced']:.3f}, bias {busiest['bias-balanced']:.3f}")
assert busiest["unbalanced"] > 0.9 and busiest["bias-balanced"] < 0.6, busiest
# The routing of the reference (top-2, random second expert, capacity factor 1): C = 2 * 16 / 4
# slots, some second choices declined in training, entropies between 0 and ln E; NTLB reroutes.
moe = ref["moe/layer1"]
assert np.all(moe["capacity"][()] == 8), moe["capacity"][()]
assert np.all((moe["declined_fraction"][()] > 0) & (moe["declined_fraction"][()] < 1)), moe["declined_fraction"][()]
assert np.all(moe["rerouted_fraction"][()] == 0), moe["rerouted_fraction"][()]
h = moe["router_entropy"][()]
assert np.all((h > 0) & (h <= np.log(4) + 1e-12)), h
auxg = h5py.File(f"{T}/auxg/metrics.h5", "r")
rel = np.abs(auxg["aux_loss"][()] * 16 - ref["aux_loss"][()]) / ref["aux_loss"][()]
assert np.all(rel <= 1e-5), f"gshard aux form * E^2 vs switch form: {rel}"
rel = np.abs(auxg["loss"][()] - ref["loss"][()]) / ref["loss"][()]
assert np.all(rel <= 1e-5), f"gshard aux form with E^2 the coefficient trains differently: {rel}"
# Expert choice: no aux loss, C = 6, tokens with several experts at every step and, over the run,
# tokens with none (a step may happen to cover every token); top-2 gives every token 1 or 2
# experts (2 when its second choice was kept).
for r in ["echoice-1", "encdec-echoice-1"]:
    ec = h5py.File(f"{T}/{r}/metrics.h5", "r")
    assert np.all(ec["aux_loss"][()] == 0), ec["aux_loss"][()]
    for layer in ec["moe"]:
        m = ec[f"moe/{layer}"]
        assert np.all(m["capacity"][()] == 6), m["capacity"][()]
        assert np.all(m["dropped_fraction"][()] == 0), m["dropped_fraction"][()]
        per = m["experts_per_token"][()]
        assert per.shape[1] == 4 and np.allclose(per.sum(axis=1), 1), per
        assert per[:, 0].max() > 0 and np.all(per[:, 2:].sum(axis=1) > 0), per
per = moe["experts_per_token"][()]
assert np.allclose(per.sum(axis=1), 1) and np.all(per[:, 3] == 0) and np.all(per[:, 2] > 0), per
ntlb = h5py.File(f"{T}/ntlb/metrics.h5", "r")["moe/layer1"]
assert np.any(ntlb["rerouted_fraction"][()] > 0), ntlb["rerouted_fraction"][()]
sys.exit(1 if bad else 0)
PY
