#!/usr/bin/env python3
"""Checks of `meshmoe export` files for tests/scripts/export_torch.sh and upcycle.sh.

  export_check.py table FILE             the names and shapes of docs/export.md's table, expanded for
                                         FILE's deck, equal FILE's tensors (names and shapes, no more)
  export_check.py loss FILE DATA EVAL_H5 postprocess/meshmoe_torch.py's validation loss of FILE on
                                         DATA equals `meshmoe eval`'s (EVAL_H5 attribute valid_loss)
                                         within 1e-5 relative
  export_check.py same A B               A and B hold the same tensors, bitwise (names, shapes, bytes)
  export_check.py upcycled DENSE MOE     every expert of MOE's MoE blocks is bitwise DENSE's
                                         blocks.i.mlp tensor, the router is not copied from
                                         anything, every other tensor of MOE is DENSE's
  export_check.py top1 DENSE MOE DATA    Switch top-1, upcycled: each MoE block's output is the dense
                                         feed-forward's times the top probability (docs/export.md)
Exit 1 with FAIL lines on a mismatch.
"""
import os
import re
import sys
import tomllib

import h5py  # noqa: F401  (meshmoe_torch reads the dataset with it)
import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "postprocess"))
import meshmoe_torch  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
REL_TOL = 1e-5  # both sides fp32; the loss is a mean of ~1e3 token losses, each within a few ulps


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def table_rows(heading="| name | shape | present |", present=2):
    """[(name pattern, shape pattern, condition)] of the docs/export.md table whose heading row begins
    with `heading` (the condition in column `present`)."""
    rows, inside = [], False
    for line in open(os.path.join(ROOT, "docs", "export.md"), encoding="utf-8"):
        if line.startswith(heading):
            inside = True
            continue
        if inside:
            if not line.startswith("|"):
                break
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0].startswith("---"):
                continue
            rows.append((cells[0].strip("`"), cells[1], cells[present]))
    if not rows:
        fail(f"no table '{heading}' in docs/export.md")
    return rows


