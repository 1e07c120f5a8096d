#!/usr/bin/env bash
# Packs meshmoe for a GPU machine that has CUDA, cuBLAS and NCCL but no MPI, HDF5 or OpenBLAS
# (docs/gpu.md): builds here with CUDA=1, then puts into one compressed archive
#   meshmoe, meshmoe_tests (at the top, so that the unpacked folder serves as BUILD; debug sections
#             stripped, symbols kept), gemm_probe (bench/cuda_gemm_probe.cu: cuBLAS bf16 GEMM costs)
#   bin/      mpirun (orterun), orted, and msgfmt (the test scripts write small catalogs with it)
#   lib/      every shared library they load that is neither glibc, libstdc++/libgcc_s (the GPU
#             machine's newer ones serve) nor CUDA's own (cudart, cuBLAS, NCCL come from there)
#   lib/x86_64-linux-gnu/{openmpi/lib/openmpi3,pmix2/{lib,share}}, share/openmpi
#             Open MPI's and PMIx's plug-ins and help texts, where the environment
#             (OPAL_PREFIX, PMIX_PREFIX) make the relocated Debian installation look for them
#   env.sh    sets PATH, LD_LIBRARY_PATH (the bundle, then CUDA's libraries: /usr/local/cuda and
#             the NVIDIA Python packages of the GPU image), OPAL_PREFIX, and the MPI settings for
#             a container (root, oversubscription, shared memory only)
#   tests/, inputs/, bench/ and the test scripts' helpers are not in it: the device tool carries the
#   working tree anyway.
# Usage (here):  tools/gpu-bundle.sh [OUT.tar.xz]      (default .gpu/meshmoe-gpu.tar.xz)
# There, in the working tree:  mkdir -p build-gpu && tar -xJf .gpu/meshmoe-gpu.tar.xz -C build-gpu &&
#                source build-gpu/env.sh && BUILD=build-gpu tests/run-tests.sh   (or build-gpu/meshmoe ...)
# Variables: BUILD (default build-gpu), CUDA_ARCH (default sm_90), LIMIT_MB (default 60), XZ_LEVEL
# (default 9), SKIP_BUILD=1 (pack BUILD as it is, e.g. a CUDA=0 build for tests/scripts/gpu_bundle.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.gpu/meshmoe-gpu.tar.xz}
BUILD=${BUILD:-build-gpu}
LIMIT_MB=${LIMIT_MB:-60}
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  make -j"$(nproc)" CUDA=1 BUILD="$BUILD" ${CUDA_ARCH:+CUDA_ARCH=$CUDA_ARCH} tests >&2
fi
for f in "$BUILD/meshmoe" "$BUILD/meshmoe_tests"; do [ -x "$f" ] || { echo "gpu-bundle: $f not built" >&2; exit 1; }; done

stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp "$BUILD/meshmoe" "$BUILD/meshmoe_tests" "$stage/"
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ -x "$nvcc" ]; then
  "$nvcc" -std=c++17 -O2 --expt-relaxed-constexpr -gencode arch=compute_90,code=sm_90 -Isrc bench/cuda_gemm_probe.cu \
    -lcublas -o "$stage/gemm_probe"
fi
# Without their debug sections (symbols kept): 95 MB of the test binary's 100 MB are DWARF, which
# the archive would otherwise spend most of its size limit on.
strip --strip-debug "$stage/meshmoe" "$stage/meshmoe_tests"
cp "$(readlink -f "$(command -v orterun)")" "$stage/bin/orterun"
cp "$(readlink -f "$(command -v orted)")" "$stage/bin/orted"
ln -s orterun "$stage/bin/mpirun"
command -v msgfmt >/dev/null && cp "$(readlink -f "$(command -v msgfmt)")" "$stage/bin/msgfmt"

# Plug-in trees, mirrored under the prefix the relocated installation will use.
ompi_pkglib=$(ompi_info --path pkglibdir --parsable | sed -n 's/^path:pkglibdir://p')
ompi_pkgdata=$(ompi_info --path pkgdatadir --parsable | sed -n 's/^path:pkgdatadir://p')
# Debian's PMIx is installed with its own prefix (…/pmix2: lib/pmix plug-ins, share/pmix help texts).
pmix_prefix=$(dirname "$(dirname "$(dirname "$(find /usr/lib -path '*pmix*/lib/pmix/*.so' | head -1)")")")
for d in "$ompi_pkglib" "$ompi_pkgdata" "$pmix_prefix/lib" "$pmix_prefix/share"; do
  [ -d "$d" ] || continue
  mkdir -p "$stage${d#/usr}"
  cp -a "$d/." "$stage${d#/usr}/"
done
echo "${pmix_prefix#/usr}" >"$stage/pmix_prefix"

# Shared libraries: the closure of what ldd resolves for the executables and plug-ins, minus the
# ones the GPU machine brings. A plug-in whose library is not there at all is left out.
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia)[.-]'
objects=("$stage/meshmoe" "$stage/meshmoe_tests" "$stage"/bin/*)
[ -x "$stage/gemm_probe" ] && objects+=("$stage/gemm_probe")
while IFS= read -r -d '' so; do objects+=("$so"); done < <(find "$stage/lib" -name '*.so' -print0)
declare -A seen=()
missing=()
for obj in "${objects[@]}"; do
  while read -r name _ path _; do
    [ -n "$name" ] || continue
    if [ "$path" = "not" ]; then missing+=("$(basename "$obj"): $name"); continue; fi
    [[ "$name" =~ $skip ]] && continue
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=1
    cp -L "$path" "$stage/lib/$name"
  done < <(ldd "$obj" 2>/dev/null | awk '/=>/ {print $1, $2, $3, $4}')
done
for m in "${missing[@]}"; do
  case "$m" in
    meshmoe*|orte*) echo "gpu-bundle: $m not found here" >&2; exit 1 ;;
  esac
done

cat >"$stage/env.sh" <<'EOF'
# Source me: the environment meshmoe's bundle runs in (tools/gpu-bundle.sh).
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cuda_libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import glob, site; print(" ".join(d for p in site.getsitepackages() for d in sorted(glob.glob(p + "/nvidia/*/lib"))))' 2>/dev/null); do
  [ -d "$d" ] && cuda_libs="$cuda_libs:$d"
done
export PATH="$B/bin:$PATH"
export LD_LIBRARY_PATH="$B/lib${cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
pmix="$B$(cat "$B/pmix_prefix")"
export OPAL_PREFIX="$B" PMIX_PREFIX="$pmix" PMIX_MCA_mca_base_component_path="$pmix/lib/pmix"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_mca_base_component_show_load_errors=0
EOF
mkdir -p "$(dirname "$OUT")"
XZ_OPT="-${XZ_LEVEL:-9} -T$(nproc)" tar -C "$stage" -cJf "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
size=$(stat -c %s "$OUT")
echo "gpu-bundle: $OUT: $((size / 1024 / 1024)) MiB ($(ls "$stage/lib" | wc -l) libraries, unpacked $(du -sm "$stage" | cut -f1) MiB)"
[ "$size" -le $((LIMIT_MB * 1024 * 1024)) ] || { echo "gpu-bundle: larger than $LIMIT_MB MiB" >&2; exit 1; }
