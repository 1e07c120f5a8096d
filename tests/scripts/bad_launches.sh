#!/usr/bin/env bash
# Bad launches and inputs. Each case runs under `mpirun -np 4` (or the rank count
# the case needs) and must end
#   - with the documented exit code (docs/user-guide.md "Exit codes": 2 for input errors: deck, command line,
#     rank count, data file; a checkpoint that cannot be read or written is an InputError too,
#     src/train/checkpoint.hpp),
#   - with a clear message (the regular expression given with the case),
#   - within 30 s (timeout 30: a hang fails), without a crash (no "exited on signal") and without a
#     core file (ulimit -c 0, and none may appear in the working or run directory),
#   - leaving existing checkpoints untouched (sha256 of the reference run's ckpt/ and metrics.h5
#     before and after; most cases point run.out_dir at that run).
# One line per case, "ok NAME" or "FAIL NAME: why"; exit 1 when any case failed.
# The output-disk-full case uses a 1.2 MB tmpfs (mount needs root), else `ulimit -f`; the
# unwritable-directory cases use a path under a regular file and, when mount works, a read-only
# tmpfs (permissions do not stop root).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=$(realpath "${MESHMOE:-build/meshmoe}")
mounts=()
cleanup() { for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || true; done; }
trap cleanup EXIT
test_dir bad-launches
ulimit -c 0

