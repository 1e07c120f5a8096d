#!/usr/bin/env bash
# Every example deck in inputs/ is valid: `meshmoe plan` accepts it on the rank count its mesh asks for.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
M=${MESHMOE:-build/meshmoe}
for deck in inputs/*.toml; do
  np=$($PYTHON -c "import sys, tomllib; m = tomllib.load(open(sys.argv[1], 'rb')).get('mesh', {}); print(m.get('pipe', 1) * m.get('data', 1) * m.get('tensor', 1))" "$deck")
  if ! out=$(timeout 60 mpirun -np "$np" $M plan "$deck" 2>&1); then
    echo "$out"; echo "FAIL: $deck on $np ranks"; exit 1
  fi
  echo "ok: $deck on $np ranks"
done