def expected(deck):
    m, moe = deck["model"], deck["moe"]
    L, encdec = m["num_layers"], m["arch"] == "encdec"
    H = m["d_ff"]
    He = moe["expert_d_ff"] or H
    letters = {"V": None, "T": m["seq_len"], "M": m["d_model"], "H": H, "He": He, "E": moe["num_experts"],
               "n He": moe["shared_experts"] * He,
               "K": m["d_model"] // m["num_heads"] * (m.get("kv_heads", 0) or m["num_heads"])}
    geglu = m["activation"] == "geglu"
    out = {}
    for name, shape, cond in table_rows():
        blocks = range(2 * L if encdec else L) if ".i." in name else [None]
        for i in blocks:
            j = None if i is None else (i - L if encdec and i >= L else i)
            is_moe = j is not None and moe["every"] > 0 and (j + 1) % moe["every"] == 0
            ok = {"always": True, "every block": True,
                  "decoder blocks of an encoder-decoder": encdec and i is not None and i >= L,
                  "dense blocks": j is not None and not is_moe, "MoE blocks": is_moe,
                  "MoE blocks with `moe.shared_experts` > 0": is_moe and moe["shared_experts"] > 0,
                  "MoE blocks with `moe.balance = \"bias\"`": is_moe and moe["balance"] == "bias",
                  "encoder-decoder": encdec, "`model.tied_embeddings = false`": not m["tied_embeddings"]}.get(cond)
            if ok is None:
                fail(f"docs/export.md: unknown condition '{cond}'")
            if not ok:
                continue
            dims = [d.strip() for d in shape.strip("[]").split(",")]
            if geglu and name.endswith(".w_in"):
                dims.insert(len(dims) - 1, "2")
            out[name.replace(".i.", f".{i}.")] = dims
    return out, letters


def cmd_table(path):
    tensors, meta = meshmoe_torch.read_safetensors(path)
    deck = tomllib.loads(meta["deck"])
    want, letters = expected(deck)
    letters["V"] = deck["model"]["vocab_size"] or int(meta["vocab_size"])
    bad = []
    for name in sorted(set(want) | set(tensors)):
        if name not in tensors:
            bad.append(f"{name}: in docs/export.md's table, not in the file")
            continue
        if name not in want:
            bad.append(f"{name}: in the file, not in docs/export.md's table")
            continue
        shape = [int(d) if d.isdigit() else letters[d] for d in want[name]]
        if list(tensors[name].shape) != shape:
            bad.append(f"{name}: {list(tensors[name].shape)} in the file, {shape} by the table")
    for b in bad:
        print("FAIL: " + b)
    if bad:
        sys.exit(1)
    print(f"ok   {len(tensors)} tensors of {os.path.basename(path)}: names and shapes as docs/export.md's table")


def check_loss(model, what, path, data, eval_h5):
    """`model`'s validation loss on DATA (meshmoe_torch.validation_loss) against EVAL_H5's."""
    loss, tokens = meshmoe_torch.validation_loss(model, data)
    with h5py.File(eval_h5, "r") as f:
        want, want_tokens = float(f.attrs["valid_loss"]), float(f.attrs["valid_tokens"])
    rel = abs(loss - want) / abs(want)
    print(f"{'ok  ' if rel <= REL_TOL and tokens == want_tokens else 'FAIL'} {os.path.basename(path)}: {what} "
          f"{loss:.9g} over {tokens:.0f} tokens, meshmoe eval {want:.9g} over {want_tokens:.0f}: rel {rel:.2e} "
          f"(limit {REL_TOL:.0e})")
    if rel > REL_TOL or tokens != want_tokens:
        sys.exit(1)


def cmd_loss(path, data, eval_h5):
    check_loss(meshmoe_torch.load(path), "PyTorch", path, data, eval_h5)


def cmd_same(a, b):
    ta, _ = meshmoe_torch.read_safetensors(a)
    tb, _ = meshmoe_torch.read_safetensors(b)
    if sorted(ta) != sorted(tb):
        fail(f"{a} and {b} hold other names: {sorted(set(ta) ^ set(tb))}")
    for n in ta:
        if ta[n].shape != tb[n].shape or not np.array_equal(ta[n].numpy().view(np.uint32), tb[n].numpy().view(np.uint32)):
            fail(f"{n} differs between {a} and {b}")
    print(f"ok   {len(ta)} tensors bitwise equal: {os.path.basename(a)} {os.path.basename(b)}")


def cmd_upcycled(dense, moe):
    td, _ = meshmoe_torch.read_safetensors(dense)
    tm, _ = meshmoe_torch.read_safetensors(moe)
    experts = 0
    for n, t in tm.items():
        r = re.fullmatch(r"(blocks\.\d+)\.moe\.experts\.(w_in|w_out)", n)
        if r:
            src = td[f"{r.group(1)}.mlp.{r.group(2)}"]
            for e in range(t.shape[0]):
                if not np.array_equal(t[e].numpy().view(np.uint32), src.numpy().view(np.uint32)):
                    fail(f"{n}[{e}] is not the dense {r.group(1)}.mlp.{r.group(2)}")
            experts += t.shape[0]
        elif n.endswith(".moe.router.wg"):
            if n in td:
                fail(f"{n} is in the dense file")
        elif not np.array_equal(t.numpy().view(np.uint32), td[n].numpy().view(np.uint32)):
            fail(f"{n} is not the dense model's")
    if experts == 0:
        fail("no expert tensor in " + moe)
    print(f"ok   {experts} expert tensors bitwise the dense feed-forwards, every other tensor the dense model's")


def cmd_top1(dense, moe, data):
    """Block by block on one validation batch: the MoE output y and the dense FFN(h) of the same
    input h satisfy y = p_top(h) FFN(h), token by token, when no token is dropped (C = S here)."""
    md, mm = meshmoe_torch.load(dense), meshmoe_torch.load(moe)
    cfg = mm.cfg
    split, languages, info = meshmoe_torch.read_valid(data)
    batch = meshmoe_torch.EvalBatches(split, cfg, info, shuffle=True).next(cfg.optim.batch_size)
    seen, worst = [], 0.0

    def hook(block):
        def moe(x, pre):
            y = meshmoe_torch.MeshmoeModel.moe(mm, x, pre)
            i = pre.split(".")[1]
            f = md.ffn(x, md.p(f"blocks.{i}.mlp.w_in"), md.p(f"blocks.{i}.mlp.w_out"), cfg.model.d_ff)
            p = torch.softmax((x @ mm.p(pre + ".router.wg")).double(), -1).max(-1).values.float()
            seen.append((y, p.unsqueeze(1) * f))
            return y
        return moe

    mm.moe = hook(None)
    mm(batch["inputs"], batch["segment"], batch["position"])
    for y, want in seen:
        worst = max(worst, float((y - want).abs().max() / want.abs().max()))
    ok = seen and worst <= 1e-6  # one fp32 product with the gate: a few ulps of the largest output
    print(f"{'ok  ' if ok else 'FAIL'} Switch top-1 upcycled: MoE output = p_top x dense FFN in {len(seen)} block(s), "
          f"worst {worst:.2e} of the largest (limit 1e-6)")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"table": cmd_table, "loss": cmd_loss, "same": cmd_same, "upcycled": cmd_upcycled, "top1": cmd_top1}[cmd](*args)
