#!/usr/bin/env bash
# Step time of two meshmoe executables on the same decks, interleaved (A, B, A, B, ...) so that
# machine noise hits both alike; prints the mean step time of each (steps 6.. of each run, from
# metrics.h5 tokens_per_s) and B/A. The final losses must agree bitwise when the change is not
# meant to change the numbers; the script prints them side by side, then each phase's time (other:
# the step less the phases). THREADS=n gives each rank n BLAS/host threads (run.threads) and n
# cores (default: the deck's run.threads, one core a rank).
#   bench/compare-builds.sh OLD/meshmoe NEW/meshmoe [REPEATS] [DECK...]
#   e.g. git worktree add /tmp/old HEAD~1 && make -C /tmp/old -j2 && \
#        bench/compare-builds.sh /tmp/old/build/meshmoe build/meshmoe 2
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/env.sh
A=$(realpath "$1"); B=$(realpath "$2"); REPEATS=${3:-2}; shift $(( $# < 3 ? $# : 3 ))
DECKS=("$@"); [ ${#DECKS[@]} -gt 0 ] || DECKS=(inputs/m4-dense-tiny.toml inputs/m4-switch-tiny.toml inputs/m4-gshard-tiny.toml)
NP=${NP:-2}; STEPS=${STEPS:-30}
BIND=(); SET_THREADS=(); [ -n "${THREADS:-}" ] && BIND=(--map-by "slot:PE=$THREADS") && SET_THREADS=(--set run.threads="$THREADS")
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
[ -s data/gettext.h5 ] || { echo "needs data/gettext.h5 (build/meshmoe prep gettext -o data/gettext.h5)"; exit 2; }
for deck in "${DECKS[@]}"; do
  for r in $(seq "$REPEATS"); do
    for which in A B; do
      bin=$A; [ $which = B ] && bin=$B
      OPENBLAS_NUM_THREADS=1 mpirun "${BIND[@]}" -np "$NP" "$bin" train "$deck" --set mesh.data="$NP" --set run.steps="$STEPS" \
        "${SET_THREADS[@]}" \
        --set eval.every=0 --set checkpoint.every=0 --set run.log_every=1 --set run.out_dir="$T/$which-$r-$(basename "$deck" .toml)" \
        >"$T/log" 2>&1 || { tail "$T/log"; exit 1; }
    done
  done
done
/usr/bin/python3 - "$T" "$REPEATS" "${DECKS[@]}" <<'PY'
import sys, os, h5py, numpy as np
sys.path.insert(0, "bench")
from benchlib import step_tokens
T, reps, decks = sys.argv[1], int(sys.argv[2]), [os.path.basename(d)[:-5] for d in sys.argv[3:]]

print("| deck | A step (ms) | B step (ms) | B/A | final loss A | final loss B |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for d in decks:
    t, loss = {}, {}
    for w in "AB":
        ms = []
        for r in range(1, reps + 1):
            with h5py.File(f"{T}/{w}-{r}-{d}/metrics.h5", "r") as f:
                tokens = step_tokens(f)
                ms.append(1000 * float(np.mean(tokens / f["tokens_per_s"][5:])))
                loss[w] = float(f["loss"][-1])
        t[w] = float(np.mean(ms))
    print(f"| {d} | {t['A']:.1f} | {t['B']:.1f} | {t['B'] / t['A']:.3f} | {loss['A']!r} | {loss['B']!r} |")
# Per phase (metrics.h5 time/, the same steps), the mean over the repeats.
print("\n| deck | phase | A (ms/step) | B (ms/step) | B - A |")
print("| --- | --- | ---: | ---: | ---: |")
for d in decks:
    ph = {}
    for w in "AB":
        for r in range(1, reps + 1):
            with h5py.File(f"{T}/{w}-{r}-{d}/metrics.h5", "r") as f:
                phases = {k: 1000 * float(np.mean(f["time"][k][5:])) for k in f["time"]}
                phases["other"] = 1000 * float(np.mean(step_tokens(f) / f["tokens_per_s"][5:])) - sum(phases.values())
                for k, ms in phases.items():
                    ph.setdefault(k, {}).setdefault(w, []).append(ms)
    for k, v in ph.items():
        a, b = np.mean(v["A"]), np.mean(v["B"])
        if a > 0 or b > 0:
            print(f"| {d} | {k} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
PY
