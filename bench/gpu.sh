#!/usr/bin/env bash
# `make bench-gpu`: the CUDA path's speed on one GPU against the GPU's ceilings and PyTorch eager,
# all measured in this one run (docs/gpu.md; results in bench/RESULTS.md):
#   - ceilings through PyTorch on the same GPU (bench/gpu_peak.py): cuBLAS bf16, fp32 and TF32 GEMM
#     rates, device-to-device copy bandwidth;
#   - meshmoe `train --set run.device=cuda` (model.precision fp32 and bf16) on the GPU decks (bench/decks/gpu-*.toml: d_model 1024,
#     12 layers, seq 1024, 8 sequences a step; dense, Switch E=8 and E=64, GShard E=8, FLOP-matched);
#   - the same models in PyTorch eager (bench/torch_peer.py --device cuda), fp32 without TF32 and
#     bf16 autocast;
#   - bench/gpu_report.py: tokens/s, model TFLOP/s and MFU against the bf16 and fp32 ceilings.
# Each run has its own time limit (RUN_TIMEOUT seconds): a run that fails or times out is reported
# as such and the others go on.
#   BUILD=build-gpu DECKS="dense switch8" PRECISIONS="fp32 bf16" STEPS=12 bench/gpu.sh     (results in BENCH_OUT, default runs/bench-gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/env.sh
BUILD=${BUILD:-build}
M=$BUILD/meshmoe
PY=${MESHMOE_PYTHON:-python3}
O=${BENCH_OUT:-runs/bench-gpu}
DECKS=${DECKS:-dense switch8 gshard8 switch64}
STEPS=${STEPS:-12}
TORCH_STEPS=${TORCH_STEPS:-8}
PRECISIONS=${PRECISIONS:-fp32 bf16}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
# No checkpoint at the end: a large model's would cost more than its steps.
END_CKPT=${END_CKPT---set checkpoint.at_end=false}
if ! have_gpu; then
  echo "bench-gpu: no GPU here"; exit 1
fi
mkdir -p "$O"
[ -s .gpu/gpu-bench.h5 ] || $M prep gettext -q --languages de,fr -o .gpu/gpu-bench.h5 || exit 1

if [ ! -s "$O/peak.txt" ]; then  # once per results folder
  echo "== ceilings (PyTorch on this GPU)"
  timeout 180 $PY bench/gpu_peak.py | tee "$O/peak.txt"
fi
for d in $DECKS; do
  for prec in $PRECISIONS; do
    echo "== meshmoe gpu-$d on the GPU, $prec, $STEPS steps"
    run=$d-$prec
    rm -rf "$O/$run"
    if timeout "$RUN_TIMEOUT" mpirun -np 1 $M train "bench/decks/gpu-$d.toml" --set run.device=cuda --set model.precision=$prec \
        --set run.steps="$STEPS" --set run.log_every=1 --set run.resume=never --set checkpoint.every=0 $END_CKPT \
        --set run.out_dir="$O/$run" >"$O/$run.log" 2>&1; then
      grep -E '^step' "$O/$run.log" | tail -1
    else
      echo "meshmoe gpu-$d $prec: exit $? (log $O/$run.log)"; tail -5 "$O/$run.log"
    fi
    rm -rf "$O/$run/ckpt"
    echo "== PyTorch eager gpu-$d $prec"
    timeout "$RUN_TIMEOUT" $PY bench/torch_peer.py "bench/decks/gpu-$d.toml" --device cuda --precision $prec \
      --steps "$TORCH_STEPS" >"$O/torch-$run.txt" 2>&1 || echo "torch gpu-$d $prec: exit $?"
    tail -1 "$O/torch-$run.txt"
  done
done
$PY bench/gpu_report.py "$O"
