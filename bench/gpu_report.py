#!/usr/bin/env python3
"""Report of bench/gpu.sh: reads OUT/peak.txt, OUT/<deck>-<prec>/metrics.h5 and OUT/torch-<deck>-<prec>.txt,
prints one markdown table: per deck and precision (fp32, bf16), meshmoe's tokens/s (median over
the steps after the first three), its model TFLOP/s (the deck's train FLOPs per token, as MFU
counts them) and MFU against the bf16 and fp32 GEMM ceilings, PyTorch eager's tokens/s at the same
precision (fp32 without TF32; bf16 autocast), and meshmoe over PyTorch.
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


def torch_tps(out, run):
    path = os.path.join(out, f"torch-{run}.txt")
    m = re.search(r"step_s ([0-9.]+) tokens ([0-9]+)", open(path).read()) if os.path.exists(path) else None
    return int(m.group(2)) / float(m.group(1)) if m else None


def main():
    out = sys.argv[1]
    bf16, fp32 = ceilings(out)
    print(f"ceilings: cuBLAS bf16 {bf16:.0f} TFLOP/s, fp32 {fp32:.1f} TFLOP/s")
    print("| deck | precision | meshmoe tok/s | model TFLOP/s | MFU (bf16 ceiling) | MFU (fp32 ceiling) | PyTorch eager tok/s | meshmoe / PyTorch |")
    print("|---|---|---|---|---|---|---|---|")
    runs = sorted({m.group(1) for f in os.listdir(out) if (m := re.match(r"(.+)-(fp32|bf16)\.log$", f))} |
                  {m.group(1) for f in os.listdir(out) if (m := re.match(r"torch-(.+)-(fp32|bf16)\.txt$", f))})
    fmt = lambda v, f: "-" if v is None else f.format(v)
    for d in runs:
        for prec in ("fp32", "bf16"):
            run = f"{d}-{prec}"
            tps, fpt = meshmoe(out, run)
            peer = torch_tps(out, run)
            if tps is None and peer is None:
                continue
            tf = tps * fpt / 1e12 if tps else None
            print(f"| {d} | {prec} | {fmt(tps, '{:.0f}')} | {fmt(tf, '{:.1f}')} | {fmt(tf and tf / bf16, '{:.1%}')} | "
                  f"{fmt(tf and tf / fp32, '{:.1%}')} | {fmt(peer, '{:.0f}')} | {fmt(tps and peer and tps / peer, '{:.2f}x')} |")


if __name__ == "__main__":
    main()
