#!/usr/bin/python3
"""Report of bench/speed.sh: reads OUT/gemm.txt (the sgemm ceiling), OUT/<run>/metrics.h5 and
OUT/torch-<deck>.txt, prints two markdown tables:
  1. per run: step time, tokens/s, model GFLOP/s (the deck's train FLOPs per token, as MFU counts
     them), fraction of the ceiling, step time against the dense peer, the fraction of routing
     choices dropped for capacity (model FLOPs count them, the experts do not compute them: a
     router that has not learnt to balance yet flatters an MoE run), PyTorch's step time and the
     speed-up over it;
  2. the profile: each phase's share of the step (phases nest: tensor_allreduce inside attention,
     moe_alltoall inside dispatch/combine; "other" is what no top-level phase covers: embedding,
     LayerNorms, residual adds, the loss weights, the finite scans).
Steady state: the median over the steps after the first three (first-touch allocations, warm-up).
Usage: bench/speed_report.py OUT"""
import glob
import os
import re
import sys

import h5py
import numpy as np

from benchlib import step_tokens

# Top-level phases (they do not nest in each other); the rest are shown but not summed.
TOP = ["attention", "dense_ffn", "gate", "dispatch", "expert", "combine", "head_loss", "pipeline_wait",
       "pipeline_recompute", "grad_overlap", "grad_allreduce", "optimizer"]
INNER = ["tensor_allreduce", "moe_alltoall", "moe_allreduce"]


def ceiling(out):
    text = open(os.path.join(out, "gemm.txt")).read()
    return float(re.search(r"^ceiling ([0-9.]+) GFLOP/s", text, re.M).group(1)) * 1e9


def run_summary(run_dir):
    with h5py.File(os.path.join(run_dir, "metrics.h5"), "r") as f:
        flops = float(f.attrs["train_flops_per_token"])
        tps = f["tokens_per_s"][()]
        keep = slice(3, None) if len(tps) > 5 else slice(0, None)
        tps = float(np.median(tps[keep]))
        tokens = step_tokens(f)
        step = tokens / tps
        phases = {}
        for name in TOP + INNER:
            if f"time/{name}" in f:
                phases[name] = float(np.median(f[f"time/{name}"][()][keep]))
        drops = [float(np.median(f[f"moe/{l}/dropped_fraction"][()][keep])) for l in f.get("moe", {})
                 if f"moe/{l}/dropped_fraction" in f]
        return dict(step=step, tps=tps, flops=flops * tps, phases=phases, dropped=np.mean(drops) if drops else None)


def torch_step(out, run):
    path = os.path.join(out, f"torch-{run}.txt")
    if not os.path.exists(path):
        return None
    m = re.search(r"step_s ([0-9.]+)", open(path).read())
    return float(m.group(1)) if m else None


def main():
    out = sys.argv[1]
    peak = ceiling(out)
    runs = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(out, "*", "metrics.h5")))
    order = ["speed-dense-512", "speed-switch-512", "speed-gshard-512", "speed-switch-512-dropless", "speed-gshard-512-dropless"]
    runs.sort(key=lambda r: (order.index(os.path.basename(r)) if os.path.basename(r) in order else 9, r))
    rows = {os.path.basename(r): run_summary(r) for r in runs}
    dense = rows.get("speed-dense-512")
    print(f"\nsgemm ceiling (this run): {peak / 1e9:.1f} GFLOP/s\n")
    print("| run | step (s) | tokens/s | model GFLOP/s | of ceiling | vs dense | dropped | PyTorch step (s) | speed-up |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, s in rows.items():
        vs = f"{s['step'] / dense['step']:.2f}x" if dense and name.startswith("speed-") else ""
        t = torch_step(out, name) if not name.endswith("-dropless") else None
        ts = f"{t:.3f}" if t else ""
        up = f"{t / s['step']:.2f}x" if t else ""
        drop = f"{100 * s['dropped']:.0f}%" if s["dropped"] is not None else ""
        print(f"| {name} | {s['step']:.3f} | {s['tps']:.0f} | {s['flops'] / 1e9:.1f} | {100 * s['flops'] / peak:.1f}% "
              f"| {vs} | {drop} | {ts} | {up} |")
    one = rows.get("gpt2-124m-dense")
    for name, s in rows.items():
        if one and name.startswith("gpt2-124m-dense-data"):
            print(f"\n{name}: {s['tps'] / one['tps']:.2f}x the tokens/s of gpt2-124m-dense (1 rank)", end="")
    print()
    names = [n for n in TOP + INNER if any(n in s["phases"] and s["phases"][n] > 0 for s in rows.values())]
    print("\nProfile: share of the step time per phase (" + ", ".join(INNER) + " are inside other phases)\n")
    print("| run | " + " | ".join(names) + " | other |")
    print("| --- |" + " ---: |" * (len(names) + 1))
    for name, s in rows.items():
        cells = [f"{100 * s['phases'].get(n, 0) / s['step']:.1f}%" for n in names]
        other = s["step"] - sum(s["phases"].get(n, 0) for n in TOP)
        print(f"| {name} | " + " | ".join(cells) + f" | {100 * other / s['step']:.1f}% |")


if __name__ == "__main__":
    main()
