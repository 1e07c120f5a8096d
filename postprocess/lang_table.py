#!/usr/bin/python3
"""Validation loss per language from a run's metrics.h5, for the largest and smallest languages.

    /usr/bin/python3 postprocess/lang_table.py runs/m4-switch-tiny [--top 10] [--dataset data/gettext.h5]

Languages with validation pairs are ranked by their training pairs in the dataset the run used
(root attribute data_path of metrics.h5, or --dataset). Prints a markdown table; the numbers are those of the
last evaluation in the file.
"""
import argparse
import os
import sys

import h5py
import numpy as np


def last_eval(metrics):
    loss = metrics["eval/lang_loss"][()]
    rows = [i for i in range(loss.shape[0]) if np.isfinite(metrics["eval/loss"][i])]
    if not rows:
        sys.exit("no evaluation in " + metrics.filename)
    r = rows[-1]
    return int(metrics["step"][r]), float(metrics["eval/loss"][r]), loss[r], metrics["eval/lang_tokens"][r]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="run directory (holding metrics.h5)")
    ap.add_argument("--top", type=int, default=10, help="languages at each end of the ranking")
    ap.add_argument("--dataset", help="dataset file (default: the run's data.path)")
    a = ap.parse_args()
    with h5py.File(os.path.join(a.run, "metrics.h5"), "r") as m:
        langs = m.attrs["languages"]
        langs = (langs.decode() if isinstance(langs, bytes) else str(langs)).split(",")
        data_path = a.dataset or m.attrs["data_path"]
        data_path = data_path.decode() if isinstance(data_path, bytes) else str(data_path)
        step, overall, lang_loss, lang_tokens = last_eval(m)
    with h5py.File(data_path, "r") as d:
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in d["languages/name"][()]]
        pairs = dict(zip(names, d["languages/train_pairs"][()]))
        valid_pairs = dict(zip(names, d["languages/valid_pairs"][()]))
    # Languages without validation pairs cannot be scored: rank the others.
    order = sorted((i for i in range(len(langs)) if valid_pairs.get(langs[i], 0) > 0),
                   key=lambda i: -pairs.get(langs[i], 0))
    k = min(a.top, len(order) // 2) if len(order) > 1 else len(order)
    print(f"validation loss at step {step}: {overall:.4f} nats/token overall\n")
    print("| rank | language | train pairs | valid tokens | valid loss |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for pos in list(range(k)) + list(range(len(order) - k, len(order))):
        i = order[pos]
        loss = "n/a" if not np.isfinite(lang_loss[i]) else f"{lang_loss[i]:.4f}"
        print(f"| {pos + 1} | {langs[i]} | {pairs.get(langs[i], 0)} | {int(lang_tokens[i])} | {loss} |")
        if pos == k - 1 and len(order) > 2 * k:
            print("| ... | | | | |")


if __name__ == "__main__":
    main()
