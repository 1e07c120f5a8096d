#!/usr/bin/env bash
# The OpenBLAS kernels of this machine, for tests that compare floating-point runs: another
# kernel sums a GEMM in another fp32 order, so a bound that holds only for the kernel it was
# written on shows up here instead of on a user's machine (tests/TIERS.md, the second kernel).
#   tools/blas-kernels.sh native   the core OpenBLAS picks on this CPU (e.g. Cooperlake, Haswell)
#   tools/blas-kernels.sh second   a kernel this CPU can run whose summation order differs from the
#                                  native one's: Haswell, or Sandybridge where the native kernel is
#                                  Haswell's own (Haswell, Zen), or Nehalem on a CPU without AVX2
set -euo pipefail
PYTHON=${MESHMOE_PYTHON:-/usr/bin/python3}
corename() {
  "$PYTHON" - <<'PY'
import ctypes
lib = ctypes.CDLL("libopenblas.so.0")
lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())
PY
}
native=$(unset OPENBLAS_CORETYPE; corename)
flags=$(grep -m1 '^flags' /proc/cpuinfo)
case ${1:-} in
  native) echo "$native" ;;
  second)
    if [[ $native == Haswell || $native == Zen ]]; then echo Sandybridge
    elif [[ $flags == *" avx2 "* && $flags == *" fma "* ]]; then echo Haswell
    elif [[ $flags == *" avx "* && $native != Sandybridge ]]; then echo Sandybridge
    else echo Nehalem
    fi ;;
  *) echo "usage: tools/blas-kernels.sh native|second" >&2; exit 2 ;;
esac
