#!/usr/bin/env bash
# tools/gpu-bundle.sh: the archive carried to a GPU machine without MPI, HDF5 or OpenBLAS. Packs
# this build (SKIP_BUILD=1: the mechanism is the same for the CUDA build, whose CUDA libraries come
# from the GPU machine), unpacks it, and runs it in a mount namespace where the system's Open MPI,
# PMIx, HDF5, OpenBLAS and toml++ are hidden (empty directories and /dev/null bound over them):
# `meshmoe --version`, a short training run as an MPI singleton, and `mpirun -np 2 bench-gemm`
# through the bundle's own mpirun, orted and plug-ins. Fails when the bundle misses a library, or
# when Open MPI or PMIx cannot find a plug-in or help text ("Sorry!").
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
BUILD=${BUILD:-build}
T=$(mktemp -d "${MESHMOE_TEST_TMPDIR:-/tmp}/gpu_bundle.XXXXXX")
trap 'rm -rf "$T"' EXIT
SKIP_BUILD=1 BUILD="$BUILD" XZ_LEVEL=1 LIMIT_MB=64 tools/gpu-bundle.sh "$T/b.tar.xz" || { echo "FAIL: gpu-bundle.sh"; exit 1; }
mkdir -p "$T/b" && tar -xJf "$T/b.tar.xz" -C "$T/b" || { echo "FAIL: unpack"; exit 1; }
timeout 120 build/meshmoe prep text README.md -q -o "$T/data.h5" >/dev/null 2>&1 || { echo "FAIL: prep"; exit 1; }
unshare -m true 2>/dev/null || { echo "FAIL: unshare -m is not permitted here (needs root)"; exit 1; }
cat >"$T/inside.sh" <<INSIDE
set -euo pipefail
hide_dir() { if [ -d "\$1" ]; then mount --bind "$T/empty" "\$1"; fi; }
hide_file() { for f in "\$@"; do if [ -e "\$f" ]; then mount --bind /dev/null "\$f"; fi; done; }
mkdir -p "$T/empty"
hide_dir /usr/lib/x86_64-linux-gnu/openmpi; hide_dir /usr/lib/x86_64-linux-gnu/pmix2; hide_dir /usr/share/openmpi
hide_file /usr/bin/orterun /usr/bin/orted /usr/lib/x86_64-linux-gnu/libmpi.so* /usr/lib/x86_64-linux-gnu/libopen-*.so* \
  /usr/lib/x86_64-linux-gnu/libhdf5*.so* /usr/lib/x86_64-linux-gnu/libopenblas*.so* /usr/lib/x86_64-linux-gnu/openblas*/lib*.so* \
  /usr/lib/x86_64-linux-gnu/libtomlplusplus.so* /usr/lib/x86_64-linux-gnu/libpmix.so*
unset OMPI_MCA_btl_vader_single_copy_mechanism
source "$T/b/env.sh"
export OMPI_MCA_btl_vader_single_copy_mechanism=none
cd "$T"
if env -u LD_LIBRARY_PATH /usr/bin/orted --help >/dev/null 2>&1; then echo "system orted still visible"; exit 1; fi
echo "-- which mpirun: \$(command -v mpirun)"
"$T/b/meshmoe" --version
"$T/b/meshmoe" train "$PWD/inputs/m4-dense-tiny.toml" --set data.path="$T/data.h5" --set run.out_dir="$T/run" \
  --set run.steps=3 --set run.log_every=1 --set eval.every=0 --set model.seq_len=32 --set model.num_layers=1 --set optim.batch_size=4
mpirun -np 2 "$T/b/meshmoe" bench-gemm --threads 1 --sizes 64 --seconds 0.05
INSIDE
if timeout 300 unshare -m bash "$T/inside.sh" >"$T/out" 2>&1; then
  cat "$T/out"
  grep -q '^step      3/3' "$T/out" && grep -q '^ceiling' "$T/out" || { echo "FAIL: missing output"; exit 1; }
  grep -q "which mpirun: $T/b/bin/mpirun" "$T/out" || { echo "FAIL: not the bundle's mpirun"; exit 1; }
  ! grep -q "Sorry!" "$T/out" || { echo "FAIL: Open MPI or PMIx missed a plug-in or help text of the bundle"; exit 1; }
  echo "gpu_bundle: the bundle runs without the system's MPI, HDF5 and OpenBLAS"
else
  cat "$T/out"; echo "FAIL: the bundle did not run with the system libraries hidden"; exit 1
fi
