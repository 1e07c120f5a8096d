#!/usr/bin/env python3
"""Validation-loss curves of bench/upcycle.sh in one figure, and their table (markdown) on stdout.
The continued runs are drawn from the dense run's last step on (their step + DENSE_STEPS).
Usage: bench/upcycle_plot.py OUT DENSE_STEPS [-o FIGURE.png]"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "postprocess"))
from common import Run  # noqa: E402

RUNS = [("dense", 0), ("dense-continued", 1), ("switch-upcycled", 1), ("switch-scratch", 0)]


def curve(run_dir):
    steps, loss = Run(run_dir).finite("eval/loss")
    return [int(s) for s in steps], [float(v) for v in loss]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("dense_steps", type=int)
    ap.add_argument("-o", "--output", default="upcycle.png")
    a = ap.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = {}
    for name, shifted in RUNS:
        steps, loss = curve(os.path.join(a.out, name))
        steps = [s + a.dense_steps * shifted for s in steps]
        rows[name] = dict(zip(steps, loss))
        ax.plot(steps, loss, marker="o", markersize=3, label=name)
    ax.axvline(a.dense_steps, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("training step (the continued runs start at the dense run's last step)")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title("Sparse upcycling on gettext: Switch (E = 8) from the dense tiny model")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)
    steps = sorted(set().union(*[r.keys() for r in rows.values()]))
    print("| step | " + " | ".join(n for n, _ in RUNS) + " |")
    print("| ---: |" + " ---: |" * len(RUNS))
    for s in steps:
        print(f"| {s} | " + " | ".join(f"{rows[n][s]:.4f}" if s in rows[n] else "" for n, _ in RUNS) + " |")
    print(f"figure: {a.output}")


if __name__ == "__main__":
    main()
