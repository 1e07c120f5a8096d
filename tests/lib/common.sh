# shellcheck shell=bash
# Set-up shared by the end-to-end test scripts of tests/scripts/. Sourced, not run: a script does
#   cd "$(dirname "$0")/../.."; source tests/env.sh; source tests/lib/common.sh
# and sets M (the meshmoe binary) itself. It is not a test case: run-tests.sh runs only
# tests/scripts/*.sh. What is here creates directories, data sets and the tiny deck, runs meshmoe,
# and fails; each test's own deck values (what the test is about) stay in its script, as the keys
# it sets on the tiny deck.

# test_dir NAME: sets T to an empty directory $MESHMOE_TEST_TMPDIR/NAME (under a new temporary
# directory when the script runs on its own), removing what an earlier run left there.
test_dir() {
  T=${MESHMOE_TEST_TMPDIR:-$(mktemp -d)}/$1
  rm -rf "$T"; mkdir -p "$T"
}

# tiny_data DIR [TEXT_FILE...]: DIR/data.h5, a small data set made with `meshmoe prep text` from
# the given text files, by default TINY_TEXT: license texts every Debian machine has (base-files),
# ~110 kB that do not change with the repository's sources, so that the tests' training
# trajectories (and the rounding differences between meshes that their tolerances bound) change
# only when the code does. The file names are recorded in the data set, so the same names give the
# same file. Lines are cut into examples of at most 17 tokens (--max-len 17), so that each fits a
# sequence of the tests' model.seq_len >= 16 (+ 1): the batcher drops longer text examples.
TINY_TEXT=(/usr/share/common-licenses/GPL-3 /usr/share/common-licenses/LGPL-2.1
           /usr/share/common-licenses/GFDL-1.3 /usr/share/common-licenses/MPL-1.1)
tiny_data() {
  local dir=$1; shift
  [ $# -gt 0 ] || set -- "${TINY_TEXT[@]}"
  "$M" prep text -q --max-len 17 "$@" -o "$dir/data.h5" >/dev/null
}

# tiny_pairs DIR [N]: DIR/data.h5, a small translation data set made with `meshmoe prep gettext`
# from a generated catalog of N (default 64) pairs of the reverse task: each English msgid is a
# word of 3-6 letters, its "translation" the same letters reversed (language "rv"), so every
# example is `<rv> reversed SEP word EOS` (for model.arch = "encdec"; needs msgfmt).
tiny_pairs() {
  local dir=$1 n=${2:-64}
  mkdir -p "$dir/locale/rv/LC_MESSAGES"
  awk -v n="$n" 'BEGIN { srand(11); printf "msgid \"\"\nmsgstr \"Content-Type: text/plain; charset=UTF-8\\n\"\n";
    for (i = 0; i < n; ++i) { len = 3 + int(rand() * 4); w = ""; for (j = 0; j < len; ++j) w = w sprintf("%c", 97 + int(rand() * 26));
      r = ""; for (j = len; j > 0; --j) r = r substr(w, j, 1); if (w in seen) continue; seen[w] = 1;
      printf "\nmsgid \"%s\"\nmsgstr \"%s\"\n", w, r } }' >"$dir/pairs.po"
  msgfmt -o "$dir/locale/rv/LC_MESSAGES/pairs.mo" "$dir/pairs.po"
  "$M" prep gettext -q --root "$dir/locale" --valid-percent 10 -o "$dir/data.h5" >/dev/null
}

