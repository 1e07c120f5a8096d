#!/usr/bin/env bash
# Batches at the edges of the data.
# 1. A step whose batch holds no target token (docs/ARCHITECTURE.md "One training step"): the data
# set's first six training examples lose their targets (loss_mask set to 0 with h5py), so with
# file order, one example per row and two rows per step, steps 1-3 have nothing to learn from.
# On 2 data ranks with an MoE layer (aux and z losses on): each such step is reported on stderr and
# in metrics.h5 (/empty = 1, loss NaN), is not a bad step (/skipped = 0, exit 0), and changes
# nothing: the checkpoints of steps 1-3 hold bitwise the initial parameters and optimizer state
# (update_count 0), step 4 updates. Evaluation on the same split skips its empty batches and counts
# them (/eval/empty_batches).
# 2. Examples longer than model.seq_len + 1 whose target cannot fit (plain text: every token after
# the tag is a target) are dropped: the run says how many at start and in metrics.h5's root
# attributes, the same count h5py finds in the data set; when every example would be, exit 2.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env.sh
source tests/lib/common.sh
M=${MESHMOE:-build/meshmoe}
PYTHON=${PYTHON:-/usr/bin/python3}
test_dir data-edges
for i in $(seq 1 60); do echo "short line number $i of the test"; done >"$T/lines.txt"
"$M" prep text -q "$T/lines.txt" --valid-percent 40 -o "$T/data.h5" >/dev/null
valid_examples=$($PYTHON - "$T/data.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    for split in ("train", "valid"):
        g = f[split]
        off = g["doc_offsets"][()]
        assert len(off) > 12, f"/{split}: {len(off) - 1} examples, the test needs more than 11"
        mask = g["loss_mask"][()]
        mask[: off[6]] = 0  # the first six examples: no target token
        g["loss_mask"][...] = mask
    print(len(f["valid/doc_offsets"]) - 1)
PY
)
eval_batches=$(((valid_examples + 1) / 2))
# eval.examples_per_language: all the validation examples (fewer), in file order: eval_batches batches
write_tiny_deck "$T" run.steps=5 run.log_every=5 run.seed=3 model.seq_len=40 moe.num_experts=2 \
  moe.group_size=40 moe.aux_loss_coef=0.01 moe.z_loss_coef=0.001 optim.batch_size=2 optim.lr=0.01 \
  optim.warmup_steps=1 data.shuffle=false eval.every=5 eval.examples_per_language=1000 checkpoint.every=1 \
  checkpoint.keep_last=10
train_or_fail run 2 --set mesh.data=2
for s in 1 2 3; do
  grep -q "warning: step $s: no target token in the batch; no update ($s empty steps so far)" "$T/run.log" ||
    { cat "$T/run.log"; fail "step $s was not reported as empty"; }
done
grep -q "warning: step 4: no target token" "$T/run.log" && fail "step 4 reported empty"
grep -q "non-finite" "$T/run.log" && { cat "$T/run.log"; fail "an empty step was treated as a non-finite step"; }
grep -q "^step *2/5 .*| EMPTY" "$T/run.log" || { cat "$T/run.log"; fail "no progress line marks step 2 EMPTY"; }
grep -q "eval step 5 | .*(3 of $eval_batches batches without a target token, skipped)" "$T/run.log" ||
  { cat "$T/run.log"; fail "the evaluation did not report its 3 empty batches"; }
$PYTHON - "$T/run" <<'PY'
import sys, h5py, numpy as np
run = sys.argv[1]
with h5py.File(f"{run}/metrics.h5", "r") as f:
    step, empty, skipped, loss = f["step"][()], f["empty"][()], f["skipped"][()], f["loss"][()]
    assert list(step) == [1, 2, 3, 5], step  # every empty step is logged, then log_every
    assert list(empty) == [1, 1, 1, 0], empty
    assert not skipped.any(), skipped
    assert np.isnan(loss[:3]).all() and np.isfinite(loss[3]), loss
    ev = f["eval/empty_batches"][()]
    assert ev[-1] == 3 and np.isfinite(f["eval/loss"][()][-1]), (ev, f["eval/loss"][()])
def tensors(path):
    with h5py.File(path, "r") as c:
        out = {}
        for g in ("params", "optim"):
            c[g].visititems(lambda n, o: out.__setitem__(f"{g}/{n}", o[()]) if isinstance(o, h5py.Dataset) else None)
        return out, int(c.attrs["update_count"]), dict(c["counters"].attrs)
ck = lambda s: f"{run}/ckpt/step_{s:08d}.h5"
t1, u1, _ = tensors(ck(1))
for s in (2, 3):
    t, u, c = tensors(ck(s))
    same = all(np.array_equal(t[n], t1[n]) for n in t1)
    assert same and u == 0, f"step {s}: parameters/optimizer state changed ({same}) or update_count {u}"
assert c["empty_steps"] == 3 and c["bad_steps"] == 0, c
t4, u4, _ = tensors(ck(4))
changed = [n for n in t1 if not np.array_equal(t4[n], t1[n])]
assert u4 == 1 and any(n.startswith("params/") and "router" in n for n in changed), (u4, changed)
print(f"  steps 1-3 empty: {len(t1)} tensors unchanged, update_count 0; step 4 updated {len(changed)} tensors")
PY

echo "== too-long examples"
for k in $(seq 4 30); do printf '%*s\n' "$k" "" | tr ' ' x; done >"$T/widths.txt"
"$M" prep text -q "$T/widths.txt" --valid-percent 0 -o "$T/widths.h5" >/dev/null 2>&1
train_or_fail long 1 --set data.path="$T/widths.h5" --set model.seq_len=16 --set moe.group_size=16 --set eval.every=0 \
  --set run.steps=2 --set mesh.data=1
want=$($PYTHON -c "
import sys, h5py, numpy as np
off = h5py.File(sys.argv[1], 'r')['train/doc_offsets'][()]
print(int((np.diff(off) > 17).sum()))" "$T/widths.h5")
[ "$want" -gt 0 ] || fail "the data set has no example longer than 17 tokens"
grep -q "examples longer than model.seq_len + 1 = 17: train 0 truncated at the source, $want dropped" "$T/long.log" ||
  { cat "$T/long.log"; fail "the start-up line does not report $want dropped examples"; }
$PYTHON - "$T/long/metrics.h5" "$want" <<'PY'
import sys, h5py
a = h5py.File(sys.argv[1], "r").attrs
assert a["train_examples_dropped"] == sys.argv[2] and a["train_examples_truncated"] == "0", dict(a)
PY
set +e
mpirun -np 1 "$M" train "$T/deck.toml" --set run.out_dir="$T/none" --set data.path="$T/widths.h5" --set model.seq_len=4 \
  --set moe.group_size=4 --set eval.every=0 >"$T/none.log" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || { cat "$T/none.log"; fail "every example too long: exit $rc, expected 2"; }
grep -q "raise model.seq_len" "$T/none.log" || { cat "$T/none.log"; fail "no message telling to raise model.seq_len"; }
echo "all ok"
