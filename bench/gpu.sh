#!/usr/bin/env bash
# `make bench-gpu`: the CUDA path's speed on one GPU against the GPU's ceilings and PyTorch, all
# measured in this one run (docs/gpu.md "Benchmarks and checks on a GPU machine"):
#   - ceilings through PyTorch on the same GPU (bench/gpu_peak.py): cuBLAS bf16, fp32 and TF32 GEMM
#     rates, device-to-device copy bandwidth;
#   - meshmoe `train --set run.device=cuda` at each precision on each deck: DECKS names
#     bench/decks/gpu-NAME.toml (dense, switch8, gshard8, switch64: d_model 1024, 12 layers, seq 1024;
#     large-dense, large-switch8, large-gshard8, large-switch64: the real-size decks, d_model 2048,
#     16 layers, seq 2048, a 32k SentencePiece vocabulary) or a deck file;
#   - the same models in PyTorch, one run per PEERS entry: eager and compile (bench/torch_peer_best.py:
#     SDPA, fused AdamW, bf16 autocast, sorted-token experts; compile under torch.compile), legacy
#     (bench/torch_peer.py eager, the peer of the measurements before 2026-12);
#   - the device memory each process reached (the GPU's memory.used, sampled every 0.2 s, with one
#     process on the GPU at a time), and with PROFILE=1 a short extra meshmoe run per deck in bf16
#     under MESHMOE_DEVICE_PROFILE=1 (GPU time per kernel and GEMM shape);
#   - bench/gpu_report.py: the table (tokens/s, MFU against the measured bf16 GEMM rate and the
#     spec peak, peak memory), and one JSON record per deck and precision appended to RESULTS_JSON
#     (default bench/results/gpu.json; RESULTS_JSON= none writes none).
# A missing data set is prepared from the gettext corpus as the deck's data keys say (the real-size
# decks' 32k SentencePiece vocabulary: every language, or SPM_LANGUAGES; on all cores; minutes on 2
# cores: prepare it once here and carry it, docs/gpu.md "A GPU session").
# Each run has its own time limit (RUN_TIMEOUT seconds, and DEADLINE): a run that fails or times out
# is recorded as such (its exit status; 124 for a timeout) and the others go on.
#   BUILD=build-gpu DECKS="dense switch8" PRECISIONS="fp32 bf16" PEERS="eager compile" STEPS=12 bench/gpu.sh
#   (results in BENCH_OUT, default runs/bench-gpu)
# --host (or HOST=1): the same runs on the CPU (run.device = cpu, the peers with --device cpu), no
# ceilings; for checking this script and the record it writes without a GPU
# (tests/scripts/gpu_record.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/env.sh
[ "${1:-}" = --host ] && HOST=1
HOST=${HOST:-0}
BUILD=${BUILD:-build}
M=$BUILD/meshmoe
PY=$PYTHON  # tests/env.sh: MESHMOE_PYTHON, else Debian's /usr/bin/python3
O=${BENCH_OUT:-runs/bench-gpu}
DECKS=${DECKS:-dense switch8 gshard8 switch64}
STEPS=${STEPS:-12}
TORCH_STEPS=${TORCH_STEPS:-8}
PRECISIONS=${PRECISIONS:-fp32 bf16}
PEERS=${PEERS:-eager compile}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
# The SentencePiece data sets' languages, comma-separated: empty (the default) for the whole corpus
# (183 languages, 1.3 M texts; the vocabulary learns from prep's --spm-sample of them).
SPM_LANGUAGES=${SPM_LANGUAGES:-}
DEADLINE=${DEADLINE:-}  # epoch seconds: each run's limit is cut to end 5 s before it; a run with under 10 s left is skipped (exit 124)
PROFILE=${PROFILE:-0}
PROFILE_STEPS=${PROFILE_STEPS:-3}
RESULTS_JSON=${RESULTS_JSON-bench/results/gpu.json}
# No checkpoint at the end: a large model's would cost more than its steps.
END_CKPT=${END_CKPT---set checkpoint.at_end=false}
if [ "$HOST" = 1 ]; then
  device=cpu
