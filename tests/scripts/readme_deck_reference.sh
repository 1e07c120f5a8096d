#!/usr/bin/env bash
# README.md's deck reference must equal `meshmoe deck-doc` (else: run `make readme`).
set -euo pipefail
cd "$(dirname "$0")/../.."
export MESHMOE=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
tools/update-readme.sh --check
