#!/usr/bin/env bash
# One rule for naming a checkpoint on the command line (docs/user-guide.md "Naming a checkpoint"): `generate --checkpoint`
# (decode_cli, like translate and eval), `distill --teacher` and `train --init-from` each take a
# checkpoint file, a checkpoint directory (its LATEST) or a run directory (its ckpt/LATEST), on 1
# and 2 ranks: each form names the same file (printed in the init and teacher lines) and
# generates the same text. Refusals, exit 2 on every rank with what was looked for: a missing
# path, a directory without LATEST or ckpt/LATEST, a LATEST naming a file that is gone, and a
# relative path that rank 0 sees but rank 1 (another working directory) does not.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "ckpt_paths: $M not built"; exit 1; }
test_dir ckpt_paths
tiny_data "$T"
cp tests/decks/good/distill_switch.toml "$T/deck.toml"
common=(--set data.path="$T/data.h5" --set moe.every=0 --set eval.every=0)
train_or_fail src 1 "${common[@]}" --set run.steps=3
RUN=$T/src
FILE=$RUN/ckpt/step_00000003.h5
[ -f "$FILE" ] || { ls -lR "$RUN"; fail "$FILE not written"; }
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# run_ok NAME NP ARGS...: meshmoe ARGS on NP ranks, exit 0 wanted; output in $T/NAME.log.
run_ok() {
  local name=$1 np=$2; shift 2
  timeout 120 mpirun -np "$np" "$M" "$@" >"$T/$name.log" 2>&1
  local rc=$?
  [ "$rc" = 0 ] || { cat "$T/$name.log"; bad "$name: exit $rc"; return 1; }
}
# refused NAME NP WANT ARGS...: exit 2 with the text WANT wanted (and no hang).
refused() {
  local name=$1 np=$2 want=$3; shift 3
  timeout 60 mpirun -np "$np" "$M" "$@" >"$T/$name.log" 2>&1
  local rc=$?
  if [ "$rc" = 2 ] && grep -qF -- "$want" "$T/$name.log"; then
    echo "ok   $name refused: $(grep -m1 -F -- "$want" "$T/$name.log")"
  else
    cat "$T/$name.log"
    bad "$name: exit $rc, wanted 2 and '$want'"
  fi
}

for np in 1 2; do
  mesh=(--set mesh.data=$np)
  before=$fails
  for form in file ckptdir rundir; do
    case $form in file) P=$FILE ;; ckptdir) P=$RUN/ckpt ;; rundir) P=$RUN ;; esac
    tag=np$np.$form
    if run_ok "$tag.init" "$np" train "$T/deck.toml" "${common[@]}" "${mesh[@]}" --set run.steps=1 \
        --set run.out_dir="$T/$tag.init" --init-from "$P"; then
      grep -qF "init from $FILE: " "$T/$tag.init.log" || { cat "$T/$tag.init.log"; bad "$tag: no init line naming $FILE"; }
    fi
    if run_ok "$tag.distill" "$np" distill "$T/deck.toml" "${common[@]}" "${mesh[@]}" --set run.steps=1 \
        --set run.out_dir="$T/$tag.distill" --teacher "$P" --baseline "$P"; then
      grep -qF "distill: teacher $FILE " "$T/$tag.distill.log" || { cat "$T/$tag.distill.log"; bad "$tag: no teacher line naming $FILE"; }
    fi
    run_ok "$tag.gen" "$np" generate "$T/deck.toml" "${common[@]}" "${mesh[@]}" --checkpoint "$P" --prompt "The " --max-new 4 &&
      { [ -s "$T/$tag.gen.log" ] || bad "$tag: generate printed nothing"; }
    cmp -s "$T/np1.file.gen.log" "$T/$tag.gen.log" || bad "$tag: generate differs from np1.file's"
  done
  [ "$fails" = "$before" ] && echo "ok   np=$np: --init-from, --teacher/--baseline, --checkpoint take the file, the ckpt dir, the run dir"

  refused "np$np.missing.init" "$np" "--init-from $T/nowhere: no such file or directory" \
    train "$T/deck.toml" "${common[@]}" "${mesh[@]}" --set run.out_dir="$T/np$np.missing" --init-from "$T/nowhere"
  mkdir -p "$T/empty"
  refused "np$np.empty.teacher" "$np" "--teacher $T/empty: a directory without LATEST (nor ckpt/LATEST): looked for $T/empty/LATEST and $T/empty/ckpt/LATEST" \
    distill "$T/deck.toml" "${common[@]}" "${mesh[@]}" --set run.out_dir="$T/np$np.empty" --teacher "$T/empty"
  refused "np$np.empty.gen" "$np" "--checkpoint $T/empty: a directory without LATEST" \
    generate "$T/deck.toml" "${common[@]}" "${mesh[@]}" --checkpoint "$T/empty" --prompt "The "
done

# LATEST naming a checkpoint that is gone.
mesh=(--set mesh.data=2)
mkdir -p "$T/gone/ckpt"
echo step_00000009.h5 >"$T/gone/ckpt/LATEST"
refused gone 2 "--init-from $T/gone/ckpt/LATEST names step_00000009.h5, which does not exist" \
  train "$T/deck.toml" "${common[@]}" "${mesh[@]}" --set run.out_dir="$T/gone.run" --init-from "$T/gone"

# A relative path rank 0 sees and rank 1 does not (each rank in its own working directory).
mkdir -p "$T/wd0" "$T/wd1"
ln -s "$RUN" "$T/wd0/teacher"
timeout 60 mpirun -np 1 -wdir "$T/wd0" "$M" generate "$T/deck.toml" "${common[@]}" "${mesh[@]}" --checkpoint teacher --prompt "The " \
  : -np 1 -wdir "$T/wd1" "$M" generate "$T/deck.toml" "${common[@]}" "${mesh[@]}" --checkpoint teacher --prompt "The " >"$T/split.log" 2>&1
rc=$?
want="rank 1 on $(hostname): --checkpoint teacher: teacher/ckpt/step_00000003.h5 is not a file here"
if [ "$rc" = 2 ] && grep -qF -- "$want" "$T/split.log"; then
  echo "ok   split: $(grep -m1 -F -- "$want" "$T/split.log")"
else
  cat "$T/split.log"
  bad "split: exit $rc, wanted 2 and '$want'"
fi

echo "$fails failure(s)"
[ "$fails" = 0 ]
