#!/usr/bin/env bash
# docs/deck-reference.md's deck reference must equal `meshmoe deck-doc` (else: run `make deck-reference`).
set -euo pipefail
cd "$(dirname "$0")/../.."
export MESHMOE=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
tools/update-deck-reference.sh --check
