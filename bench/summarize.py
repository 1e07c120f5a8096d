#!/usr/bin/python3
"""Prints a markdown table of final validation loss and step time of several runs, with ratios
against the first run (the peer). Usage: bench/summarize.py RUN_DIR..."""
import os
import sys

import h5py
import numpy as np

from benchlib import step_tokens


def summary(run):
    with h5py.File(os.path.join(run, "metrics.h5"), "r") as f:
        ev = f["eval/loss"][()]
        last = np.where(np.isfinite(ev))[0][-1]
        tps = f["tokens_per_s"][()]
        tps = tps[np.isfinite(tps)]
        tokens = step_tokens(f)
        # Skip the first logging interval (start-up, first-touch allocations).
        steady = tps[1:] if len(tps) > 1 else tps
        return dict(step=int(f["step"][last]), valid=float(ev[last]), step_s=tokens / float(np.median(steady)),
                    mfu=float(np.nanmedian(f["mfu"][()])))


def main():
    runs = sys.argv[1:]
    rows = [(os.path.basename(r.rstrip("/")), summary(r)) for r in runs]
    peer = rows[0][1]
    print(f"\n| run | steps | valid loss | vs {rows[0][0]} | step time (s) | vs {rows[0][0]} | MFU |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, s in rows:
        print(f"| {name} | {s['step']} | {s['valid']:.4f} | {s['valid'] - peer['valid']:+.4f} | "
              f"{s['step_s']:.3f} | {s['step_s'] / peer['step_s']:.2f}x | {100 * s['mfu']:.1f}% |")


if __name__ == "__main__":
    main()
