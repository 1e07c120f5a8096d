#!/usr/bin/env bash
# `meshmoe bench-gemm`, the sgemm ceiling MFU and `make bench` compare against: one rank and two
# ranks (rates summed, one table from rank 0), bad options exit 2 at once; and a short training run
# records the ceiling and the FLOPs per token it measured MFU with as metrics.h5 root attributes,
# consistent with its mfu column (mfu = tokens_per_s * train_flops_per_token / sgemm_peak_flops,
# rtol 1e-5: the attributes are printed with 6 significant digits). A rank with more threads
# (run.threads) than cores in its CPU affinity is warned about, with the launch option that fixes it.
# run.peak_gflops sets the ceiling instead; an MFU over 100% is warned about once.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "bench_gemm: $M not built"; exit 1; }
T=$(mktemp -d "${MESHMOE_TEST_TMPDIR:-/tmp}/bench_gemm.XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

timeout 60 "$M" bench-gemm --threads 1 --sizes 64,128 --seconds 0.05 >"$T/one.out" 2>&1 || fail "one rank: exit $?"
cat "$T/one.out"
grep -qE '^ +64 +[0-9.]+$' "$T/one.out" && grep -qE '^ +128 +[0-9.]+$' "$T/one.out" || fail "one rank: no row per size"
grep -qE '^ceiling [0-9.]+ GFLOP/s$' "$T/one.out" || fail "one rank: no ceiling line"
timeout 60 mpirun -np 2 "$M" bench-gemm --threads 1 --sizes 128 --seconds 0.05 >"$T/two.out" 2>&1 || fail "two ranks: exit $?"
[ "$(grep -c '^ceiling' "$T/two.out")" = 1 ] || fail "two ranks: expected one ceiling line (rank 0)"
grep -q '2 ranks x 1 BLAS thread' "$T/two.out" || fail "two ranks: header does not say 2 ranks x 1 thread"
for bad in "--sizes 0" "--sizes 64,x" "--sizes ," "--seconds 0"; do
  timeout 30 "$M" bench-gemm $bad >"$T/bad.out" 2>&1; rc=$?
  [ $rc = 2 ] || fail "bench-gemm $bad: exit $rc, expected 2"
  grep -q 'error: bench-gemm' "$T/bad.out" || { fail "bench-gemm $bad: no error message"; cat "$T/bad.out"; }
done

timeout 300 "$M" prep text README.md -q -o "$T/data.h5" >/dev/null 2>&1 || fail "prep text"
timeout 300 "$M" train inputs/m4-dense-tiny.toml --set data.path="$T/data.h5" --set run.out_dir="$T/run" \
  --set run.steps=4 --set run.log_every=2 --set eval.every=0 --set model.seq_len=32 --set model.num_layers=1 \
  --set optim.batch_size=4 >"$T/train.out" 2>&1 || { fail "train: exit $?"; tail "$T/train.out"; }
/usr/bin/python3 - "$T/run/metrics.h5" <<'PY' || fail "metrics.h5 attributes"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    flops = float(f.attrs["train_flops_per_token"]); peak = float(f.attrs["sgemm_peak_flops"])
    assert flops > 0 and peak > 0, (flops, peak)
    mfu = f["mfu"][()]; tps = f["tokens_per_s"][()]
    assert len(mfu) == 2, mfu
    np.testing.assert_allclose(mfu, tps * flops / peak, rtol=1e-5)
    print(f"metrics.h5: train_flops_per_token {flops:.6g}, sgemm_peak_flops {peak:.6g}, mfu {mfu}")
PY
# run.peak_gflops replaces the start-up measurement: the attribute and the mfu column use it; an
# MFU over 100% (a ceiling far too low, as a busy node measures) is warned about once.
timeout 300 "$M" train inputs/m4-dense-tiny.toml --set data.path="$T/data.h5" --set run.out_dir="$T/peak" \
  --set run.steps=4 --set run.log_every=2 --set eval.every=0 --set model.seq_len=32 --set model.num_layers=1 \
  --set optim.batch_size=4 --set run.peak_gflops=0.001 >"$T/peak.out" 2>&1 || { fail "peak: exit $?"; tail "$T/peak.out"; }
grep -q "peak 0.0 GFLOP/s (run.peak_gflops)" "$T/peak.out" || { fail "peak: header"; cat "$T/peak.out"; }
[ "$(grep -c 'warning: MFU .* is over 100%' "$T/peak.out")" = 1 ] || { fail "peak: not one MFU warning"; cat "$T/peak.out"; }
/usr/bin/python3 - "$T/peak/metrics.h5" <<'PY' || fail "run.peak_gflops: metrics.h5"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    peak = float(f.attrs["sgemm_peak_flops"]); flops = float(f.attrs["train_flops_per_token"])
    assert peak == 1e6, peak
    np.testing.assert_allclose(f["mfu"][()], f["tokens_per_s"][()] * flops / peak, rtol=1e-5)
PY
# run.threads = 2 on a rank that mpirun bound to one core: a warning naming the fix; unbound, none.
threads_run() {  # NAME MPIRUN-OPTIONS...
  local name=$1; shift
  timeout 300 mpirun "$@" -np 1 "$M" train inputs/m4-dense-tiny.toml --set data.path="$T/data.h5" --set run.out_dir="$T/$name" \
    --set run.steps=1 --set run.threads=2 --set eval.every=0 --set model.seq_len=32 --set model.num_layers=1 \
    --set optim.batch_size=4 >"$T/$name.out" 2>&1 || fail "$name: exit $?"
}
threads_run bound --bind-to core
grep -q "warning: 2 threads per rank (run.threads) but a rank may run on only 1 core" "$T/bound.out" &&
  grep -q -- "--map-by slot:PE=2" "$T/bound.out" || { fail "bound to one core: no warning"; cat "$T/bound.out"; }
if [ "$(nproc)" -ge 2 ]; then
  threads_run unbound --bind-to none
  ! grep -q "warning: 2 threads per rank" "$T/unbound.out" || fail "unbound with $(nproc) cores: unexpected warning"
fi
[ $fails = 0 ] && echo "bench_gemm: all checks passed"
exit $((fails > 0))
