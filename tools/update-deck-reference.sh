#!/usr/bin/env bash
# Replaces the deck reference in docs/deck-reference.md (the lines between
# <!-- deck-reference:begin --> and <!-- deck-reference:end -->) with the output of
# `$BUILD/meshmoe deck-doc`. 
#   tools/update-deck-reference.sh           rewrite docs/deck-reference.md (`make deck-reference`)
#   tools/update-deck-reference.sh --check   exit 1 and print the diff when docs/deck-reference.md is out of date
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
M=${MESHMOE:-$BUILD/meshmoe}
DOC=docs/deck-reference.md
BEGIN='<!-- deck-reference:begin -->'
END='<!-- deck-reference:end -->'

[ -x "$M" ] || { echo "update-deck-reference: $M not built (make BUILD=$BUILD $BUILD/meshmoe)" >&2; exit 1; }
[ -f "$DOC" ] || { echo "update-deck-reference: $DOC not found" >&2; exit 1; }
for marker in "$BEGIN" "$END"; do
  n=$(grep -cxF "$marker" "$DOC" || true)
  [ "$n" = 1 ] || { echo "update-deck-reference: $DOC must contain the line '$marker' exactly once (found $n)" >&2; exit 1; }
done
[ "$(grep -nxF "$BEGIN" "$DOC" | cut -d: -f1)" -lt "$(grep -nxF "$END" "$DOC" | cut -d: -f1)" ] ||
  { echo "update-deck-reference: '$BEGIN' must come before '$END' in $DOC" >&2; exit 1; }

# Root is allowed to run the MPI singleton (deck-doc needs no mpirun).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$M" deck-doc >"$tmp/ref.md"
# The blank lines keep the generated markdown apart from the markers.
awk -v begin="$BEGIN" -v end="$END" -v ref="$tmp/ref.md" '
  $0 == begin { print; print ""; while ((getline line < ref) > 0) print line; print ""; skip = 1; next }
  $0 == end   { skip = 0 }
  !skip       { print }
' "$DOC" >"$tmp/doc.md"

if [ "${1:-}" = "--check" ]; then
  if ! diff -u "$DOC" "$tmp/doc.md"; then
    echo "$DOC: the deck reference is out of date with \`meshmoe deck-doc\`; run \`make deck-reference\`" >&2
    exit 1
  fi
  echo "$DOC: deck reference is up to date"
else
  cat "$tmp/doc.md" >"$DOC"
  echo "$DOC: deck reference updated from $M deck-doc"
fi
