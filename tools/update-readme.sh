#!/usr/bin/env bash
# Replaces the deck reference in README.md (the lines between <!-- deck-reference:begin --> and
# <!-- deck-reference:end -->) with the output of `$BUILD/meshmoe deck-doc`.
#   tools/update-readme.sh           rewrite README.md (`make readme`)
#   tools/update-readme.sh --check   exit 1 and print the diff when README.md is out of date
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
M=${MESHMOE:-$BUILD/meshmoe}
README=README.md
BEGIN='<!-- deck-reference:begin -->'
END='<!-- deck-reference:end -->'

[ -x "$M" ] || { echo "update-readme: $M not built (make BUILD=$BUILD $BUILD/meshmoe)" >&2; exit 1; }
[ -f "$README" ] || { echo "update-readme: $README not found" >&2; exit 1; }
for marker in "$BEGIN" "$END"; do
  n=$(grep -cxF "$marker" "$README" || true)
  [ "$n" = 1 ] || { echo "update-readme: $README must contain the line '$marker' exactly once (found $n)" >&2; exit 1; }
done
[ "$(grep -nxF "$BEGIN" "$README" | cut -d: -f1)" -lt "$(grep -nxF "$END" "$README" | cut -d: -f1)" ] ||
  { echo "update-readme: '$BEGIN' must come before '$END' in $README" >&2; exit 1; }

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
' "$README" >"$tmp/README.md"

if [ "${1:-}" = "--check" ]; then
  if ! diff -u "$README" "$tmp/README.md"; then
    echo "README.md: the deck reference is out of date with \`meshmoe deck-doc\`; run \`make readme\`" >&2
    exit 1
  fi
  echo "README.md deck reference is up to date"
else
  cat "$tmp/README.md" >"$README"
  echo "README.md: deck reference updated from $M deck-doc"
fi
