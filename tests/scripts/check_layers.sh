#!/usr/bin/env bash
# The layer order of src/ (docs/ARCHITECTURE.md "Layers"): tools/check-layers.sh passes on the tree
# and fails, naming the file, the line and both folders, on a copy of the tree with one planted
# upward include (model/ including train/), on a folder missing from the order, and on a source
# file outside every folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/lib/common.sh
test_dir check_layers
tools/check-layers.sh >"$T/tree.out" 2>&1 || { cat "$T/tree.out"; fail "the tree has an upward include"; }
grep -q "every include under src/ points down" "$T/tree.out" || fail "no verdict: $(cat "$T/tree.out")"

cp -r src "$T/src"
f=$T/src/model/embedding.cpp
line=$(( $(grep -n '^#include' "$f" | tail -1 | cut -d: -f1) + 1 ))
sed -i "${line}i #include \"train/trainer.hpp\"" "$f"
if tools/check-layers.sh "$T/src" >"$T/up.out" 2>&1; then fail "a planted upward include passed: $(cat "$T/up.out")"; fi
grep -qF "$T/src/model/embedding.cpp:$line: model/ includes train/, which is above it" "$T/up.out" ||
  fail "the upward include is not named: $(cat "$T/up.out")"
[ "$(grep -c 'check-layers: ' "$T/up.out")" = 1 ] || fail "more than the planted include reported: $(cat "$T/up.out")"

sed -i "${line}d" "$f"
tools/check-layers.sh "$T/src" >/dev/null 2>&1 || fail "the copy without the planted include fails"
mkdir "$T/src/extra"
if tools/check-layers.sh "$T/src" >"$T/dir.out" 2>&1; then fail "a folder outside the order passed"; fi
grep -qF "$T/src/extra is not in the layer order" "$T/dir.out" || fail "the new folder is not named: $(cat "$T/dir.out")"
rmdir "$T/src/extra"
touch "$T/src/loose.cpp"
if tools/check-layers.sh "$T/src" >"$T/file.out" 2>&1; then fail "a file outside every folder passed"; fi
grep -qF "$T/src/loose.cpp lies outside every layer folder" "$T/file.out" || fail "the loose file is not named: $(cat "$T/file.out")"
echo "ok: the tree passes; an upward include, an unknown folder and a loose file each fail, named"
