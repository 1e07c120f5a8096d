#!/usr/bin/env bash
# No command destroys an input, runs are not mixed (docs/user-guide.md "Faults"). One line per
# case, "ok NAME" or "FAIL NAME: why"; a case that hangs is killed after 60 s and fails.
#   - eval -o onto its checkpoint, its dataset (also through a symbolic and a hard link), another
#     run's metrics.h5, or a text file: exit 2, the file bitwise unchanged; -o in a directory that
#     does not exist: exit 2 naming it, nothing created; a good -o is written whole (no temporary
#     left) and an earlier eval result is replaced; prep -o onto a run's metrics.h5: exit 2;
#   - a ckpt/ that is a file, a symbolic link to nothing or (root only) a link to a read-only
#     mount: exit 2 naming it before any step, with checkpoint.every = 0;
#   - bench-comm -o onto a run's metrics.h5, a checkpoint or a text file, export -o onto its
#     dataset, a run's metrics.h5 or a text file, eval --write-text onto its checkpoint (a link) or a
#     binary file: exit 2, the file bitwise unchanged; each in a directory that does not exist: exit 2,
#     nothing created; an earlier result of the same command is replaced, no temporary left;
#   - a SIGTERM to eval -o between its temporary file and the rename (a test hook holds it there):
#     an earlier result stays bitwise, a new one does not appear, no temporary is left;
#   - eval, translate, generate and distill (--teacher, --baseline) of a checkpoint trained on other
#     data: exit 2 naming both; with --allow-other-data exit 0 and a warning;
#   - two runs whose ckpt/ are links to one directory: the second exits 2 naming the first;
#   - a mixed launch (MPMD): another --set optim.lr on one rank, train beside plan: exit 2 at once,
#     naming the argument and the rank, no hang.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=$(realpath "${MESHMOE:-build/meshmoe}")
test_dir data-safety
ulimit -c 0
mkdir -p "$T/a" "$T/b"
demo_pairs "$T/a"        # de, fr: the data trained on
demo_pairs "$T/b" long   # de, fr, other sentences: the same vocabulary, other data
write_tiny_deck "$T" run.name=safety run.steps=10 run.log_every=5 run.seed=3 model.seq_len=48 \
  moe.num_experts=2 moe.router=top1 optim.batch_size=4 data.path="$T/a/data.h5" eval.every=0 \
  eval.examples_per_language=2 checkpoint.every=10
D="$T/deck.toml"

failed=0 n=0
sum() { sha256sum "$1" | cut -d' ' -f1; }

train_or_fail r1 1
C="$T/r1/ckpt/step_00000010.h5"
[ -s "$C" ] || fail "no checkpoint of step 10"
E=(mpirun -np 1 "$M" eval "$D" --checkpoint "$T/r1" --beam 1 --max-examples 2)

echo "== eval -o never destroys an input"
ln -s "$T/a/data.h5" "$T/link.h5"
ln "$T/a/data.h5" "$T/hard.h5"
printf 'notes\n' >"$T/notes.txt"
for target in "$C" "$T/a/data.h5" "$T/link.h5" "$T/hard.h5" "$T/r1/metrics.h5" "$T/notes.txt" "$D"; do
  before=$(sum "$target")
  run "$T/o.out" "${E[@]}" -o "$target"
  expect "eval -o $(basename "$target") (an input or a run's file) is refused" 2 "meshmoe: error: eval: the output file .*$(basename "$target") (is the input|exists and is)" "$T/o.out"
  [ "$(sum "$target")" = "$before" ] || bad "eval -o $(basename "$target") changed it"
done
"$M" ckpt verify "$C" >/dev/null 2>&1 || bad "the checkpoint no longer verifies"
gone="$T/no-such-dir-$$"
run "$T/o.out" "${E[@]}" -o "$gone/x.h5"
expect "eval -o in a directory that does not exist" 2 "eval: the output file $gone/x.h5: cannot create it: its directory $gone does not exist" "$T/o.out"
[ -e "$gone" ] && bad "eval -o created the directory $gone"
run "$T/o.out" "${E[@]}" -o "$T/result.h5"
expect "eval -o a new file" 0 "written to $T/result.h5" "$T/o.out"
ls "$T"/result.h5.tmp* >/dev/null 2>&1 && bad "a temporary file is left beside the result"
run "$T/o.out" "${E[@]}" -o "$T/result.h5"
expect "eval -o an earlier eval result replaces it" 0 "written to $T/result.h5" "$T/o.out"
before=$(sum "$T/r1/metrics.h5")
run "$T/o.out" mpirun -np 1 "$M" prep text -q "$T/notes.txt" -o "$T/r1/metrics.h5"
expect "prep -o a run's metrics.h5 is refused" 2 "prep text: the output file .*metrics.h5 exists and is an HDF5 file of another kind" "$T/o.out"
[ "$(sum "$T/r1/metrics.h5")" = "$before" ] || bad "prep -o changed metrics.h5"

