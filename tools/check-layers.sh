#!/usr/bin/env bash
# Fails on any #include under src/ that points up the layer order of docs/ARCHITECTURE.md
# ("Layers": the line `layers: core < deck < ...`). A folder may include itself and the folders
# listed before it, nothing after. Every folder of src/ must be in the order.
# Usage: tools/check-layers.sh [SRC_DIR [ARCHITECTURE_MD]]
set -uo pipefail
cd "$(dirname "$0")/.."
src=${1:-src}
doc=${2:-docs/ARCHITECTURE.md}
order_line=$(grep -m1 -E '^layers: ' "$doc") || { echo "check-layers: no 'layers: ...' line in $doc" >&2; exit 2; }
read -r -a order <<<"$(sed -E 's/^layers: //; s/<//g' <<<"$order_line")"
declare -A rank
for i in "${!order[@]}"; do rank[${order[$i]}]=$i; done
bad=0
for dir in "$src"/*/; do
  d=$(basename "$dir")
  [ -n "${rank[$d]:-}" ] || { echo "check-layers: $src/$d is not in the layer order of $doc"; bad=1; }
done
for f in "$src"/*; do
  [ -f "$f" ] && { echo "check-layers: $f lies outside every layer folder"; bad=1; }
done
while IFS=: read -r file line text; do
  from=${file#"$src"/}; from=${from%%/*}
  to=$(sed -E 's/.*#include "([^/"]+)\/.*/\1/' <<<"$text")
  [ -n "${rank[$from]:-}" ] && [ -n "${rank[$to]:-}" ] || continue
  if [ "${rank[$to]}" -gt "${rank[$from]}" ]; then
    echo "check-layers: $file:$line: $from/ includes $to/, which is above it"
    bad=1
  fi
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include "[^/"]+/' "$src" --include='*.cpp' --include='*.hpp' \
           --include='*.cu' --include='*.cuh' --include='*.def' --include='*.h')
if [ "$bad" -eq 0 ]; then
  echo "check-layers: every include under $src/ points down (${#order[@]} layers)"
fi
exit "$bad"
