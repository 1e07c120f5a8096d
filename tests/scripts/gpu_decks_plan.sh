#!/usr/bin/env bash
# The real-size GPU decks (bench/decks/gpu-large-*.toml, docs/gpu.md "Decks of real size") fit one
# 80 GB GPU: `meshmoe plan DECK --set run.device=cuda --set run.max_memory=80G` exits 0 and prints
# "the plan fits", and its total equals the figure docs/gpu.md records for the deck (so a change to
# the model's memory, or to a deck, that the document does not follow is seen). A control: the
# dense deck against 20G must print "does NOT fit" (the check can fail). No data set is needed: the
# decks set model.vocab_size.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "gpu_decks_plan: $M not built"; exit 1; }
test_dir gpu_decks_plan
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

decks=(bench/decks/gpu-large-*.toml)
[ ${#decks[@]} -ge 4 ] || bad "expected the four gpu-large decks, found ${decks[*]}"
for deck in "${decks[@]}"; do
  name=$(basename "$deck" .toml)
  out=$T/$name.out
  timeout 60 "$M" plan "$deck" --set run.device=cuda --set run.max_memory=80G >"$out" 2>&1
  rc=$?
  total=$(sed -n 's/^  total *\([0-9.]* GiB\)$/\1/p' "$out")
  echo "$name: exit $rc, total $total; $(grep -E '^available memory' "$out")"
  [ $rc = 0 ] || { bad "$name: plan exit $rc"; cat "$out"; continue; }
  grep -q "^available memory: 80.00 GiB .*: the plan fits$" "$out" || bad "$name: the plan does not fit in 80 GB"
  # docs/gpu.md's row for the deck: | `gpu-large-NAME` | ... | TOTAL | ...
  doc=$(grep -E "^\| \`$name\` \|" docs/gpu.md | head -1)
  [ -n "$doc" ] || { bad "$name: no row in docs/gpu.md's table of the real-size decks"; continue; }
  grep -qF "| $total |" <<<"$doc" || bad "$name: plan's total $total differs from docs/gpu.md: $doc"
done

timeout 60 "$M" plan bench/decks/gpu-large-dense.toml --set run.device=cuda --set run.max_memory=20G >"$T/control.out" 2>&1
grep -q "the plan does NOT fit" "$T/control.out" || bad "control: the dense deck against 20G was not refused: $(tail -1 "$T/control.out")"

[ $fails = 0 ] && echo "gpu_decks_plan: ok (${#decks[@]} decks fit 80 GB)" || { echo "gpu_decks_plan: $fails failures"; exit 1; }
