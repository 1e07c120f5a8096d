#!/usr/bin/env bash
# bench/gpu.sh's record without a GPU: `bench/gpu.sh --host` trains tiny decks with meshmoe on the
# CPU and runs the PyTorch peers on the CPU through the same code path as on a GPU (data, runs, the
# memory sampler, bench/gpu_report.py), appending to a JSON file; then an independent reading of the
# same outputs checks every record (docs/gpu.md "The record"):
#   run 1: a Switch top-1 deck in bf16 with the eager and compile peers (bench/torch_peer_best.py);
#   run 2 (another results folder, the same JSON file: appended): a dense deck in fp32 with the legacy
#          peer (bench/torch_peer.py), and a deck meshmoe refuses (exit 2), recorded as such.
# Checked: 3 records (1 + 2), host true, ceilings and MFU null (no GPU figure), the commit of `meshmoe
# --version`; meshmoe's tokens/s the median of metrics.h5's tokens_per_s after the first three steps,
# its FLOPs per token the file's, its dropped fraction the mean of the MoE layers' last row; each
# peer's tokens/s its output line's; the speed-ups their ratios; peak memory sampled (> 0).
# Then tools/gpu-session.sh's dry run (HOST=1) on the Switch deck: every stage passes and its OUT
# holds session.log, logs.tar.xz and a gpu.json of one record.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "gpu_record: $M not built"; exit 1; }
test_dir gpu_record
export OPENBLAS_NUM_THREADS=1
tiny_data "$T"
for deck in switch dense bad; do
  cat >"$T/tiny-$deck.toml" <<TOML
[run]
name = "tiny-$deck"
threads = 1
[model]
seq_len = 16
d_model = 32
num_layers = 2
num_heads = 4
d_ff = 64
activation = "gelu"
[moe]
every = $([ $deck = dense ] && echo 0 || echo 2)
num_experts = 4
router = "top1"
group_size = 16
capacity_factor_train = 1.0
[optim]
batch_size = 4
micro_batches = 2
[data]
path = "$T/data.h5"
[eval]
every = 0
TOML
done
echo 'bogus_key = 1' >>"$T/tiny-bad.toml"
json=$T/gpu.json
run() {  # run OUT DECKS PRECISIONS PEERS
  BUILD=$(dirname "$M") BENCH_OUT=$1 DECKS=$2 PRECISIONS=$3 PEERS=$4 STEPS=6 TORCH_STEPS=3 RESULTS_JSON=$json \
    timeout 600 bench/gpu.sh --host >"$1.log" 2>&1
  local rc=$?
  [ $rc = 0 ] || { cat "$1.log"; fail "bench/gpu.sh --host exit $rc ($1)"; }
  cat "$1.log"
}
run "$T/one" "$T/tiny-switch.toml" bf16 "eager compile"
run "$T/two" "$T/tiny-dense.toml $T/tiny-bad.toml" fp32 legacy
commit=$("$M" --version | awk '{print $2}')

# tools/gpu-session.sh's dry run on the CPU: every stage runs (the [cuda] cases and gpu_train.sh
# skip without a GPU), its bench stage through bench/gpu.sh --host, and what a device call brings
# back is written to OUT.
HOST=1 BUILD=$(dirname "$M") OUT=$T/session LOGS=$T/session-logs RESULTS_JSON=$T/session.json PEERS=eager \
  STEPS=6 TORCH_STEPS=3 SESSION_SECONDS=400 timeout 420 tools/gpu-session.sh "$T/tiny-switch.toml" >"$T/session.txt" 2>&1
rc=$?
cat "$T/session.txt"
[ $rc = 0 ] || fail "tools/gpu-session.sh (HOST=1) exit $rc"
for stage in catch bench train; do
  grep -q "^-- $stage: exit 0" "$T/session/session.log" || fail "gpu-session: stage $stage did not pass"
done
[ -s "$T/session/logs.tar.xz" ] || fail "gpu-session: no logs.tar.xz"
"$PYTHON" -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(0 if len(r) == 1 and r[0]["deck"] == "tiny-switch" and r[0]["meshmoe"]["status"] == "ok" and r[0]["peers"]["eager"]["status"] == "ok" else 1)' \
  "$T/session/gpu.json" || fail "gpu-session: its gpu.json is not the one record of the tiny deck"

