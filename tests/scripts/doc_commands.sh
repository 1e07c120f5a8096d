#!/usr/bin/env bash
# Every command the manual shows runs (README.md and docs/*.md; tests/scripts/doc_commands.py says
# how they are found, shrunk and skipped): the count found equals the count run plus the count
# skipped with a reason (GPU, Slurm, the build itself), and every one that runs exits 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "doc_commands: $M not built"; exit 1; }
test_dir doc_commands
# The manual's mpirun lines run as they are: more ranks than cores (tests/env.sh).
/usr/bin/python3 tests/scripts/doc_commands.py "$PWD" "$M" "$T/sandbox" || {
  echo "(the commands' output: $T/sandbox/commands.log)"; tail -n 40 "$T/sandbox/commands.log"; exit 1; }
