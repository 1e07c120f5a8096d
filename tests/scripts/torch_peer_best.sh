#!/usr/bin/env bash
# bench/torch_peer_best.py, the PyTorch peer of the GPU decks (docs/gpu.md), runs on this host's
# torch on CPU and routes as meshmoe:
#   - tests/scripts/peer_routing_check.py: its capacity, routing (expert, slot, drops) and dropped
#     counts equal tests/reference/model_reference.py's (whose routing model_vs_torch.sh requires
#     equal to meshmoe's), hand-computed cases, and its sorted per-expert GEMMs equal a per-token loop;
#   - a tiny GShard top-2 deck (2 micro-batches) in each mode and precision: eager fp32 and bf16, and
#     --compile; the output line has every field, finite figures, a dropped fraction in [0, 1], and
#     names each fallback this torch needs (no SDPA: attention=math; no fused AdamW on this device:
#     adamw=foreach; no torch.compile: compile=eager, mode eager), and none it does not.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
test_dir torch_peer_best
export OPENBLAS_NUM_THREADS=1
"$PYTHON" tests/scripts/peer_routing_check.py || fail "peer_routing_check.py"

cat >"$T/tiny.toml" <<'TOML'
[run]
name = "tiny-gshard"
[model]
vocab_size = 300
seq_len = 32
d_model = 32
num_layers = 2
num_heads = 4
d_ff = 64
activation = "gelu"
[moe]
every = 2
num_experts = 4
router = "top2"
group_size = 16
capacity_factor_train = 1.0
[optim]
batch_size = 4
micro_batches = 2
TOML
has() { "$PYTHON" -c "import inspect, torch, torch.nn.functional as F; import sys; sys.exit(0 if ($1) else 1)"; }
want_fallbacks=""
has 'hasattr(F, "scaled_dot_product_attention")' || want_fallbacks+=",attention=math"
want_fallbacks+=",adamw=foreach"  # the peer asks for fused AdamW on CUDA only
compiles=0; has 'hasattr(torch, "compile")' && compiles=1

for mode in "fp32" "bf16" "bf16 --compile"; do
  set -- $mode
  prec=$1; shift
  line=$(timeout 300 "$PYTHON" bench/torch_peer_best.py "$T/tiny.toml" --device cpu --threads 1 --precision "$prec" --steps 3 "$@" 2>"$T/err") ||
    { cat "$T/err"; fail "torch_peer_best.py $mode: exit $?"; }
  echo "$line"
  get() { sed -n "s/.* $1 \([^ ]*\).*/\1/p" <<<"$line"; }
  [[ $line == "torch_peer_best tiny-gshard mode "* ]] || fail "$mode: unexpected line"
  for key in step_s tokens tokens_per_s flops_per_token tflops peak_mem_gib dropped loss; do
    v=$(get $key)
    "$PYTHON" -c "import math, sys; v = float(sys.argv[1]); sys.exit(0 if math.isfinite(v) and v >= 0 else 1)" "$v" 2>/dev/null ||
      fail "$mode: $key '$v' is not a finite number >= 0"
  done
  [ "$(get tokens)" = 128 ] || fail "$mode: tokens $(get tokens), the deck's 4 x 32 = 128"
  "$PYTHON" -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 1 else 1)" "$(get dropped)" || fail "$mode: dropped $(get dropped) > 1"
  [ "$(get precision)" = "$prec" ] || fail "$mode: precision $(get precision)"
  want=$want_fallbacks
  expect_mode=eager
  if [ "${1:-}" = --compile ]; then
    if [ $compiles = 1 ]; then expect_mode=compile; else want+=",compile=eager"; fi
  fi
  want=${want#,}
  [ "$(get mode)" = $expect_mode ] || fail "$mode: mode $(get mode), expected $expect_mode"
  [ "$(get fallbacks)" = "${want:-none}" ] || fail "$mode: fallbacks $(get fallbacks), expected ${want:-none}"
done
echo "torch_peer_best: ok"
