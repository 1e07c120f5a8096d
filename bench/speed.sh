#!/usr/bin/env bash
# `make bench`, part 1: where a training step's time goes, against the machine's ceiling and a peer,
# all measured in this one run:
#   - the fp32 sgemm ceiling with the runs' thread count (`meshmoe bench-gemm`, n = 512..2048);
#   - the FLOP-matched speed decks at d_model 512 (dense peer, Switch top-1, GShard top-2; the MoE
#     ones also dropless) and a GPT-2-124M-shaped dense model, each on 1 rank x THREADS BLAS threads;
#   - the GPT-2 shape again on THREADS ranks x 1 thread (mesh.data = THREADS: the gradient
#     all-reduce of 124 M floats against the backward), without and with optim.shard_state;
#   - the same models in PyTorch (bench/torch_peer.py) at its best setting on this host.
# bench/speed_report.py prints per run: step time, model GFLOP/s, fraction of the ceiling, ratio to
# the dense peer and to PyTorch, and the per-phase profile of the step.
#   THREADS=2 STEPS=20 bench/speed.sh        (results and logs in runs/bench-speed/)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
THREADS=${THREADS:-2}
STEPS=${STEPS:-20}
OUT=${OUT:-runs/bench-speed}
ensure_gettext_data
rm -rf "$OUT"; mkdir -p "$OUT"

echo "== sgemm ceiling, 1 rank x $THREADS threads"
$M bench-gemm --threads "$THREADS" --seconds 1 | tee "$OUT/gemm.txt"

train() {  # name np threads deck [--set ...]
  local name=$1 np=$2 threads=$3 deck=$4; shift 4
  echo "== $name: $np rank(s) x $threads thread(s), $STEPS steps"
  # mpirun binds each rank to one core unless told otherwise: give a threaded rank its cores
  local bind=(); [ "$threads" -gt 1 ] && bind=(--map-by "slot:PE=$threads")
  mpirun "${bind[@]}" -np "$np" $M train "$deck" --set run.threads="$threads" --set run.steps="$STEPS" --set run.log_every=1 \
    --set run.resume=never --set eval.every=0 --set run.out_dir="$OUT/$name" "$@" >"$OUT/$name.log" 2>&1 ||
    { tail -20 "$OUT/$name.log"; exit 1; }
  grep -E '^step' "$OUT/$name.log" | tail -1
  rm -rf "$OUT/$name/ckpt"  # the end-of-run checkpoint is not part of the benchmark
}
for deck in speed-dense-512 speed-switch-512 speed-gshard-512 gpt2-124m-dense; do
  train "$deck" 1 "$THREADS" "bench/decks/$deck.toml"
done
# Every choice computed (moe.dropless): model FLOPs are then the FLOPs done, whatever the routers
# (untrained, they send most tokens to few experts, and capacity drops the overflow).
for moe in switch gshard; do
  train "speed-$moe-512-dropless" 1 "$THREADS" "bench/decks/speed-$moe-512.toml" --set moe.dropless=true
done
train "gpt2-124m-dense-data$THREADS" "$THREADS" 1 bench/decks/gpt2-124m-dense.toml --set mesh.data="$THREADS"
# ... and with the optimizer state sharded over those ranks (optim.shard_state, ZeRO stage 1).
train "gpt2-124m-dense-data$THREADS-shard" "$THREADS" 1 bench/decks/gpt2-124m-dense.toml --set mesh.data="$THREADS" \
  --set optim.shard_state=true

for deck in speed-dense-512 speed-switch-512 speed-gshard-512 gpt2-124m-dense; do
  echo "== PyTorch peer: $deck, $THREADS intra-op threads, 1 BLAS thread per op"
  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/torch_peer.py "bench/decks/$deck.toml" --threads "$THREADS" \
    --steps $(( STEPS < 8 ? STEPS : 8 )) | tee "$OUT/torch-$deck.txt"
done
/usr/bin/python3 bench/speed_report.py "$OUT"