"$PYTHON" - "$json" "$T" "$commit" <<'PY' || fail "the records do not match the runs' outputs"
import json, math, re, statistics, sys
import h5py
recs, T, commit = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
bad = []
def check(ok, what):
    if not ok:
        bad.append(what)
def close(a, b):
    return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9)
check([(r["deck"], r["precision"]) for r in recs] == [("tiny-switch", "bf16"), ("tiny-bad", "fp32"), ("tiny-dense", "fp32")],
      f"records {[(r['deck'], r['precision']) for r in recs]}")
for r in recs:
    name = f"{r['deck']}-{r['precision']}"
    out = f"{T}/one" if r["deck"] == "tiny-switch" else f"{T}/two"
    check(r["host"] is True and r["gpu"].startswith("host"), f"{name}: not marked as a host run")
    check(r["ceilings"] == {"gemm_bf16_tflops": None, "spec_bf16_tflops": None}, f"{name}: ceilings {r['ceilings']}")
    check(r["commit"] == commit, f"{name}: commit {r['commit']}, meshmoe --version says {commit}")
    check(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["date"]) is not None, f"{name}: date {r['date']}")
    mm = r["meshmoe"]
    if r["deck"] == "tiny-bad":
        check(mm["status"] == "exit 2" and mm["tokens_per_s"] is None, f"{name}: meshmoe {mm}")
        continue
    check(mm["status"] == "ok", f"{name}: meshmoe status {mm['status']}")
    with h5py.File(f"{out}/{name}/metrics.h5", "r") as f:
        tps = list(f["tokens_per_s"][()])
        check(len(tps) == 6 and r["steps"] == 6, f"{name}: {len(tps)} steps logged, record says {r['steps']}")
        check(close(mm["tokens_per_s"], statistics.median(tps[3:])), f"{name}: tokens/s {mm['tokens_per_s']}")
        check(close(mm["flops_per_token"], float(f.attrs["train_flops_per_token"])), f"{name}: FLOPs per token")
        drops = [float(f["moe"][k]["dropped_fraction"][-1]) for k in f["moe"]] if "moe" in f else []
        check((mm["dropped_fraction"] is None) == (not drops) and (not drops or close(mm["dropped_fraction"], sum(drops) / len(drops))),
              f"{name}: dropped {mm['dropped_fraction']}, metrics.h5 {drops}")
    check(r["deck"] != "tiny-switch" or (mm["dropped_fraction"] is not None and mm["dropped_fraction"] > 0),
          f"{name}: no dropped choice at capacity factor 1")
    check(mm["mfu_measured"] is None and mm["mfu_spec"] is None, f"{name}: an MFU without a ceiling")
    check(mm["peak_mem_gib"] is not None and mm["peak_mem_gib"] > 0, f"{name}: peak memory {mm['peak_mem_gib']}")
    want_peers = ["compile", "eager"] if r["deck"] == "tiny-switch" else ["legacy"]
    check(sorted(r["peers"]) == want_peers, f"{name}: peers {sorted(r['peers'])}")
    for k, p in r["peers"].items():
        line = [l for l in open(f"{out}/torch-{k}-{name}.log") if l.startswith("torch_peer")][-1].split()
        kv = dict(zip(line[2::2], line[3::2]))
        want = float(kv["tokens_per_s"]) if "tokens_per_s" in kv else float(kv["tokens"]) / float(kv["step_s"])
        check(p["status"] == "ok" and close(p["tokens_per_s"], want), f"{name} {k}: tokens/s {p['tokens_per_s']}, its line {want}")
        check(close(r["speedup"][k], mm["tokens_per_s"] / want), f"{name} {k}: speedup {r['speedup'][k]}")
        check(p["peak_mem_sampled_gib"] is not None and p["peak_mem_sampled_gib"] > 0, f"{name} {k}: sampled memory")
        if k != "legacy":
            check(p["mode"] == "eager" or (k == "compile" and p["mode"] == "compile"), f"{name} {k}: mode {p['mode']}")
            check(p["fallbacks"] is not None and 0 <= p["dropped_fraction"] <= 1, f"{name} {k}: {p}")
for b in bad:
    print("FAIL:", b)
print(f"gpu_record: {len(recs)} records checked" if not bad else f"gpu_record: {len(bad)} mismatches")
sys.exit(1 if bad else 0)
PY
echo "gpu_record: ok"
