#!/usr/bin/env bash
# Bounds on every decode, score and bench input, and the stops and reads around them
# (docs/user-guide.md "Translation", "Exit codes", "Faults"):
#   generate and translate refuse out-of-range options with exit 2 naming the option and its range
#     (--temperature nan or -1, --top-p 0 or 5, --top-k -3, --max-new 0 or -1, --alpha nan, --beam 0);
#   generate --max-new 10000000 is capped at model.seq_len with a note and runs at once;
#   eval refuses the same (--alpha nan or -1, --beam 0, -2 or nan, --batch 0, --max-len -1,
#     --max-examples -1), and so do bench-gemm (--seconds nan, 0, 1e300; --sizes 0), bench-comm
#     (--iters -1 or 2e9, --sizes 0 or 4T) and prep (--max-len 0, --valid-percent 101 or -1,
#     --spm-pieces 0, --min-pairs -1); eval --beam 100000 meets the decoding memory check;
#   translate --beam 100000 is refused by the decoding memory check (exit 2, "KV cache") within
#     seconds, before allocating; score --hyp /dev/zero is refused past 256 MiB (exit 2);
#   run.grad_bucket_mb = 1e300 or 1e-6, run.max_walltime = 1e-9, bench-gemm --threads -1 or more than
#     the cores: exit 2 naming the range; run.max_walltime reached before the first step (a test hook
#     sleeps there): exit 1 saying so, no checkpoint;
#   MemAvailable read once: with a stand-in that falls from 2e9 to 1000 bytes between two reads, the
#     memory report judges the check's figure (1.86 GiB, "the plan fits");
#   a stop signal (USR1, TERM, HUP) that lands before main() (the test hook holds the process there)
#     is caught: exit 75 with "nothing to checkpoint", no checkpoint written, 6 times;
#   translate of a run directory whose checkpoint is pruned between reading LATEST and opening it
#     (a test hook pauses there) reads the newer one that LATEST then names.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-$PWD/${BUILD:-build}/meshmoe}
[ -x "$M" ] || { echo "decode_bounds: $M not built"; exit 1; }
test_dir decode_bounds
tiny_data "$T"
write_tiny_deck "$T" run.steps=2 optim.batch_size=4 optim.warmup_steps=1 eval.every=0 checkpoint.every=1 \
  checkpoint.keep_last=1

# run NAME CMD ARGS...: meshmoe on 1 rank (a singleton, without mpirun: quicker) under timeout;
# output in $T/NAME.log, exit code in $rc.
run() {
  local name=$1; shift
  local t0=$SECONDS
  timeout 60 "$M" "$@" >"$T/$name.log" 2>&1 </dev/null
  rc=$?
  secs=$((SECONDS - t0))
  echo "-- $name: exit $rc in ${secs}s"
}
expect() {  # NAME RC PATTERN: exit code RC and a line matching PATTERN, never a crash
  [ "$rc" = "$2" ] || { cat "$T/$1.log"; fail "$1: exit $rc, expected $2"; }
  grep -q -- "$3" "$T/$1.log" || { cat "$T/$1.log"; fail "$1: no line matching '$3'"; }
  if grep -qiE "bad_alloc|terminate called|Segmentation|MPI_ABORT|core dumped" "$T/$1.log"; then
    cat "$T/$1.log"; fail "$1: crashed"
  fi
}

train_or_fail run 1
G=(generate "$T/deck.toml" --checkpoint "$T/run" --prompt "the")
R=(translate "$T/deck.toml" --checkpoint "$T/run" --input "$T/in.txt")
printf 'the license\nfree software\n' >"$T/in.txt"

# Decoding options out of range (translate, generate, eval).
run temp-nan "${G[@]}" --temperature nan;   expect temp-nan 2 "generate: --temperature nan: must be finite and >= 0"
run temp-neg "${G[@]}" --temperature -1;    expect temp-neg 2 "generate: --temperature -1: must be finite and >= 0"
run top-p-0 "${G[@]}" --top-p 0;            expect top-p-0 2 "generate: --top-p 0: must be in (0, 1\]"
run top-p-5 "${G[@]}" --top-p 5;            expect top-p-5 2 "generate: --top-p 5: must be in (0, 1\]"
run top-k "${G[@]}" --top-k -3;             expect top-k 2 "generate: --top-k -3: must be an integer >= 0"
run max-new-0 "${G[@]}" --max-new 0;        expect max-new-0 2 "generate: --max-new 0: must be an integer >= 1"
run max-new-neg "${G[@]}" --max-new -1;     expect max-new-neg 2 "generate: --max-new -1: must be an integer >= 1"
run alpha-nan "${R[@]}" --alpha nan;        expect alpha-nan 2 "translate: --alpha nan: must be finite and >= 0"
run beam-0 "${R[@]}" --beam 0;              expect beam-0 2 "translate: --beam 0: must be an integer >= 1"