else
  device=cuda
  have_gpu || { echo "bench-gpu: no GPU here (--host runs the same on the CPU)"; exit 1; }
fi
mkdir -p "$O"
$M --version >"$O/version.txt" || { echo "bench-gpu: $M does not run"; exit 1; }

deck_file() { case "$1" in *.toml) echo "$1" ;; *) echo "bench/decks/gpu-$1.toml" ;; esac; }
deck_name() { basename "$(deck_file "$1")" .toml; }
deck_key() {  # deck_key FILE SECTION KEY: the value of a simple key (quotes removed)
  awk -v s="[$2]" -v k="$3" '/^\[/ {in_s = ($1 == s)} in_s && $1 == k && $2 == "=" {v = $3; gsub(/"/, "", v); print v; exit}' "$1"
}
# prepare_data DECK: its data.path from the gettext corpus when missing (data.tokenizer, data.spm_pieces).
prepare_data() {
  local f=$1 path tok pieces
  path=$(deck_key "$f" data path); tok=$(deck_key "$f" data tokenizer); pieces=$(deck_key "$f" data spm_pieces)
  [ -n "$path" ] && [ ! -s "$path" ] || return 0
  mkdir -p "$(dirname "$path")"
  if [ "$tok" = spm ]; then
    echo "== preparing $path (SentencePiece, ${pieces:-8000} pieces, languages ${SPM_LANGUAGES:-all} of the gettext corpus)"
    $M prep gettext -q --tokenizer spm --spm-pieces "${pieces:-8000}" --threads "$(nproc)" \
      ${SPM_LANGUAGES:+--languages "$SPM_LANGUAGES"} -o "$path"
  else
    $M prep gettext -q --languages de,fr -o "$path"
  fi
}
descendants() { local c; echo "$1"; for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do descendants "$c"; done; }
# Peak device memory of what runs meanwhile: the GPU's memory.used (MiB), or on the host the largest
# VmHWM (KiB) of the processes below PID; `sample_memory PID FILE &` writes the maximum in MiB.
sample_memory() {
  local pid=$1 out=$2 max=0 v
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$HOST" = 1 ]; then
      v=$(for p in $(descendants "$pid"); do
            awk '/^VmHWM/ {print int($2 / 1024)}' "/proc/$p/status" 2>/dev/null; done | sort -n | tail -1)
    else
      v=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
    fi
    [ -n "$v" ] && [ "$v" -gt "$max" ] && { max=$v; echo "$max" >"$out"; }
    sleep 0.2
  done
}
# timed_run NAME CMD...: runs CMD (output in $O/NAME.log) under RUN_TIMEOUT with the memory sampler;
# writes $O/NAME.rc and $O/NAME.mem_mib.
timed_run() {
  local name=$1; shift
  rm -f "$O/$name.mem_mib"
  local limit=$RUN_TIMEOUT
  if [ -n "$DEADLINE" ]; then
    local left=$((DEADLINE - $(date +%s) - 5))
    [ $left -lt $limit ] && limit=$left
    if [ $limit -lt 10 ]; then
      echo "skipped: DEADLINE reached" >"$O/$name.log"; echo 124 >"$O/$name.rc"; return 124
    fi
  fi
  timeout "$limit" "$@" >"$O/$name.log" 2>&1 &
  local pid=$!
  sample_memory $pid "$O/$name.mem_mib" &
  local sampler=$!
  wait $pid; local rc=$?
  wait $sampler
  echo $rc >"$O/$name.rc"
  return $rc
}

if [ ! -s "$O/peak.txt" ]; then  # once per results folder
  if [ "$HOST" = 1 ]; then
    echo "gpu host ($(uname -n), CPU) torch $($PY -c 'import torch; print(torch.__version__)' 2>/dev/null)" >"$O/peak.txt"
  else
    echo "== ceilings (PyTorch on this GPU)"
    timeout 180 $PY bench/gpu_peak.py | tee "$O/peak.txt"
  fi