# demo_pairs DIR [long]: DIR/data.h5, a small two-language data set made with `meshmoe prep gettext`
# (20% held out) from generated catalogs: German "Datei N kopiert" / "Ordner N entfernt" and French
# "fichier N copié" for English "copied file N" / "deleted folder N", N = 1..30 (needs msgfmt).
# With `long`, sentences of four and five words ("copied file N to disk" / "Datei N auf Disk
# kopiert", "deleted folder N now" / "Ordner N jetzt entfernt"), so that BLEU has 4-grams to count.
demo_pairs() {
  local dir=$1 de="" fr="" n lang en1="copied file %s" en2="deleted folder %s" de1="Datei %s kopiert"
  local de2="Ordner %s entfernt" fr1="fichier %s copié"
  if [ "${2:-}" = long ]; then
    en1="copied file %s to disk" en2="deleted folder %s now" de1="Datei %s auf Disk kopiert"
    de2="Ordner %s jetzt entfernt" fr1="fichier %s copié sur disque"
  fi
  for n in $(seq 1 30); do
    # shellcheck disable=SC2059
    de+=$(printf "msgid \"$en1\"\nmsgstr \"$de1\"\n\nmsgid \"$en2\"\nmsgstr \"$de2\"" $n $n $n $n)$'\n\n'
    # shellcheck disable=SC2059
    fr+=$(printf "msgid \"$en1\"\nmsgstr \"$fr1\"" $n $n)$'\n\n'
  done
  for lang in de fr; do
    mkdir -p "$dir/locale/$lang/LC_MESSAGES"
    local body=$de
    [ $lang = fr ] && body=$fr
    printf 'msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\n%s' "$body" >"$dir/$lang.po"
    msgfmt -o "$dir/locale/$lang/LC_MESSAGES/demo.mo" "$dir/$lang.po"
  done
  "$M" prep gettext -q --root "$dir/locale" --valid-percent 20 -o "$dir/data.h5" >/dev/null
}

# The tiny MoE deck of the end-to-end tests (two blocks, moe.every = 2, four experts): what
# write_tiny_deck writes before a script's own keys.
TINY_DECK=(run.steps=4 run.log_every=1
           model.seq_len=16 model.d_model=16 model.num_layers=2 model.num_heads=2 model.d_ff=32
           moe.num_experts=4 moe.every=2 moe.group_size=16
           optim.batch_size=8 optim.warmup_steps=2)

# Keys that tests on demo_pairs set alike (write_tiny_deck "$T" "${DECODE_KEYS[@]}" KEY=VALUE...):
# DECODE_KEYS, the decoding tests' model (d_model 32, 4 heads, top-2 with room at evaluation) that
# learns to translate; EXPORT_KEYS, the export tests' (sequences of 48, a constant learning rate).
# shellcheck disable=SC2034  # used by the scripts
DECODE_KEYS=(run.seed=3 model.seq_len=40 model.d_model=32 model.num_heads=4 model.d_ff=64 moe.router=top2
             moe.capacity_factor_eval=4 optim.lr=0.01 optim.warmup_steps=10)
# shellcheck disable=SC2034
EXPORT_KEYS=(model.seq_len=48 model.d_model=32 model.d_ff=64 optim.batch_size=4 optim.lr=1e-2 optim.schedule=constant
             eval.every=0 eval.examples_per_language=5)

# DEVICE_KEYS, the deck of the GPU-path tests on the deferred host device (deferred_device.sh,
# cuda_graphs.sh): 6 steps of a model of d_model 32 and 4 heads with dropout, evaluation at steps 3
# and 6 and a checkpoint at step 3 (where their resumed runs start).
# shellcheck disable=SC2034
DEVICE_KEYS=(run.steps=6 model.d_model=32 model.num_heads=4 model.d_ff=64 model.dropout=0.1 optim.lr=0.003
             eval.every=3 eval.batches=2 checkpoint.every=3)

