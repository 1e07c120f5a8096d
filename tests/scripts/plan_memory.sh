#!/usr/bin/env bash
# `meshmoe plan` prints a memory and cost table per pipeline stage. Checked on two small decks (a
# dense Megatron deck on 1x2x2, a Switch deck with experts over data on 2x2x1) against numbers
# computed here, in Python, from the deck values and the layers' documented shapes (EXACT integer
# equality: the table prints bytes), and the rows beyond the model: the data set in memory (its
# splits' sizes read here with h5py) and the runtime baseline; plus the node-memory warning for a
# model that cannot fit.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "plan_memory: $M not built"; exit 1; }
tmp=$(mktemp -d "${MESHMOE_TEST_TMPDIR:-/tmp}/plan_memory.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

cat >"$tmp/dense.toml" <<'TOML'
[mesh]
data = 2
tensor = 2
[model]
vocab_size = 100
seq_len = 16
d_model = 32
num_layers = 2
num_heads = 4
d_ff = 64
activation = "relu"
tied_embeddings = true
dropout = 0.1
[moe]
every = 0
[optim]
name = "adamw"
batch_size = 8
micro_batches = 2
TOML

cat >"$tmp/switch.toml" <<'TOML'
[mesh]
pipe = 2
data = 2
[model]
vocab_size = 100
seq_len = 16
d_model = 32
num_layers = 4
num_heads = 4
d_ff = 64
activation = "geglu"
tied_embeddings = false
[moe]
num_experts = 4
every = 2
router = "top1"
expert_d_ff = 48
group_size = 16
capacity_factor_train = 1.25
jitter_eps = 0.01
[optim]
name = "adafactor"
batch_size = 8
micro_batches = 2
TOML

# Both decks plan with a small data set: the plan counts the splits the trainer will hold.
"$M" prep text -q --max-len 17 /usr/share/common-licenses/GPL-3 -o "$tmp/data.h5" >/dev/null ||
  fail "prep text of the data set"
printf '[data]\npath = "%s"\n' "$tmp/data.h5" | tee -a "$tmp/dense.toml" >>"$tmp/switch.toml"

run_plan() {  # NAME NP
  timeout 60 mpirun -np "$2" "$M" plan "$tmp/$1.toml" >"$tmp/$1.out" 2>"$tmp/$1.err"
  local rc=$?
  echo "-- $1 (np=$2): exit $rc"; sed 's/^/   /' "$tmp/$1.out"
  [ "$rc" = 0 ] || { fail "$1: exit $rc"; sed 's/^/   stderr: /' "$tmp/$1.err"; }
}
run_plan dense 4
# The same with model.recompute = block: stage inputs kept, forwards recomputed, nothing parked.
sed 's/^\[model\]$/[model]\nrecompute = "block"/' "$tmp/switch.toml" >"$tmp/switch-block.toml"
run_plan switch 4
run_plan switch-block 4

# The expected numbers, from the deck values (f = 4 bytes per float).
"$PYTHON" - "$tmp" <<'PY' || fails=$((fails + 1))
import math, re, sys
tmp = sys.argv[1]

def table(path):
    """label -> list of column strings, from the rows of the memory table."""
    rows = {}
    for line in open(path):
        if not line.startswith("  "):
            continue
        cells = re.split(r"\s{2,}", line.strip())
        rows.setdefault(cells[0], cells[1:])
    return rows

def head(path):
    m = re.search(r"model: (\d+) parameters, (\d+) activated per token", open(path).read())
    return int(m.group(1)), int(m.group(2))

f = 4
bad = 0
# Beyond the model: the data set as Dataset::open holds it (tokens uint16, loss_mask uint8,
# doc_offsets int64, lang int32 per split) and the batcher's order (uint32 per train example), read
# here with h5py; the runtime baseline of one BLAS thread (run/memory.cpp: 32 MiB; OPENBLAS_NUM_THREADS=1)
import h5py
with h5py.File(f"{tmp}/data.h5", "r") as h:
    dataset = sum(h[s]["tokens"].size * h[s]["tokens"].dtype.itemsize + h[s]["loss_mask"].size
                  + 8 * h[s]["doc_offsets"].size + 4 * h[s]["lang"].size for s in ("train", "valid"))
    dataset += 4 * h["train"]["lang"].size
runtime = 32 << 20
def expect(name, label, got, want):
    global bad
    ok = got == want
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {label} = {got}, expected {want}")
    bad += not ok

def ring(b, n): return 2 * (n - 1) / n * b

# ---- dense on pipe 1 x data 2 x tensor 2 ------------------------------------------------------
V, T, Md, L, NH, FF, P, D, Tn, B, MB = 100, 16, 32, 2, 4, 64, 1, 2, 2, 8, 2
rows = B // (MB * D); N = rows * T; NM = N * Md
Ml = Md // Tn; Hl = NH // Tn; Fl = FF // Tn
params = V * Md + T * Md + L * (4 * Md + 3 * Md * Ml + Ml * Md + Md * Fl + Fl * Md) + 2 * Md  # tied head: none
total = V * Md + T * Md + L * (4 * Md + 4 * Md * Md + 2 * Md * FF) + 2 * Md
act = (3 * NM * f + 2 * N * 4                       # stage x, h, f; segment ids, positions
       + 2 * N * 4                                  # embedding: token ids, positions
       + L * 2 * (NM + N) * f + (NM + N) * f        # ln1, ln2 per block; ln_f
       + L * ((NM + 3 * N * Ml + rows * Hl * T * T + N * Ml) * f + NM)   # attention + dropout mask
       + L * ((NM + 2 * N * Fl) * f + NM)           # relu ffn: x, pre, h + dropout mask
       + (NM + N * V) * f + N * 8 + 2 * N * f + N * 4)  # head input, logits; loss, lse, mask, targets
# backward scratch per block: dy, datt + dqkv, dP of every (sequence, local head) pair (parallel tasks);
# per LayerNorm the parameter gradients' partial sums over row chunks of 64, [2, ceil(N / 64), M]
ln_work = 2 * math.ceil(N / 64) * Md * f
work = (2 * NM + L * (NM + 4 * N * Ml + rows * Hl * T * T + NM) + L * (NM + 2 * N * Fl + NM)) * f + (2 * L + 1) * ln_work
t = table(f"{tmp}/dense.out")
n_total, n_act = head(f"{tmp}/dense.out")
expect("dense", "model parameters", n_total, total)
expect("dense", "activated per token", n_act, total)
expect("dense", "parameters (count)", int(t["parameters (count)"][0]), params)
expect("dense", "parameters", int(t["parameters"][0]), params * f)
expect("dense", "gradients", int(t["gradients"][0]), params * f)
expect("dense", "optimizer state", int(t["optimizer state (adamw)"][0]), 2 * params * f)
expect("dense", "activations", int(t["activations"][0]), act)
expect("dense", "backward workspace", int(t["backward workspace"][0]), work)
expect("dense", "model total", int(t["model total"][0]), 4 * params * f + act + work)
expect("dense", "dataset in memory", int(t["dataset in memory"][0]), dataset)
expect("dense", "runtime", int(t["runtime (MPI, BLAS, HDF5)"][0]), runtime)
expect("dense", "total", int(t["total"][0]), 4 * params * f + act + work + dataset + runtime)
expect("dense", "data", int(t["data"][0]), round(ring(params * f, D)))
# Megatron: fwd + bwd all-reduce of [N, M] after attention and after the ffn, each block, each micro-batch
expect("dense", "tensor", int(t["tensor"][0]), round(ring(MB * 2 * L * 2 * NM * f, Tn)))
expect("dense", "pipe", int(t["pipe"][0]), 0)

# ---- Switch on pipe 2 x data 2 x tensor 1: experts over data ----------------------------------
V, T, Md, L, NH, FF, P, D, B, MB = 100, 16, 32, 4, 4, 64, 2, 2, 8, 2
E, He, S, cf, k = 4, 48, 16, 1.25, 1
rows = B // (MB * D); N = rows * T; NM = N * Md; G = N // S
C = min(S, math.ceil(k * S * cf / E))
El = E // D
adaf = lambda *s: (math.prod(s[:-2]) * (s[-2] + s[-1])) if len(s) >= 2 else s[0]
n_total, n_act = head(f"{tmp}/switch.out")
expert_one = Md * 2 * He + He * Md
total = V * Md + T * Md + L * (4 * Md + 4 * Md * Md) + 2 * (Md * 2 * FF + FF * Md) + 2 * (Md * E + E * expert_one) + 2 * Md + V * Md
expect("switch", "model parameters", n_total, total)
expect("switch", "activated per token", n_act, total - 2 * (E - k) * expert_one)
for deck, stage in [(d, s) for d in ("switch", "switch-block") for s in (0, 1)]:
    t = table(f"{tmp}/{deck}.out")
    park = deck == "switch"  # recompute = none
    blocks = [2 * stage, 2 * stage + 1]          # block 1 and 3 are MoE (every = 2)
    # geglu weights are registered [M, 2, H] and [E, M, 2, H] (mlp.hpp, experts.hpp): Adafactor
    # factors their last two dimensions
    shapes, expert_shapes = [], []
    if stage == 0: shapes += [(V, Md), (T, Md)]
    for b in blocks:
        shapes += [(Md,), (Md,), (Md, Md), (Md, Md), (Md, Md), (Md, Md), (Md,), (Md,)]
        if b % 2 == 1:
            shapes += [(Md, E)]
            expert_shapes += [(El, Md, 2, He), (El, He, Md)]
        else:
            shapes += [(Md, 2, FF), (FF, Md)]
    if stage == 1: shapes += [(Md,), (Md,), (V, Md)]
    shapes += expert_shapes
    params = sum(math.prod(s) for s in shapes)
    experts = sum(math.prod(s) for s in expert_shapes)
    state = sum(adaf(*s) for s in shapes)
    # activations: stage buffers, ln, attention (no dropout), geglu ffn, MoE, head
    moe = ((NM + NM + 2 * N * E) * f + N * 8 + N * k * 4 + N * 8 + G * E * 8 + 2 * N * k * 4 + N * k * f + E * 8
           + E * G * C * 12 + 2 * E * G * C * Md * f
           + (El * D * G * C) * (Md + 2 * He + He) * f
           # all-to-all path (D > 1): receive buffer [R, M], row tokens [R] int64, counts and offsets
           + ((El * D * G * C) * Md * f + (El * D * G * C) * 8 + (2 * D + 3 * D * El) * 8 + El * 4 if D > 1 else 0))
    act = (3 * NM * f + 2 * N * 4 + (2 * N * 4 if stage == 0 else 0) + 2 * 2 * (NM + N) * f
           + 2 * (NM + 3 * NM + rows * NH * T * T + NM) * f
           + (NM + 2 * N * FF + N * FF) * f + moe)
    if stage == 1:
        act += (NM + N) * f + (NM + N * V) * f + N * 8 + 2 * N * f + N * 4
    # MoE backward scratch: router dxr [N, M] (jitter); dgate [N k], dout [E G C, M], dxe [R, M];
    # every local expert's dpre [R, 2 He] (grouped GEMMs; dh overwrites h)
    R = El * D * G * C
    moe_work = (NM + N * k + E * G * C * Md + R * Md + R * 2 * He) * f
    layernorms = 2 * len(blocks) + (1 if stage == 1 else 0)  # ln1, ln2 per block; ln_f on the last stage
    work = ((2 * NM + 2 * (NM + 4 * NM + rows * NH * T * T) + (NM + N * FF + 2 * N * FF)) * f + moe_work
            + layernorms * 2 * math.ceil(N / 64) * Md * f)
    in_flight = 2 if stage == 0 else 1
    # recompute = block: a later stage keeps each in-flight input; none: one receive buffer
    pipe_buf = (MB + 1) * NM * f if stage == 0 else ((1 if park else in_flight) + MB) * NM * f
    # recompute = none parks in_flight - 1 micro-batches' activations, less what no backward reads:
    # stage buffers (with segment ids, positions), router logits [N, E], the all-to-all receive
    # buffer [R, M] (one MoE layer here)
    parked = (in_flight - 1) * (act - 3 * NM * f - 2 * N * 4 - N * E * f - El * D * G * C * Md * f) if park else 0
    name = f"{deck} stage {stage}"
    c = stage
    expect(name, "parameters", int(t["parameters"][c]), params * f)
    expect(name, "optimizer state", int(t["optimizer state (adafactor)"][c]), state * f)
    expect(name, "activations", int(t["activations"][c]), act)
    expect(name, "moe activations", int(t["moe"][c]), moe)
    expect(name, "backward workspace", int(t["backward workspace"][c]), work)
    expect(name, "in flight", int(t["micro-batches in flight"][c]), in_flight)
    expect(name, "pipeline buffers", int(t["pipeline buffers"][c]), pipe_buf)
    expect(name, "parked activations", int(t["parked activations"][c]), parked)
    model = 2 * params * f + state * f + act + work + pipe_buf + parked
    expect(name, "model total", int(t["model total"][c]), model)
    expect(name, "total", int(t["total"][c]), model + dataset + runtime)
    # data: ring all-reduce of the replicated params; 4 all-to-alls of [E, G, C, M] per MoE layer per
    # forward and backward; 1F1B on stage 0 runs F0 F1 B0 B1; with recompute = block it recomputes
    # each forward before its backward: 4 forwards there, 2 on stage 1
    forwards = 4 if stage == 0 and not park else 2
    a2a = (forwards * 2 + MB * 2) * (D - 1) / D * E * G * C * Md * f
    expect(name, "data", int(t["data"][c]), round(ring((params - experts) * f, D) + a2a))
    expect(name, "pipe", int(t["pipe"][c]), MB * NM * f)
sys.exit(1 if bad else 0)
PY

# A model that cannot fit: the warning names the node's share per rank.
timeout 60 mpirun -np 1 "$M" plan "$tmp/dense.toml" --set mesh.data=1 --set mesh.tensor=1 --set model.d_model=8192 \
  --set model.num_heads=8 --set model.d_ff=32768 --set model.num_layers=8 >"$tmp/big.out" 2>&1
grep -q "^warning: stage 0 needs .* per rank but this node has .* per rank" "$tmp/big.out" ||
  { fail "no node-memory warning for a 100 GiB model"; cat "$tmp/big.out"; }
grep -q "^warning" "$tmp/dense.out" && fail "dense: unexpected warning"

echo "plan_memory: $fails failure(s)"
[ "$fails" -eq 0 ]