E=(eval "$T/deck.toml" --checkpoint "$T/run" --max-examples 2 -o "$T/eval.h5")
run ev-alpha-nan "${E[@]}" --alpha nan;     expect ev-alpha-nan 2 "eval: --alpha nan: must be finite and >= 0"
run ev-alpha-neg "${E[@]}" --alpha -1;      expect ev-alpha-neg 2 "eval: --alpha -1: must be finite and >= 0"
run ev-beam-0 "${E[@]}" --beam 0;           expect ev-beam-0 2 "eval: --beam 0: must be an integer >= 1"
run ev-beam-neg "${E[@]}" --beam -2;        expect ev-beam-neg 2 "eval: --beam -2: must be an integer >= 1"
run ev-batch-0 "${E[@]}" --batch 0;         expect ev-batch-0 2 "eval: --batch 0: must be an integer >= 1"
run ev-max-len "${E[@]}" --max-len -1;      expect ev-max-len 2 "eval: --max-len -1: must be an integer >= 1"
run ev-examples eval "$T/deck.toml" --checkpoint "$T/run" -o "$T/eval.h5" --max-examples -1; expect ev-examples 2 "eval: --max-examples -1: must be an integer >= 0 (0: all)"
run ev-beam-nan "${E[@]}" --beam nan;       expect ev-beam-nan 2 "beam"
[ -e "$T/eval.h5" ] && fail "a refused eval wrote its -o"
# Every other command's numeric options: NaN, negative, zero and absurd values.
run gemm-nan bench-gemm --seconds nan --sizes 64;    expect gemm-nan 2 "bench-gemm: --seconds nan: must be in (0, 3600\]"
run gemm-0 bench-gemm --seconds 0 --sizes 64;        expect gemm-0 2 "bench-gemm: --seconds 0: must be in (0, 3600\]"
run gemm-huge bench-gemm --seconds 1e300 --sizes 64; expect gemm-huge 2 "bench-gemm: --seconds 1e+300: must be in (0, 3600\]"
run gemm-size bench-gemm --sizes 0 --seconds 0.01;   expect gemm-size 2 "bench-gemm: --sizes '0': '0' is not a matrix size in \[16, 16384\]"
run comm-iters-neg bench-comm -q --iters -1 -o "$T/b.h5";       expect comm-iters-neg 2 "bench-comm: --iters -1: must be in \[0, 1000000\]"
run comm-iters-big bench-comm -q --iters 2000000000 -o "$T/b.h5"; expect comm-iters-big 2 "bench-comm: --iters 2000000000: must be in \[0, 1000000\]"
run comm-size-0 bench-comm -q --sizes 0 -o "$T/b.h5";           expect comm-size-0 2 "bench-comm: --sizes: '0' is zero"
run comm-size-big bench-comm -q --sizes 4T -o "$T/b.h5";        expect comm-size-big 2 "bench-comm: --sizes: '4T' is above the limit of 1 GiB"
printf 'one line\n' >"$T/text.txt"
P=(prep text -q "$T/text.txt" -o "$T/p.h5")
run prep-len "${P[@]}" --max-len 0;            expect prep-len 2 "prep text: --max-len must be >= 6 (got 0)"
run prep-valid "${P[@]}" --valid-percent 101;  expect prep-valid 2 "prep text: --valid-percent must be in 0..100 (got 101)"
run prep-valid-neg "${P[@]}" --valid-percent -1; expect prep-valid-neg 2 "prep text: --valid-percent must be in 0..100 (got -1)"
run prep-spm "${P[@]}" --tokenizer spm --spm-pieces 0; expect prep-spm 2 "prep text: --spm-pieces must be in 16..1000000 (got 0)"
run prep-pairs prep gettext -o "$T/p.h5" --min-pairs -1; expect prep-pairs 2 "prep gettext: --min-pairs must be >= 0"
[ -e "$T/p.h5" ] && fail "a refused prep wrote its -o"

# Output bounds: capped at model.seq_len, at once.
run max-new-big "${G[@]}" --max-new 10000000
expect max-new-big 0 "generate: --max-new 10000000 capped at model.seq_len = 16"
[ "$secs" -le 20 ] || fail "generate --max-new 10000000 took ${secs}s"
[ "$(grep -c '^the' "$T/max-new-big.log")" = 1 ] || { cat "$T/max-new-big.log"; fail "max-new-big: no continuation line"; }

# The decoding memory check: refused before allocating.
run beam-big "${R[@]}" --beam 100000
expect beam-big 2 "translate --beam 100000 --batch 16 (the KV cache of every decoder block, beam x length per source) needs"
[ "$secs" -le 20 ] || fail "translate --beam 100000 took ${secs}s to be refused"
run ev-beam-big "${E[@]}" --beam 100000
expect ev-beam-big 2 "eval --beam 100000 --batch 16 (the KV cache of every decoder block, beam x length per source) needs"
[ "$secs" -le 20 ] || fail "eval --beam 100000 took ${secs}s to be refused"
run beam-ok "${R[@]}" --beam 2
expect beam-ok 0 ""
[ "$(wc -l <"$T/beam-ok.log")" -ge 2 ] || { cat "$T/beam-ok.log"; fail "beam-ok: no translations"; }

