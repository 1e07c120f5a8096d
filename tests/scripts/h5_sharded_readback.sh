#!/usr/bin/env bash
# A file written by 4 ranks with uneven (one empty) row blocks, read back by h5py and compared
# exactly with numpy's rebuild of the same arrays (also with Fletcher32 chunks).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
MESHMOE_TESTS=${MESHMOE_TESTS:-$PWD/build/meshmoe_tests}
own_tmp=
if [ -z "${MESHMOE_TEST_TMPDIR:-}" ]; then own_tmp=$(mktemp -d /tmp/meshmoe-h5.XXXXXX); MESHMOE_TEST_TMPDIR=$own_tmp; fi
export MESHMOE_TEST_TMPDIR
trap '[ -n "$own_tmp" ] && rm -rf "$own_tmp"; rm -f "$MESHMOE_TEST_TMPDIR"/sharded.h5 "$MESHMOE_TEST_TMPDIR"/sharded_fletcher32.h5' EXIT
rm -f "$MESHMOE_TEST_TMPDIR"/sharded.h5 "$MESHMOE_TEST_TMPDIR"/sharded_fletcher32.h5
timeout 300 mpirun -np 4 "$MESHMOE_TESTS" "[h5-export]"
${PYTHON:-/usr/bin/python3} tests/scripts/h5_readback.py "$MESHMOE_TEST_TMPDIR" 4