echo "== every other writer goes through the same checks"
B=(mpirun -np 1 "$M" bench-comm --sizes 1K --ops all_reduce --iters 2)
for target in "$T/r1/metrics.h5" "$C" "$T/notes.txt"; do
  before=$(sum "$target")
  run "$T/o.out" "${B[@]}" -o "$target"
  expect "bench-comm -o $(basename "$target") (another kind of file) is refused" 2 "bench-comm: the output file .*$(basename "$target") exists and is" "$T/o.out"
  [ "$(sum "$target")" = "$before" ] || bad "bench-comm -o $(basename "$target") changed it"
done
run "$T/o.out" "${B[@]}" -o "$gone/b.h5"
expect "bench-comm -o in a directory that does not exist" 2 "bench-comm: the output file $gone/b.h5: cannot create it" "$T/o.out"
run "$T/o.out" "${B[@]}" -o "$T/bench.h5"
run "$T/o2.out" "${B[@]}" -o "$T/bench.h5"
expect "bench-comm -o an earlier bench-comm result replaces it" 0 "# wrote $T/bench.h5" "$T/o2.out"
ls "$T"/bench.h5.tmp* >/dev/null 2>&1 && bad "a temporary file is left beside the bench-comm result"
for target in "$T/a/data.h5" "$T/r1/metrics.h5" "$T/notes.txt"; do
  before=$(sum "$target")
  run "$T/o.out" mpirun -np 1 "$M" export "$C" -o "$target"
  expect "export -o $(basename "$target") (its dataset, another kind of file) is refused" 2 "export: the output file .*$(basename "$target") (is the input|exists and is not a safetensors file)" "$T/o.out"
  [ "$(sum "$target")" = "$before" ] || bad "export -o $(basename "$target") changed it"