# write_tiny_deck DIR [SECTION.KEY=VALUE...]: DIR/deck.toml, the TINY_DECK with data.path =
# DIR/data.h5 (tiny_data's) and each SECTION.KEY=VALUE set in order, replacing the key's value or
# adding the key. VALUE is written as TOML reads it: a number, true, false, quoted text or an array
# as it is, other text quoted (as `--set` reads it). A table a section, in the deck's order.
write_tiny_deck() {
  local dir=$1 kv key sec head v order=() sections=(run mesh model moe optim data eval checkpoint distill debug)
  local -A value
  shift
  for kv in "${TINY_DECK[@]}" data.path="$dir/data.h5" "$@"; do
    key=${kv%%=*}
    [[ $kv == *=* && " ${sections[*]} " == *" ${key%%.*} "* && $key == *.?* ]] ||
      fail "write_tiny_deck: '$kv' is not SECTION.KEY=VALUE with one of the sections ${sections[*]}"
    [ -n "${value[$key]+set}" ] || order+=("$key")
    value[$key]=${kv#*=}
  done
  for sec in "${sections[@]}"; do
    head="[$sec]"
    for key in "${order[@]}"; do
      [ "${key%%.*}" = "$sec" ] || continue
      [ -z "$head" ] || { echo "$head"; head=""; }
      v=${value[$key]}
      [[ $v =~ ^[+-]?[0-9][0-9_]*(\.[0-9]+)?([eE][+-]?[0-9]+)?$ || $v =~ ^(true|false)$ || $v =~ ^[\"\'[] ]] ||
        v="\"$v\""
      echo "${key#*.} = $v"
    done
  done >"$dir/deck.toml"
}

# fail MESSAGE...: prints "FAIL: MESSAGE" and ends the test with exit code 1.
fail() { echo "FAIL: $*"; exit 1; }

# train_or_fail NAME NP [ARG...]: `meshmoe train $T/deck.toml` on NP ranks into $T/NAME, output to
# $T/NAME.log, extra arguments (--set ...) after the deck; a run that fails shows its log and fails
# the test.
train_or_fail() {
  local name=$1 np=$2; shift 2
  mpirun -np "$np" "$M" train "$T/deck.toml" --set run.out_dir="$T/$name" "$@" >"$T/$name.log" 2>&1 ||
    { cat "$T/$name.log"; fail "run $name failed"; }
}

# deferred_run NP NAME ACCESS COMMAND [ARG...]: `meshmoe COMMAND $T/deck.toml` on NP ranks into
# $T/NAME, output to $T/NAME.log, extra arguments after the deck, with
# MESHMOE_TEST_DEFERRED_DEVICE=ACCESS: 0 the host path, 1 or copies the deferred host device under
# that access rule (tensor/deferred_device.hpp). A run that fails or passes 300 s shows the end of
# its log and fails the test. train_deferred NP NAME ACCESS [ARG...]: the same for `meshmoe train`.
deferred_run() {
  local np=$1 name=$2 access=$3 command=$4; shift 4
  MESHMOE_TEST_DEFERRED_DEVICE=$access timeout 300 mpirun -np "$np" "$M" "$command" "$T/deck.toml" \
    --set run.out_dir="$T/$name" "$@" >"$T/$name.log" 2>&1 || { tail -20 "$T/$name.log"; fail "run $name"; }
}
train_deferred() { local np=$1 name=$2 access=$3; shift 3; deferred_run "$np" "$name" "$access" train "$@"; }

# Scripts of many cases (one line each, "ok NAME" or "FAIL NAME: why") set failed=0 n=0 and use:
ok() { n=$((n + 1)); echo "ok   $1"; }
bad() { n=$((n + 1)); failed=$((failed + 1)); echo "FAIL $1"; [ -z "${2:-}" ] || tail -n 15 "$2" | sed 's/^/     | /'; }
# run OUT CMD...: CMD with a 60 s limit in a session of its own (nothing outlives a hang); sets rc.
run() {
  local out=$1; shift
  setsid timeout -k 5 60 "$@" </dev/null >"$out" 2>&1
  rc=$?
}
# expect NAME RC REGEX OUT: the last run ended with RC and OUT matches REGEX.
expect() {
  local name=$1 want=$2 re=$3 out=$4
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then bad "$name: hang (killed after 60 s)" "$out"
  elif [ "$rc" != "$want" ]; then bad "$name: exit code $rc, expected $want" "$out"
  elif ! grep -qE -- "$re" "$out"; then bad "$name: no message matching /$re/" "$out"
  else ok "$name"; fi
}
