#!/usr/bin/env bash
# `meshmoe bench-comm`: collective timings against message size. On 4 ranks, the whole world as
# one data axis and a 1x2x2 mesh timed along tensor; then the adaptive iteration count on 2 ranks;
# device buffers (the deferred host device) and NCCL (with a GPU; without one, a clean refusal).
# The HDF5 file is checked with h5py: every dataset and attribute, shapes, positive finite times,
# algbw = bytes/time and busbw = algbw * NCCL-tests factor (rtol 1e-12: the same double arithmetic,
# a few ulps at most). The table is printed once (rank 0). Bad options exit 2 quickly, no hang.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "bench_comm: $M not built"; exit 1; }
T=$(mktemp -d "${MESHMOE_TEST_TMPDIR:-/tmp}/bench_comm.XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# bench NAME NP ARGS...: stdout/stderr in $T/NAME.out/.err, exit code in $T/NAME.rc
bench() {
  local name=$1 np=$2; shift 2
  timeout 120 mpirun -np "$np" "$M" bench-comm "$@" >"$T/$name.out" 2>"$T/$name.err"
  echo $? >"$T/$name.rc"
  echo "-- $name (np=$np $*): exit $(cat "$T/$name.rc")"; sed 's/^/   /' "$T/$name.out"
}
ok() { [ "$(cat "$T/$1.rc")" = 0 ] || { fail "$1: exit $(cat "$T/$1.rc")"; sed 's/^/   stderr: /' "$T/$1.err"; }; }

# check FILE RANKS MESH AXIS AXIS_RANKS SIZES OPS ITERS(0 = adaptive)
check() {
  /usr/bin/python3 - "$@" <<'PY'
import math, sys
import h5py, numpy as np
path, ranks, mesh, axis, n, sizes, ops, iters = sys.argv[1:]
ranks, n, iters = int(ranks), int(n), int(iters)
sizes = [int(s) for s in sizes.split(",")]
ops = ops.split(",")
factor = {"all_reduce": 2 * (n - 1) / n, "all_to_all": (n - 1) / n, "all_gather": (n - 1) / n, "permute": 1.0}
errors = []
def expect(cond, what):
    if not cond:
        errors.append(what)
def s(v):
    return v.decode() if isinstance(v, bytes) else str(v)
with h5py.File(path, "r") as f:
    a = f.attrs
    for k in ("ranks", "mesh", "axis", "hostnames", "created_by"):
        expect(k in a, f"root attribute {k} missing")
    expect(int(a.get("ranks", -1)) == ranks, f"ranks = {a.get('ranks')}, expected {ranks}")
    expect(s(a.get("mesh", "")) == mesh, f"mesh = {a.get('mesh')}, expected {mesh}")
    expect(s(a.get("axis", "")) == axis, f"axis = {a.get('axis')}, expected {axis}")
    expect(int(a.get("axis_ranks", -1)) == n, f"axis_ranks = {a.get('axis_ranks')}, expected {n}")
    expect(len(s(a.get("hostnames", "")).split(",")) == ranks, f"hostnames = {a.get('hostnames')}: not one per rank")
    expect(s(a.get("created_by", "")).startswith("meshmoe bench-comm"), "created_by")
    expect("sizes" in f and list(f["sizes"][()]) == sizes, f"/sizes = {f['sizes'][()] if 'sizes' in f else None}")
    expect(s(f["sizes"].attrs.get("units", "")) == "bytes", "/sizes units")
    expect(sorted(k for k in f.keys() if k != "sizes") == sorted(ops), f"op groups {list(f.keys())}, expected {ops}")
    S = len(sizes)
    for op in ops:
        units = {"time_s": "s", "algbw": "GB/s", "busbw": "GB/s", "bytes": "bytes", "iters": "1"}
        for d, u in units.items():
            name = f"{op}/{d}"
            if name not in f:
                errors.append(f"/{name} missing"); continue
            expect(f[name].shape == (S,), f"/{name} shape {f[name].shape}, expected ({S},)")
            expect(s(f[name].attrs.get("units", "")) == u, f"/{name} units {f[name].attrs.get('units')}, expected {u}")
        if any(f"{op}/{d}" not in f for d in units):
            continue
        t, alg, bus = f[f"{op}/time_s"][()], f[f"{op}/algbw"][()], f[f"{op}/busbw"][()]
        nbytes, it = f[f"{op}/bytes"][()], f[f"{op}/iters"][()]
        expect(np.all(np.isfinite(t)) and np.all(t > 0), f"{op}: times not positive finite: {t}")
        expect(np.all(t < 10), f"{op}: a call took >= 10 s: {t}")
        # blocks of all_to_all / all_gather round down to whole floats per rank
        blk = [(sz // 4 // n) * 4 * n if op in ("all_to_all", "all_gather") else sz for sz in sizes]
        expect(list(nbytes) == blk, f"{op}: bytes {list(nbytes)}, expected {blk}")
        expect(np.allclose(alg, nbytes / t / 1e9, rtol=1e-12, atol=0), f"{op}: algbw != bytes/time: {alg}")
        expect(np.allclose(bus, alg * factor[op], rtol=1e-12, atol=0), f"{op}: busbw != algbw * {factor[op]}: {bus}")
        expect(abs(float(f[op].attrs.get("busbw_factor", -1)) - factor[op]) < 1e-15, f"{op}: busbw_factor attribute")
        if iters > 0:
            expect(np.all(it == iters), f"{op}: iters {it}, expected {iters}")
        else:
            # adaptive: stop at 100 calls, or once the slowest rank has timed >= 0.05 s
            expect(np.all((it >= 1) & (it <= 100)), f"{op}: adaptive iters {it} outside 1..100")
            expect(np.all((it == 100) | (it * t >= 0.05 * (1 - 1e-9))), f"{op}: stopped early: iters {it}, time {t}")
for e in errors:
    print("  h5 check:", e)
sys.exit(1 if errors else 0)
PY
}
# rows NAME COUNT: the table holds COUNT data rows, so rank 0 alone printed it
rows() {
  local got; got=$(grep -cE '^ +[0-9]+ (B|KiB|MiB|GiB) +(all_reduce|all_to_all|all_gather|permute) ' "$T/$1.out")
  [ "$got" = "$2" ] || fail "$1: $got table rows, expected $2"
}

ALL=all_reduce,all_to_all,all_gather,permute
bench world 4 --sizes 1K,64K --iters 3 -o "$T/bc.h5"
ok world; rows world 8
check "$T/bc.h5" 4 1x4x1 data 4 1024,65536 $ALL 3 || fail "world: HDF5 content"

bench tensor 4 --mesh 1x2x2 --axis tensor --sizes 1K,64K --iters 3 -o "$T/bc_tensor.h5"
ok tensor; rows tensor 8
check "$T/bc_tensor.h5" 4 1x2x2 tensor 2 1024,65536 $ALL 3 || fail "tensor: HDF5 content"

# 1000 bytes over 3 ranks: 83 floats per block, 996 bytes moved by all_to_all / all_gather.
bench three 3 --sizes 1000,4k --iters 2 --ops all_to_all,all_reduce -o "$T/bc_three.h5"
ok three; rows three 4
check "$T/bc_three.h5" 3 1x3x1 data 3 1000,4096 all_to_all,all_reduce 2 || fail "three: HDF5 content"

bench adaptive 2 --sizes 4K,1M --ops all_reduce,permute -o "$T/bc_adaptive.h5"
ok adaptive; rows adaptive 4
check "$T/bc_adaptive.h5" 2 1x2x1 data 2 4096,1048576 all_reduce,permute 0 || fail "adaptive: HDF5 content"

# all_reduce's buffer in node-shared memory (--shm resident), moved in place and checked there.
bench resident 2 --shm resident --sizes 1M,4M --ops all_reduce --iters 2 -o "$T/bc_resident.h5"
ok resident; rows resident 2
check "$T/bc_resident.h5" 2 1x2x1 data 2 1048576,4194304 all_reduce 2 || fail "resident: HDF5 content"

# Device buffers: under the deferred host device's copies rule (the GPU's, tests/scripts/deferred_device.sh)
# every op's check uploads its pattern, moves device buffers and downloads the result (MPI stages
# them through host copies); the file says which device and backend.
MESHMOE_TEST_DEFERRED_DEVICE=copies bench deferred 2 --sizes 4K,1M --iters 2 -o "$T/bc_deferred.h5"
ok deferred; rows deferred 8
grep -q "deferred as a GPU's work" "$T/deferred.out" || fail "deferred: the header does not name the device"
check "$T/bc_deferred.h5" 2 1x2x1 data 2 4096,1048576 $ALL 2 || fail "deferred: HDF5 content"
/usr/bin/python3 -c "import h5py,sys; a=h5py.File(sys.argv[1]).attrs; sys.exit(0 if (a['device'], a['backend']) == ('cpu', 'mpi') else 1)" \
  "$T/bc_deferred.h5" || fail "deferred: device/backend attributes"
# NCCL on the GPUs (--device cuda): with a GPU, all four ops on one rank through NCCL; without one
# (or without CUDA in the build), every rank stops at once with the reason.
if "$M" --version | grep -q CUDA && have_gpu; then
  bench nccl 1 --device cuda --sizes 4K,1M --iters 2 -o "$T/bc_nccl.h5"
  ok nccl; rows nccl 8
  check "$T/bc_nccl.h5" 1 1x1x1 data 1 4096,1048576 $ALL 2 || fail "nccl: HDF5 content"
  /usr/bin/python3 -c "import h5py,sys; sys.exit(0 if h5py.File(sys.argv[1]).attrs['backend'] == 'nccl' else 1)" \
    "$T/bc_nccl.h5" || fail "nccl: backend attribute"
else
  bench no_gpu 2 --device cuda --sizes 1K --iters 1 -o "$T/x.h5"
  [ "$(cat "$T/no_gpu.rc")" = 2 ] || fail "no_gpu: exit $(cat "$T/no_gpu.rc"), expected 2"
  grep -q "rank 0 on" "$T/no_gpu.err" || fail "no_gpu: the message does not name the failing rank"
fi

# Bad input: exit 2 on every rank, a message naming the problem, within 30 s.
# bad NAME NP PATTERN ARGS...
bad() {
  local name=$1 np=$2 pattern=$3; shift 3
  local start; start=$(date +%s)
  bench "$name" "$np" "$@"
  [ "$(cat "$T/$name.rc")" = 2 ] || fail "$name: exit $(cat "$T/$name.rc"), expected 2"
  grep -q -- "$pattern" "$T/$name.err" || { fail "$name: stderr does not mention '$pattern'"; sed 's/^/   stderr: /' "$T/$name.err"; }
  [ $(( $(date +%s) - start )) -le 30 ] || fail "$name: took more than 30 s"
}
bad bad_suffix 4 "'64Q'" --sizes 1K,64Q --iters 1 -o "$T/x.h5"
bad bad_zero 2 "'0' is zero" --sizes 0 --iters 1 -o "$T/x.h5"
bad bad_odd 2 "not a multiple of 4" --sizes 1001 --iters 1 -o "$T/x.h5"
bad bad_empty 2 "empty entry" --sizes 1K,,4K --iters 1 -o "$T/x.h5"
bad bad_huge 2 "1 GiB" --sizes 2G --iters 1 -o "$T/x.h5"
bad bad_tiny 4 "less than one float per rank" --sizes 8 --iters 1 -o "$T/x.h5"
bad bad_axis 4 "--axis 'expert'" --axis expert --sizes 1K --iters 1 -o "$T/x.h5"
bad bad_mesh_form 4 "expected PxDxT" --mesh 2x2 --sizes 1K --iters 1 -o "$T/x.h5"
bad bad_mesh_fit 4 "8 ranks" --mesh 2x2x2 --sizes 1K --iters 1 -o "$T/x.h5"
bad bad_ops 2 "unknown op 'bcast'" --ops all_reduce,bcast --sizes 1K --iters 1 -o "$T/x.h5"
bad bad_iters 2 "--iters -1" --iters -1 --sizes 1K -o "$T/x.h5"
bad bad_dir 2 "does not exist" --sizes 1K --iters 1 -o "$T/no/such/dir/x.h5"
bad bad_device 2 "give cpu or cuda" --device gpu --sizes 1K --iters 1 -o "$T/x.h5"
bad bad_resident_cuda 2 "not with --device cuda" --device cuda --shm resident --sizes 1K --iters 1 -o "$T/x.h5"

echo "bench_comm: $fails failure(s)"
[ "$fails" -eq 0 ]