done
run "$T/o.out" mpirun -np 1 "$M" export "$C" -o "$T/model.safetensors"
run "$T/o2.out" mpirun -np 1 "$M" export "$C" -o "$T/model.safetensors"
expect "export -o an earlier export replaces it" 0 "export: .* -> $T/model.safetensors" "$T/o2.out"
ls "$T"/model.safetensors.tmp* >/dev/null 2>&1 && bad "a temporary file is left beside the export"
mkdir -p "$T/text"
ln -s "$C" "$T/text/de.hyp"
cp "$T/a/data.h5" "$T/text/fr.ref"
before=$(sum "$C"); before_fr=$(sum "$T/text/fr.ref")
run "$T/o.out" "${E[@]}" -o "$T/result.h5" --write-text "$T/text"
expect "eval --write-text onto its checkpoint (a link de.hyp) is refused" 2 "eval: the output file $T/text/de.hyp is the input .*step_00000010.h5: refusing to overwrite it" "$T/o.out"
[ "$(sum "$C")" = "$before" ] || bad "eval --write-text changed the checkpoint"
rm "$T/text/de.hyp"
run "$T/o.out" "${E[@]}" -o "$T/result.h5" --write-text "$T/text"
expect "eval --write-text onto a binary file (fr.ref, a dataset) is refused" 2 "eval: the output file $T/text/fr.ref exists and does not hold text" "$T/o.out"
[ "$(sum "$T/text/fr.ref")" = "$before_fr" ] || bad "eval --write-text changed fr.ref"
run "$T/o.out" "${E[@]}" -o "$T/result.h5" --write-text "$gone/text"
expect "eval --write-text under a directory that does not exist" 2 "eval: --write-text $gone/text: cannot create it: its directory $gone does not exist" "$T/o.out"
[ -e "$gone" ] && bad "eval --write-text created the directory $gone"
rm "$T/text/fr.ref"
run "$T/o.out" "${E[@]}" -o "$T/result.h5" --write-text "$T/text"
expect "eval --write-text a new directory's files" 0 "written to $T/result.h5" "$T/o.out"
[ -s "$T/text/de.src" ] && [ -e "$T/text/fr.hyp" ] || bad "eval --write-text wrote no de.src or fr.hyp" "$T/o.out"
ls "$T"/text/*.tmp* >/dev/null 2>&1 && bad "a temporary file is left beside the text files"

echo "== a SIGTERM while eval writes leaves the old file or none"
# The test hook holds eval between its temporary file and the rename (src/io/output_file.hpp).
term_eval() {  # OUT: eval -o OUT paused before its rename, then TERM to the meshmoe process
  rm -f "$T/pause.ready" "$T/pause.go"
  (MESHMOE_TEST_PAUSE_BEFORE_RENAME="$T/pause" setsid timeout -k 5 60 mpirun -x MESHMOE_TEST_PAUSE_BEFORE_RENAME \
     -np 1 "$M" eval "$D" --checkpoint "$T/r1" --beam 1 --max-examples 2 -o "$1" >"$T/term.out" 2>&1; echo $? >"$T/term.rc") &
  for _ in $(seq 600); do [ -e "$T/pause.ready" ] && break; sleep 0.1; done
  paused=0; [ -e "$T/pause.ready" ] && paused=1
  for p in $(pgrep -f -- "-o $1"); do
    case "$(cat /proc/"$p"/comm 2>/dev/null)" in meshmoe*) kill -TERM "$p" ;; esac
  done
  wait
}
before=$(sum "$T/result.h5")
term_eval "$T/result.h5"
[ "$paused" = 1 ] && [ "$(cat "$T/term.rc")" != 0 ] && [ "$(sum "$T/result.h5")" = "$before" ] && ok "TERM before the rename: the earlier result stays bitwise" ||
  bad "TERM before the rename: paused $paused, exit $(cat "$T/term.rc"), result.h5 changed?" "$T/term.out"
term_eval "$T/fresh.h5"
[ "$paused" = 1 ] && [ "$(cat "$T/term.rc")" != 0 ] && [ ! -e "$T/fresh.h5" ] && ok "TERM before the rename of a new file: no file" ||
  bad "TERM before the rename of a new file: paused $paused, exit $(cat "$T/term.rc"), fresh.h5 exists?" "$T/term.out"
ls "$T"/result.h5.tmp* "$T"/fresh.h5.tmp* >/dev/null 2>&1 && bad "TERM left a temporary file"

echo "== every path a run writes is checked at start"
steps0=(--set run.steps=300 --set checkpoint.every=0)
mkdir -p "$T/file"; printf 'x\n' >"$T/file/ckpt"
run "$T/w.out" mpirun -np 2 "$M" train "$D" --set mesh.data=2 --set run.out_dir="$T/file" "${steps0[@]}"
expect "ckpt/ is a file" 2 "the checkpoint directory $T/file/ckpt is not a directory" "$T/w.out"
grep -qE "^step " "$T/w.out" && bad "steps ran before ckpt/ (a file) was found"
mkdir -p "$T/dangling"; ln -s "$T/nowhere" "$T/dangling/ckpt"
run "$T/w.out" mpirun -np 2 "$M" train "$D" --set mesh.data=2 --set run.out_dir="$T/dangling" "${steps0[@]}"
expect "ckpt/ is a symbolic link to nothing" 2 "the checkpoint directory $T/dangling/ckpt is a symbolic link to nothing" "$T/w.out"
grep -qE "^step " "$T/w.out" && bad "steps ran before ckpt/ (a dangling link) was found"
mkdir -p "$T/ro" "$T/rorun"
if mount -t tmpfs -o ro,size=64k tmpfs "$T/ro" 2>/dev/null; then
  ln -s "$T/ro" "$T/rorun/ckpt"
  run "$T/w.out" mpirun -np 2 "$M" train "$D" --set mesh.data=2 --set run.out_dir="$T/rorun" "${steps0[@]}"
  umount "$T/ro"
  expect "ckpt/ is a link to a read-only mount" 2 "cannot write the checkpoint directory $T/rorun/ckpt: Read-only file system" "$T/w.out"
  grep -qE "^step " "$T/w.out" && bad "steps ran before ckpt/ (read-only) was found"
else
  echo "(mount not permitted: no read-only case)"
fi

echo "== a checkpoint of other data is refused"
other=(--set data.path="$T/b/data.h5")
run "$T/d.out" "${E[@]}" "${other[@]}" -o "$T/other.h5"
expect "eval on other data" 2 "\-\-checkpoint .*step_00000010.h5 was trained on other data than data.path = $T/b/data.h5 \(it records $T/a/data.h5\)" "$T/d.out"
[ -e "$T/other.h5" ] && bad "eval on other data wrote its -o"
run "$T/d.out" "${E[@]}" "${other[@]}" -o "$T/other.h5" --allow-other-data
expect "eval on other data with --allow-other-data" 0 "warning: --checkpoint .* was trained on other data" "$T/d.out"
printf 'Datei 3 kopiert\n' >"$T/src.txt"
run "$T/d.out" mpirun -np 1 "$M" translate "$D" "${other[@]}" --checkpoint "$T/r1" --lang de --input "$T/src.txt"
expect "translate on other data" 2 "was trained on other data than data.path" "$T/d.out"
run "$T/d.out" mpirun -np 1 "$M" translate "$D" "${other[@]}" --checkpoint "$T/r1" --lang de --input "$T/src.txt" --allow-other-data
expect "translate on other data with --allow-other-data" 0 "warning: .*was trained on other data" "$T/d.out"
run "$T/d.out" mpirun -np 1 "$M" generate "$D" "${other[@]}" --checkpoint "$T/r1" --lang de --prompt "Datei" --max-new 4
expect "generate on other data" 2 "was trained on other data than data.path" "$T/d.out"
run "$T/d.out" mpirun -np 1 "$M" distill "$D" "${other[@]}" --set run.out_dir="$T/student" --teacher "$T/r1"
expect "distill with a teacher of other data" 2 "\-\-teacher .* was trained on other data than data.path" "$T/d.out"
mpirun -np 1 "$M" train "$D" "${other[@]}" --set run.out_dir="$T/r1b" >"$T/r1b.log" 2>&1 || bad "run r1b failed" "$T/r1b.log"
run "$T/d.out" mpirun -np 1 "$M" distill "$D" --set run.out_dir="$T/student" --teacher "$T/r1" --baseline "$T/r1b"
expect "distill with a baseline of other data" 2 "\-\-baseline .* was trained on other data than data.path" "$T/d.out"

echo "== two runs through links to one ckpt/"
mkdir -p "$T/shared" "$T/x" "$T/y"
ln -s "$T/shared" "$T/x/ckpt"; ln -s "$T/shared" "$T/y/ckpt"
(setsid timeout -k 5 60 mpirun -np 1 "$M" train "$D" --set run.out_dir="$T/x" --set run.steps=1000000 --set checkpoint.every=0 \
  >"$T/x.out" 2>&1; echo $? >"$T/x.rc") &
for _ in $(seq 600); do grep -qE "^step " "$T/x.out" 2>/dev/null && break; sleep 0.1; done
run "$T/y.out" mpirun -np 1 "$M" train "$D" --set run.out_dir="$T/y" --set run.steps=20
expect "a second run whose ckpt/ links to the running one's" 2 "the checkpoint directory $T/y/ckpt \($T/shared\) is in use by another run \(pid [0-9]+ on .*run directory $T/x" "$T/y.out"
for p in $(pgrep -f -- "run.out_dir=$T/x --set run.steps=1000000"); do
  case "$(cat /proc/"$p"/comm 2>/dev/null)" in meshmoe*) kill -USR1 "$p" ;; esac
done
wait
[ "$(cat "$T/x.rc")" = 75 ] && ok "the first run goes on and stops on USR1 (exit 75)" || bad "the first run ended with $(cat "$T/x.rc")" "$T/x.out"

echo "== a mixed launch stops at once"
d2=(--set mesh.data=2)
run "$T/m.out" mpirun -np 1 "$M" train "$D" "${d2[@]}" --set optim.lr=0.001 --set run.out_dir="$T/mixed" : -np 1 "$M" train "$D" "${d2[@]}" --set optim.lr=0.5 --set run.out_dir="$T/mixed"
expect "another --set optim.lr on rank 1" 2 "the ranks disagree on their command line: rank 1 differs from rank 0, first at argument 6 \('optim.lr=0.5' on rank 1, 'optim.lr=0.001' on rank 0\)" "$T/m.out"
[ -e "$T/mixed/ckpt" ] && bad "the mixed launch wrote a run directory"
run "$T/m.out" mpirun -np 1 "$M" train "$D" "${d2[@]}" : -np 1 "$M" plan "$D" "${d2[@]}"
expect "train beside plan" 2 "the ranks disagree on their command line: rank 1 differs from rank 0, first at argument 1 \('plan' on rank 1, 'train' on rank 0\)" "$T/m.out"
run "$T/m.out" mpirun -np 1 "$M" plan "$D" --set mesh.data=4 : -np 3 "$M" train "$D" --set mesh.data=4
expect "plan beside train on three ranks" 2 "ranks 1, 2 and 3 differ from rank 0" "$T/m.out"

echo "data_safety: $((n - failed)) of $n cases ok"
[ "$failed" = 0 ]
