#!/usr/bin/env bash
# `meshmoe ckpt info|verify` on a checkpoint written by 2 ranks (hidden Catch case [ckpt-export]):
# info lists step, mesh, version, every parameter with its shape and the total; verify exits 0 on
# the file, on its ckpt dir and on its run dir (via LATEST). h5py reads the file independently:
# attributes, Fletcher32 on every dataset, and every value equal to the test's formula
# value(name, logical index) exactly (no poisoned replica written). Then a flipped byte in a data
# chunk, a truncated copy, a non-HDF5 file, a missing path and a directory without LATEST: exit 1
# with the reason; bad command lines exit 2.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
TESTS=${MESHMOE_TESTS:-$PWD/${BUILD:-build}/meshmoe_tests}
[ -x "$M" ] || { echo "ckpt_cli: $M not built"; exit 1; }
[ -x "$TESTS" ] || { echo "ckpt_cli: $TESTS not built"; exit 1; }
T=$(mktemp -d "${MESHMOE_TEST_TMPDIR:-/tmp}/ckpt_cli.XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

MESHMOE_TEST_TMPDIR=$T timeout 120 mpirun -np 2 "$TESTS" "[ckpt-export]" >"$T/export.log" 2>&1 ||
  { cat "$T/export.log"; echo "FAIL: export case"; exit 1; }
RUN=$T/ckpt_cli/run
F=$RUN/ckpt/step_00000007.h5
[ -f "$F" ] || { echo "FAIL: $F not written"; ls -lR "$T"; exit 1; }

# ck NAME EXPECTED_RC NP ARGS...: runs meshmoe, output in $T/NAME.out/.err
ck() {
  local name=$1 want=$2 np=$3; shift 3
  timeout 60 mpirun -np "$np" "$M" "$@" >"$T/$name.out" 2>"$T/$name.err"
  local rc=$?
  echo "-- $name: meshmoe $* (np=$np): exit $rc"
  sed 's/^/   out: /' "$T/$name.out" | head -40
  sed 's/^/   err: /' "$T/$name.err" | grep -v -e '^   err: ---' -e 'mpirun' -e 'Process name' -e 'Exit code' -e 'Primary job' -e 'non-zero' -e 'job to be' -e 'aborted' -e '^   err: $' | head -10
  [ "$rc" = "$want" ] || fail "$name: exit $rc, expected $want"
}
has() {  # NAME STREAM TEXT
  grep -qF -- "$3" "$T/$1.$2" || fail "$1: $2 lacks \"$3\""
}

ck info 0 1 ckpt info "$F"
has info out "step         7 (optimizer updates 6)"
has info out "mesh         pipe=2 x data=1 x tensor=1 = 2 ranks"
has info out "version      test-1.2.3"
has info out "optimizer    adamw"
has info out "data cursor  epoch 3, position 12345"
has info out "parameters   14 tensors, 531 elements"
has info out "blocks.0.moe.w1"
has info out "[4, 3, 6]"
has info out "optimizer state  18 tensors"
has info out "blocks.3.moe.w1/v_row"
has info out "counter      bad_steps = 2"

ck verify_file 0 1 ckpt verify "$F"
has verify_file out "ok: step 7, 14 parameters (531 elements), 18 optimizer tensors"
ck verify_ckpt_dir 0 1 ckpt verify "$RUN/ckpt"
ck verify_run_dir 0 2 ckpt verify "$RUN"
[ "$(grep -c 'ok: step 7' "$T/verify_run_dir.out")" = 1 ] || fail "verify on 2 ranks: not printed exactly once"

${PYTHON:-/usr/bin/python3} - "$F" "$T" <<'PY' || fail "h5py read-back"
import shutil, sys
import h5py, numpy as np
path, tmp = sys.argv[1:]
errors = []
def value(name, shape):
    salt = sum(name.encode()) % 97
    return (np.float32(salt) * np.float32(100) + np.arange(int(np.prod(shape)), dtype=np.float32) * np.float32(0.25)).reshape(shape)
with h5py.File(path, "r") as f:
    a = f.attrs
    for k, want in [("step", 7), ("update_count", 6), ("data_epoch", 3), ("data_position", 12345),
                    ("param_count", 531), ("world_size", 2), ("format_version", 1)]:
        if int(a[k]) != want:
            errors.append(f"attribute {k} = {a[k]}, expected {want}")
    if np.uint64(np.int64(a["seed"]).view(np.uint64)) != np.uint64(0xfedcba9876543210):
        errors.append(f"seed {a['seed']}")
    if list(a["mesh_shape"]) != [2, 1, 1]:
        errors.append(f"mesh_shape {a['mesh_shape']}")
    if "layers = 4" not in str(a["deck"]):
        errors.append("deck text")
    n = 0
    def visit(name, obj):
        global n
        if not isinstance(obj, h5py.Dataset):
            return
        n += 1
        if not obj.fletcher32:
            errors.append(f"{name}: no Fletcher32")
        if obj.dtype != np.float32:
            errors.append(f"{name}: dtype {obj.dtype}")
        tensor = name  # relative to /params or /optim
        if not np.array_equal(obj[()], value(tensor, obj.shape)):
            errors.append(f"{name}: values differ from the formula (max |diff| {np.abs(obj[()] - value(tensor, obj.shape)).max()})")
    f["params"].visititems(visit)
    f["optim"].visititems(visit)
    if n != 32:
        errors.append(f"{n} datasets, expected 14 + 18")
    off = f["params/blocks.1.attn.w"].id.get_chunk_info(0).byte_offset
# A corrupted copy: one byte in the middle of a data chunk.
shutil.copy(path, tmp + "/corrupt.h5")
with open(tmp + "/corrupt.h5", "r+b") as g:
    g.seek(off + 20); b = g.read(1); g.seek(off + 20); g.write(bytes([b[0] ^ 0x5A]))
print("\n".join(errors) or "h5py read-back ok")
sys.exit(1 if errors else 0)
PY

ck corrupt 1 1 ckpt verify "$T/corrupt.h5"
has corrupt err "is bad"
has corrupt err "Fletcher32"
has corrupt err "blocks.1.attn.w"
head -c 3000 "$F" >"$T/truncated.h5"
ck truncated 1 1 ckpt verify "$T/truncated.h5"
has truncated err "is bad"
echo "not a checkpoint" >"$T/text.h5"
ck not_hdf5 1 1 ckpt verify "$T/text.h5"
ck info_not_hdf5 1 1 ckpt info "$T/text.h5"
ck missing 1 1 ckpt verify "$T/nowhere.h5"
has missing err "no such file or directory"
mkdir -p "$T/empty"
ck no_latest 1 1 ckpt verify "$T/empty"
has no_latest err "without LATEST"
echo "garbage" >"$RUN/ckpt/LATEST"
ck bad_latest 1 1 ckpt verify "$RUN"
has bad_latest err "does not name a checkpoint file"
ck no_action 2 1 ckpt
ck no_path 2 1 ckpt verify

echo "$fails failure(s)"
[ "$fails" = 0 ]
