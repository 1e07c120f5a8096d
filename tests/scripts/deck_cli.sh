#!/usr/bin/env bash
# The deck from the command line: bad decks and bad --set values exit 2 with the message printed
# once (rank 0), quickly and without a hang; a wrong rank count for the mesh exits 2 naming both
# numbers; deck-doc prints every section.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "deck_cli: $M not built"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# run NAME SECONDS CMD...: runs CMD with a time limit; stdout/stderr/rc land in $tmp/NAME.*
run() {
  local name=$1 secs=$2; shift 2
  timeout "$secs" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  echo $? >"$tmp/$name.rc"
  echo "-- $name: exit $(cat "$tmp/$name.rc")"; sed 's/^/   stderr: /' "$tmp/$name.err" | head -20
}
expect_rc() { [ "$(cat "$tmp/$1.rc")" = "$2" ] || fail "$1: exit $(cat "$tmp/$1.rc"), expected $2"; }
# expect_once NAME TEXT: TEXT appears on exactly one line of stderr
expect_once() {
  local n
  n=$(grep -cF -- "$2" "$tmp/$1.err")
  [ "$n" = 1 ] || fail "$1: expected exactly one stderr line with '$2', found $n"
}

# 1. A bad deck on 2 ranks: exit 2, the located message once, well before any timeout.
start=$(date +%s)
run bad_deck 20 mpirun -np 2 "$M" train tests/decks/bad/unknown_key.toml
expect_rc bad_deck 2
expect_once bad_deck "tests/decks/bad/unknown_key.toml:7:1: moe.experts: unknown key; did you mean moe.num_experts?"
[ $(( $(date +%s) - start )) -le 15 ] || fail "bad_deck: took more than 15 s"

# 2. Every error of a deck at once, each line once.
run many_errors 20 mpirun -np 2 "$M" train tests/decks/bad/many_errors.toml
expect_rc many_errors 2
for t in "run.nmae: unknown key" "run.log_every: out of range" "moe.num_experts: expected an integer" \
         "moe.router: must be one of top1, top2, topk" "[optimizer]: unknown section"; do
  expect_once many_errors "$t"
done

# 3. A bad --set value on a good deck.
run bad_set 20 mpirun -np 2 "$M" train tests/decks/good/empty.toml --set moe.num_experts=eight
expect_rc bad_set 2
expect_once bad_set "--set moe.num_experts=eight: moe.num_experts: expected an integer"
run bad_set_key 20 mpirun -np 2 "$M" plan tests/decks/good/empty.toml --set moe.experts=4
expect_rc bad_set_key 2
expect_once bad_set_key "did you mean moe.num_experts?"

# 4. A missing deck file is named.
run missing 20 mpirun -np 2 "$M" train "$tmp/no-such-deck.toml"
expect_rc missing 2
expect_once missing "no-such-deck.toml: cannot read the input deck"

# 5. A 2x2 mesh launched on 3 ranks: exit 2 within 10 s, both numbers named, once.
run wrong_np 10 mpirun -np 3 "$M" plan tests/decks/good/switch_2x2.toml
expect_rc wrong_np 2
expect_once wrong_np "= 4 ranks, but the job has 3 ranks"
# The same deck with --set fixing the mesh to the launch passes the world-size check.
run wrong_np_fixed 10 mpirun -np 3 "$M" plan tests/decks/good/switch_2x2.toml --set mesh.data=3 --set mesh.tensor=1 \
  --set moe.num_experts=3 --set optim.batch_size=6
grep -q "but the job has" "$tmp/wrong_np_fixed.err" && fail "wrong_np_fixed: world-size error despite a matching mesh"

# 6. deck-doc: exit 0, every section and a table header per section.
run deck_doc 20 "$M" deck-doc
expect_rc deck_doc 0
for s in run mesh model moe optim data eval checkpoint debug; do
  grep -qxF "### [$s]" "$tmp/deck_doc.out" || fail "deck_doc: no section [$s]"
done
[ "$(grep -c '^| key | type | default | allowed | meaning |$' "$tmp/deck_doc.out")" = 10 ] || fail "deck_doc: expected 10 tables (one per section)"

echo "deck_cli: $fails failure(s)"
[ "$fails" = 0 ]
