#!/usr/bin/env python3
"""Report of bench/gpu.sh: reads OUT/peak.txt, OUT/<deck>/metrics.h5 and OUT/torch-<deck>-<prec>.txt,
prints one markdown table: per deck, meshmoe's tokens/s (median over the steps after the first
three), its model TFLOP/s (the deck's train FLOPs per token, as MFU counts them) and MFU against
the bf16 and fp32 GEMM ceilings, PyTorch eager's tokens/s in fp32 and bf16, and meshmoe over each.
Usage: bench/gpu_report.py OUT"""
import os
import re
import sys

import h5py
import numpy as np


def ceilings(out):
    text = open(os.path.join(out, "peak.txt")).read()
    get = lambda k: float(re.search(rf"^ceiling {k} ([0-9.]+)", text, re.M).group(1))
    return get("gemm_bf16_n8192"), get("gemm_fp32_n8192")


def meshmoe(out, deck):
    path = os.path.join(out, deck, "metrics.h5")
    if not os.path.exists(path):
        return None, None
    with h5py.File(path, "r") as f:
        tps = f["tokens_per_s"][()]
        tps = float(np.median(tps[3:] if len(tps) > 5 else tps))
        return tps, float(f.attrs["train_flops_per_token"])


def torch_tps(out, deck, prec):
    path = os.path.join(out, f"torch-{deck}-{prec}.txt")
    m = re.search(r"step_s ([0-9.]+) tokens ([0-9]+)", open(path).read()) if os.path.exists(path) else None
    return int(m.group(2)) / float(m.group(1)) if m else None


def main():
    out = sys.argv[1]
    bf16, fp32 = ceilings(out)
    print(f"ceilings: cuBLAS bf16 {bf16:.0f} TFLOP/s, fp32 {fp32:.1f} TFLOP/s")
    print("| deck | meshmoe tok/s | model TFLOP/s | MFU (bf16 ceiling) | MFU (fp32 ceiling) | torch fp32 tok/s | torch bf16 tok/s | meshmoe / torch fp32 | meshmoe / torch bf16 |")
    print("|---|---|---|---|---|---|---|---|---|")
    decks = sorted(d for d in os.listdir(out) if os.path.isdir(os.path.join(out, d)))
    decks += sorted({m.group(1) for f in os.listdir(out) if (m := re.match(r"torch-(.+)-fp32\.txt$", f))} - set(decks))
    fmt = lambda v, f: "-" if v is None else f.format(v)
    for d in decks:
        tps, fpt = meshmoe(out, d)
        t32, t16 = torch_tps(out, d, "fp32"), torch_tps(out, d, "bf16")
        tf = tps * fpt / 1e12 if tps else None
        print(f"| {d} | {fmt(tps, '{:.0f}')} | {fmt(tf, '{:.1f}')} | {fmt(tf and tf / bf16, '{:.1%}')} | "
              f"{fmt(tf and tf / fp32, '{:.1%}')} | {fmt(t32, '{:.0f}')} | {fmt(t16, '{:.0f}')} | "
              f"{fmt(tps and t32 and tps / t32, '{:.2f}x')} | {fmt(tps and t16 and tps / t16, '{:.2f}x')} |")


if __name__ == "__main__":
    main()