# ---- fixtures -------------------------------------------------------------------------------
tiny_data "$T" "$PWD"/src/model/*.cpp
write_tiny_deck "$T" run.name=bad run.seed=3 mesh.data=4 eval.every=0 checkpoint.every=2 \
  checkpoint.keep_last=3
D="$T/deck.toml"
REF="$T/ref"  # a finished run with checkpoints at steps 2 and 4: must never change
train_or_fail ref 4 --set mesh.data=4
train_or_fail wide 1 --set mesh.data=1 --set model.d_model=32 --set run.steps=2           # incompatible model (d_model)
train_or_fail experts8 1 --set mesh.data=1 --set moe.num_experts=8 --set run.steps=2      # incompatible model (experts)
train_or_fail adafactor 1 --set mesh.data=1 --set optim.name=adafactor --set run.steps=2  # other optimizer state
C4="$REF/ckpt/step_00000004.h5"
[ -s "$C4" ] || fail "no reference checkpoint"
$PYTHON - "$T" "$C4" <<'PY'
import sys, os, shutil, h5py, numpy as np
T, c4 = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(1)
open(f"{T}/empty.h5", "wb").close()
open(f"{T}/garbage.h5", "wb").write(rng.integers(0, 256, 8192, dtype=np.uint8).tobytes())
raw = open(f"{T}/data.h5", "rb").read()
open(f"{T}/truncated.h5", "wb").write(raw[: len(raw) // 2])
shutil.copy(f"{T}/data.h5", f"{T}/novalid.h5")
with h5py.File(f"{T}/novalid.h5", "a") as f:
    del f["valid"]
shutil.copy(c4, f"{T}/corrupt_ckpt.h5")  # one byte flipped inside a parameter's chunk
with h5py.File(c4, "r") as f:
    off = f["params/blocks.0.attn.wq"].id.get_chunk_info(0).byte_offset
with open(f"{T}/corrupt_ckpt.h5", "r+b") as g:
    g.seek(off + 8); b = g.read(1); g.seek(off + 8); g.write(bytes([b[0] ^ 0xFF]))
raw = open(c4, "rb").read()
open(f"{T}/truncated_ckpt.h5", "wb").write(raw[: len(raw) * 2 // 3])
PY
mkdir -p "$T/a_directory"
printf 'hello\n' > "$T/text.txt"
printf 'steps = 5\n' > "$T/plain_file"

# The checkpoints and metrics, not ckpt/.run.lock (the lock a run takes on its checkpoint directory,
# rewritten by every start as run.lock is).
sums() { (cd "$REF" && find ckpt metrics.h5 -type f ! -name .run.lock | sort | xargs sha256sum); }

# ---- the case runner ------------------------------------------------------------------------
# run_limited OUT FSIZE_KIB CMD...: CMD in $T/cwd, 30 s at most, in a session of its own so that
# nothing of it (ranks included) outlives a hang; sets $rc.
run_limited() {
  local out=$1 fsize=$2; shift 2
  set +e
  (cd "$T/cwd" && { [ -z "$fsize" ] || ulimit -f "$fsize"; } && exec setsid timeout -k 5 30 "$@") </dev/null >"$out" 2>&1 &
  local job=$!
  wait $job
  rc=$?
  set -e
  local left
  left=$(ps -eo pid=,sid=,stat= | awk -v s=$job '$2 == s && $3 !~ /^Z/ { print $1 }')
  [ -z "$left" ] || { kill -9 $left 2>/dev/null || true; echo "(killed processes left behind: "$left")" >>"$out"; }
}
show() { { grep -E "meshmoe|rror|Run with" "$1" || true; } | grep -v '^ *\(#\|\[\)' | head -4 | cut -c1-300 | sed 's/^/     | /'; }
n=0 failed=0
check() {  # name expected-exit-code message-regex np meshmoe-args...
  local name=$1 want=$2 msg=$3 np=$4; shift 4
  n=$((n + 1))
  local out="$T/case$n.out" before after rc why=() t0=$SECONDS
  before=$(sums)
  rm -rf "$T/cwd"; mkdir -p "$T/cwd"
  run_limited "$out" "" mpirun -np "$np" "$M" "$@"
  if [ $rc = 124 ] || [ $rc = 137 ]; then why+=("hang: killed after 30 s"); elif [ $rc != "$want" ]; then why+=("exit code $rc, expected $want"); fi
  grep -qE -- "$msg" "$out" || why+=("no message matching /$msg/")
  grep -qE "exited on signal|Segmentation fault|core dumped" "$out" && why+=("crashed")
  [ -z "$(find "$T/cwd" "$REF" -name 'core*' -type f)" ] || why+=("core file")
  after=$(sums)
  [ "$before" = "$after" ] || why+=("existing checkpoints changed")
  if [ ${#why[@]} = 0 ]; then
    echo "ok   $name ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1))
    echo "FAIL $name: $(IFS=';'; echo "${why[*]}")"
    echo "     command: mpirun -np $np $M $*"
    show "$out"
  fi
}
train() { echo train "$D" --set run.out_dir="$REF" "$@"; }  # prints the args of a train on REF
E="meshmoe: error:"

echo "== command line"
check "no subcommand"            2 "subcommand is required"            4
check "unknown subcommand"       2 "trian"                              4 trian "$D"
check "train without a deck"    2 "deck is required"                   4 train
check "unknown option"           2 "--bogus"                            4 $(train) --bogus
check "--set without a value"    2 "--set"                              4 train "$D" --set
check "ckpt without an action"   2 "subcommand is required"             4 ckpt
check "ckpt verify without path" 2 "path is required"                   4 ckpt verify
check "prep text without -o"     2 "output is required"                 4 prep text "$T/text.txt"
check "deck file missing"        2 "$E .*nonexistent.toml"              4 train "$T/nonexistent.toml"
check "deck is a directory"      2 "$E .*a_directory"                   4 train "$T/a_directory"
check "deck is binary garbage"   2 "$E .*garbage.h5"                    4 train "$T/garbage.h5"

echo "== --set overrides"
check "--set without ="          2 "$E --set run.steps: "               4 $(train) --set run.steps
check "--set unknown key"        2 "$E --set run.stepz=3: run.stepz: unknown key; did you mean run.steps" 4 $(train) --set run.stepz=3
check "--set unknown section"    2 "$E --set foo.bar=1: .*unknown section"  4 $(train) --set foo.bar=1
check "--set bad type"           2 "$E --set run.steps=ten: run.steps: expected an integer" 4 $(train) --set run.steps=ten
check "--set out of range"       2 "$E --set run.steps=-1: run.steps: out of range" 4 $(train) --set run.steps=-1
check "--set cross-key"          2 "$E .*model.num_heads"               4 $(train) --set model.num_heads=3
check "--set bad choice"         2 "$E --set optim.name=sgd: optim.name: must be one of adamw, adafactor" 4 $(train) --set optim.name=sgd

echo "== deck files (a sample of tests/decks/bad; every '# expect:' line of each)"
# (deck_cli.sh runs all of them on one rank; here: each kind of deck error, under 4 ranks)
for k in unknown_key int_got_string range_ge1 heads_not_dividing_dmodel syntax_unterminated_string many_errors \
         set_bad_value set_cross_key; do
  f=tests/decks/bad/$k.toml
  sets=()
  while IFS= read -r s; do sets+=(--set "$s"); done < <(sed -n 's/^# set: //p' "$f")
  want=$(sed -n 's/^# expect: //p' "$f" | head -1)
  # Every expected line must be there: the regex is the first one (escaped); the rest checked below.
  re=$(printf '%s' "$want" | sed 's/[][\.*^$?+(){}|]/\\&/g')
  check "deck $(basename "$f" .toml)" 2 "$re" 4 train "$PWD/$f" "${sets[@]}"
  while IFS= read -r w; do
    grep -qF -- "$w" "$T/case$n.out" || { failed=$((failed + 1)); echo "FAIL deck $(basename "$f" .toml): missing '$w'"; }
  done < <(sed -n 's/^# expect: //p' "$f")
done

echo "== launch"
check "wrong rank count (4 ranks, mesh 1x2x1)" 2 "$E .*(4|2).*(rank|mesh)" 4 $(train) --set mesh.data=2
check "wrong rank count (2 ranks, mesh 1x4x1)" 2 "$E .*(4|2).*(rank|mesh)" 2 $(train)
check "wrong rank count (3 ranks, mesh 2x2x1)" 2 "$E .*(3|4).*(rank|mesh)" 3 $(train) --set mesh.pipe=2 --set mesh.data=2 --set optim.micro_batches=2
check "empty deck (default data path missing)" 2 "$E .*data/gettext.h5" 1 train "$PWD/tests/decks/good/empty.toml"
# CUDA_VISIBLE_DEVICES= hides every GPU, so this holds on GPU machines too.
CUDA_VISIBLE_DEVICES= check "run.device = cuda, no GPU visible" 2 \
  "$E run.device = \"cuda\": rank 0 on .*: (no CUDA device is visible|this meshmoe was built without CUDA)" 4 $(train) --set run.device=cuda

echo "== data file"
check "data file missing"          2 "$E .*nothere.h5"       4 $(train) --set data.path="$T/nothere.h5"
check "data file empty"            2 "$E .*empty.h5"         4 $(train) --set data.path="$T/empty.h5"
check "data file corrupt (random)" 2 "$E .*garbage.h5"       4 $(train) --set data.path="$T/garbage.h5"
check "data file truncated"        2 "$E .*truncated.h5"     4 $(train) --set data.path="$T/truncated.h5"
check "data file is a metrics.h5"  2 "$E .*metrics.h5"       4 $(train) --set data.path="$REF/metrics.h5"
check "data file is a checkpoint"  2 "$E .*step_00000004.h5" 4 $(train) --set data.path="$C4"
check "data file without /valid"   2 "$E .*novalid.h5"       4 $(train) --set data.path="$T/novalid.h5"
check "data path is a directory"   2 "$E .*a_directory: (.*is a directory|.*not a (regular )?file)" 4 $(train) --set data.path="$T/a_directory"
check "data file is text"          2 "$E .*text.txt"         4 $(train) --set data.path="$T/text.txt"
check "data path empty"            2 "$E .*data\.path"       4 $(train) --set data.path=

echo "== checkpoint to resume from"
check "resume: incompatible model (d_model 32)" 2 "$E .*incompatible model"  4 $(train) --set run.resume="$T/wide/ckpt/step_00000002.h5"
check "resume: incompatible model (8 experts)"  2 "$E .*incompatible model"  4 $(train) --set run.resume="$T/experts8/ckpt/step_00000002.h5"
check "resume: other optimizer's state"         2 "$E .*holds adafactor state" 4 $(train) --set run.resume="$T/adafactor/ckpt/step_00000002.h5"
check "resume: missing file"                    2 "$E .*nothere_ckpt.h5"     4 $(train) --set run.resume="$T/nothere_ckpt.h5"
check "resume: typo 'Auto' (taken as a path)"   2 "$E .*Auto"                4 $(train) --set run.resume=Auto
check "resume: corrupt checkpoint"              2 "$E .*corrupt_ckpt.h5"     4 $(train) --set run.resume="$T/corrupt_ckpt.h5"
check "resume: truncated checkpoint"            2 "$E .*truncated_ckpt.h5"   4 $(train) --set run.resume="$T/truncated_ckpt.h5"
check "resume: a metrics.h5"                    2 "$E .*metrics.h5"          4 $(train) --set run.resume="$REF/metrics.h5"
check "resume: a text file"                     2 "$E .*text.txt"            4 $(train) --set run.resume="$T/text.txt"
check "resume: step beyond run.steps"           2 "$E .*beyond run.steps"    4 $(train) --set run.resume="$C4" --set run.steps=3
check "resume auto: run.steps below the newest checkpoint" 2 "$E .*beyond run.steps" 4 $(train) --set run.steps=3

echo "== output directory"
check "out_dir under a regular file" 2 "$E .*cannot write the run directory .*plain_file/run" 4 train "$D" --set run.out_dir="$T/plain_file/run"
check "out_dir is a regular file"    2 "$E .*cannot write the run directory .*plain_file" 4 train "$D" --set run.out_dir="$T/plain_file"
check "out_dir under /etc/hostname"  2 "$E .*cannot write the run directory /etc/hostname/run" 4 train "$D" --set run.out_dir=/etc/hostname/run
mkdir -p "$T/nockpt"; printf 'x' > "$T/nockpt/ckpt"
check "ckpt/ is a regular file"      2 "$E .*checkpoint" 4 train "$D" --set run.out_dir="$T/nockpt"
can_mount=0
mkdir -p "$T/ro" "$T/full"
if mount -t tmpfs -o ro,size=64k tmpfs "$T/ro" 2>/dev/null; then
  can_mount=1; mounts+=("$T/ro")
  check "out_dir on a read-only file system" 2 "$E .*cannot write the run directory .*ro/run" 4 train "$D" --set run.out_dir="$T/ro/run"
else
  echo "(mount not permitted: no read-only file system case)"
fi

echo "== output disk full"
# A file system with room for deck.toml, metrics.h5 and the checkpoints of steps 1 and 2 (~0.4 MB
# each), and for the copy of metrics.h5 a resume makes (~0.2 MB, freed once it has continued the
# file), but not for step 3's checkpoint: the run must stop with a message, and steps 1 and 2 stay
# good.
FULL="$T/full/run"
if [ $can_mount = 1 ] && mount -t tmpfs -o size=1350k tmpfs "$T/full"; then
  mounts+=("$T/full")
  mpirun -np 4 "$M" train "$D" --set run.out_dir="$FULL" --set run.steps=2 --set checkpoint.every=1 >"$T/full-fill.log" 2>&1 ||
    { tail "$T/full-fill.log"; fail "could not fill the small file system"; }
  limit=""
else
  limit=200  # KiB per file (ulimit -f): a checkpoint (~400 KiB) cannot be written (SIGXFSZ or EFBIG)
  mpirun -np 4 "$M" train "$D" --set run.out_dir="$FULL" --set run.steps=2 --set checkpoint.every=1 >"$T/full-fill.log" 2>&1
fi
full_sums() { (cd "$FULL/ckpt" && sha256sum step_00000001.h5 step_00000002.h5 LATEST); }
fb=$(full_sums)
n=$((n + 1)); t0=$SECONDS; why=()
run_limited "$T/case$n.out" "$limit" mpirun -np 4 "$M" train "$D" --set run.out_dir="$FULL" --set run.steps=20 --set checkpoint.every=1 --set checkpoint.keep_last=10
# A rank failing inside the collective checkpoint write cannot be agreed on: it names the reason
# and aborts the job (docs/user-guide.md "Exit codes": 1).
if [ $rc = 124 ] || [ $rc = 137 ]; then why+=("hang: killed after 30 s"); elif [ $rc != 1 ]; then why+=("exit code $rc, expected 1"); fi
grep -qE "meshmoe: rank [0-9]+: fatal: cannot write checkpoint .*(No space left|File size limit|too large|write failed|H5)" "$T/case$n.out" ||
  grep -qE "$E .*cannot write checkpoint" "$T/case$n.out" || why+=("no message 'cannot write checkpoint'")
grep -qE "exited on signal|Segmentation fault|core dumped" "$T/case$n.out" && why+=("crashed")
[ "$fb" = "$(full_sums)" ] || why+=("existing checkpoints changed")
for s in 1 2; do "$M" ckpt verify "$FULL/ckpt/step_0000000$s.h5" >/dev/null 2>&1 || why+=("step $s checkpoint no longer verifies"); done
if [ ${#why[@]} = 0 ]; then echo "ok   disk full during a checkpoint write ($((SECONDS - t0)) s)"; else
  failed=$((failed + 1)); echo "FAIL disk full during a checkpoint write: $(IFS=';'; echo "${why[*]}")"
  echo "     command: $([ -n "$limit" ] && echo "ulimit -f $limit;" || echo "mount -t tmpfs -o size=1200k tmpfs DIR;") mpirun -np 4 $M train $D --set run.out_dir=DIR/run --set run.steps=2 --set checkpoint.every=1; then again with --set run.steps=20 --set checkpoint.keep_last=10"
  show "$T/case$n.out"
fi

echo
echo "$n cases, $failed failed"
[ "$failed" = 0 ]