fi
bf16_peak=$(sed -n 's/^ceiling gemm_bf16_n8192 \([0-9.]*\) .*/\1/p' "$O/peak.txt")
# run_peer PEER DECK NAME PREC
run_peer() {
  local peer=$1 deck=$2 name=$3 prec=$4 run=$3-$4 fpt cmd
  # meshmoe's FLOPs per token (metrics.h5), so that both sides' MFU count the same work
  fpt=$($PY -c 'import h5py, sys; print(h5py.File(sys.argv[1], "r").attrs["train_flops_per_token"])' "$O/$run/metrics.h5" 2>/dev/null)
  echo "== PyTorch $peer $name $prec"
  case $peer in
    legacy) cmd=(bench/torch_peer.py "$deck" --device $device --precision "$prec" --steps "$TORCH_STEPS") ;;
    eager|compile)
      cmd=(bench/torch_peer_best.py "$deck" --device $device --precision "$prec" --steps "$TORCH_STEPS"
           ${bf16_peak:+--peak-tflops $bf16_peak} ${fpt:+--flops-per-token $fpt})
      [ "$peer" = compile ] && cmd+=(--compile) ;;
    *) echo "bench-gpu: unknown peer $peer"; return ;;
  esac
  timed_run "torch-$peer-$run" $PY "${cmd[@]}" || echo "torch $peer $name $prec: exit $(cat "$O/torch-$peer-$run.rc")"
  tail -1 "$O/torch-$peer-$run.log"
}

# Most wanted first, so that a DEADLINE cuts the least: meshmoe and the quick peers on every deck,
# then the compile peer (its compilation takes minutes on a large model), then the profiles.
for d in $DECKS; do
  deck=$(deck_file "$d"); name=$(deck_name "$d")
  [ -s "$deck" ] || { echo "bench-gpu: no deck $deck"; continue; }
  prepare_data "$deck" || { echo "bench-gpu: could not prepare the data of $deck"; continue; }
  echo "$deck" >"$O/$name.deck"
  for prec in $PRECISIONS; do
    run=$name-$prec
    echo "== meshmoe $name on $device, $prec, $STEPS steps"
    rm -rf "${O:?}/$run"
    if timed_run "$run" mpirun -np 1 $M train "$deck" --set run.device=$device --set model.precision=$prec \
        --set run.steps="$STEPS" --set run.log_every=1 --set run.resume=never --set checkpoint.every=0 $END_CKPT \
        --set run.out_dir="$O/$run"; then
      grep -E '^step' "$O/$run.log" | tail -1
    else
      echo "meshmoe $name $prec: exit $(cat "$O/$run.rc") (log $O/$run.log)"; tail -5 "$O/$run.log"
    fi
    rm -rf "$O/$run/ckpt"
    for peer in $PEERS; do
      [ "$peer" = compile ] || run_peer "$peer" "$deck" "$name" "$prec"
    done
  done
done
for d in $DECKS; do
  [ -s "$O/$(deck_name "$d").deck" ] || continue
  for prec in $PRECISIONS; do
    for peer in $PEERS; do
      [ "$peer" = compile ] && run_peer compile "$(deck_file "$d")" "$(deck_name "$d")" "$prec"
    done
  done
done
if [ "$PROFILE" = 1 ]; then
  for d in $DECKS; do
    deck=$(deck_file "$d"); name=$(deck_name "$d")
    [ -s "$O/$name.deck" ] || continue
    echo "== meshmoe $name bf16 under MESHMOE_DEVICE_PROFILE=1, $PROFILE_STEPS steps"
    rm -rf "${O:?}/$name-profile"
    MESHMOE_DEVICE_PROFILE=1 timed_run "$name-profile" mpirun -np 1 -x MESHMOE_DEVICE_PROFILE $M train "$deck" \
      --set run.device=$device --set model.precision=bf16 --set run.steps="$PROFILE_STEPS" --set run.log_every=1 \
      --set run.resume=never --set checkpoint.every=0 $END_CKPT --set run.out_dir="$O/$name-profile"
    grep -v -i pmix "$O/$name-profile.log" | sed -n '/^step  *[0-9]/,$p' | head -40
  done
fi
if [ "$RESULTS_JSON" != none ]; then
  $PY bench/gpu_report.py "$O" --json "$RESULTS_JSON"
else
  $PY bench/gpu_report.py "$O"
fi