# Text inputs with a size limit.
run score-zero score --hyp /dev/zero --ref "$T/in.txt"
expect score-zero 2 "score --hyp /dev/zero: more than 256 MiB, the limit of a text input"

# Deck and bench ranges.
run bucket-huge plan "$T/deck.toml" --set run.grad_bucket_mb=1e300
expect bucket-huge 2 "run.grad_bucket_mb.*must be in \[0, 65536\]"
run bucket-tiny plan "$T/deck.toml" --set run.grad_bucket_mb=1e-6
expect bucket-tiny 2 "either 0 (no overlap) or in \[0.0001, 65536\] MiB"
run walltime plan "$T/deck.toml" --set run.max_walltime=1e-9
expect walltime 2 "run.max_walltime = 1e-9 s leaves no time for a step and a checkpoint: either 0 (no limit) or at least 1 s"
# run.max_walltime reached before the first step of a start (a test hook sleeps there): exit 1, not
# 75, so that a requeued job does not loop without progress; no checkpoint written.
MESHMOE_TEST_DELAY_FIRST_STEP=1.5 run walltime-first train "$T/deck.toml" --set run.max_walltime=1 \
  --set run.out_dir="$T/walltime-first"
expect walltime-first 1 "run.max_walltime = 1 s reached before the first step of this start (step 0)"
! ls "$T"/walltime-first/ckpt/step_*.h5 >/dev/null 2>&1 || fail "walltime-first: a checkpoint was written"
run threads-neg bench-gemm --threads -1 --sizes 64 --seconds 0.01
expect threads-neg 2 "bench-gemm: --threads -1: must be in \[0, "
run threads-big bench-gemm --threads 100000 --sizes 64 --seconds 0.01
expect threads-big 2 "bench-gemm: --threads 100000: must be in \[0, "

# MemAvailable read once: the check's figure is the report's.
MESHMOE_TEST_MEMAVAILABLE=2e9,1000 run memavail train "$T/deck.toml" --set run.out_dir="$T/memavail" --set run.steps=1
expect memavail 0 "available memory: 1.86 GiB per node (MemAvailable of /proc/meminfo), 1 rank on the node: the plan fits"

# A stop before main(): caught, exit 75, nothing written.
for sig in USR1 TERM HUP USR1 TERM HUP; do
  rm -rf "$T/stop"
  MESHMOE_TEST_SLEEP_BEFORE_MAIN=20 "$M" train "$T/deck.toml" --set run.out_dir="$T/stop" >"$T/stop.log" 2>&1 &
  pid=$!
  # The handlers are in when /proc says the process catches the signal (SigCgt); the hook holds it
  # before main() for 20 s, so the signal lands there.
  caught=0
  for _ in $(seq 3000); do
    cgt=$(awk '/^SigCgt/ { print $2 }' "/proc/$pid/status" 2>/dev/null)
    [ -n "$cgt" ] && (( (16#$cgt >> 9) & 1 )) && { caught=1; break; }  # bit 10 (USR1) - 1
    sleep 0.01
  done
  [ "$caught" = 1 ] || { kill -9 "$pid"; fail "stop: the handlers were not installed within 30 s"; }
  kill -"$sig" "$pid"
  wait "$pid"
  rc=$?
  secs=0
  expect stop 75 "stop signal received before the first step of this start (step 0): nothing to checkpoint"
  ! ls "$T"/stop/ckpt/step_*.h5 >/dev/null 2>&1 || fail "a stop before the first step wrote a checkpoint"
done
echo "-- 6 stops before main(): exit 75, no checkpoint"

# LATEST names a checkpoint that a training run prunes while translate opens it.
mkdir -p "$T/prune"
cp -r "$T/run/ckpt" "$T/prune/ckpt"
old=$(cat "$T/prune/ckpt/LATEST")
MESHMOE_TEST_PAUSE_AFTER_LATEST="$T/pause" timeout 60 "$M" translate "$T/deck.toml" \
  --checkpoint "$T/prune" --input "$T/in.txt" --beam 1 >"$T/prune.log" 2>&1 </dev/null &
pid=$!
for _ in $(seq 300); do [ -e "$T/pause.ready" ] && break; sleep 0.1; done
[ -e "$T/pause.ready" ] || { kill "$pid"; cat "$T/prune.log"; fail "prune: translate never paused after reading LATEST"; }
# What a training run's checkpoint of step 3 with checkpoint.keep_last = 1 does: the new file, LATEST, the old file pruned.
cp "$T/prune/ckpt/$old" "$T/prune/ckpt/step_00000003.h5"
echo step_00000003.h5 >"$T/prune/ckpt/LATEST.tmp" && mv "$T/prune/ckpt/LATEST.tmp" "$T/prune/ckpt/LATEST"
rm "$T/prune/ckpt/$old"
touch "$T/pause.go"
wait "$pid"
rc=$?
expect prune 0 "reading .*step_00000003.h5, which LATEST names now"
[ "$(grep -vc '^meshmoe' "$T/prune.log")" -ge 2 ] || { cat "$T/prune.log"; fail "prune: no translations"; }
echo "decode_bounds: ok"
