#!/usr/bin/python3
"""Per-language BLEU of an MoE model minus a dense baseline, languages from the largest training set
to the smallest (GShard figure 6: the gain of the MoE model over the bilingual/dense baseline,
high- to low-resource).

    /usr/bin/python3 postprocess/bleu_report.py MOE DENSE [-o FIG.png]

MOE and DENSE are each
  - a file written by `meshmoe eval` (eval-<step>.h5): BLEU per language of its translations;
  - a run directory: its newest eval-<step>.h5, or, without one, its metrics.h5;
  - a metrics.h5 of a run trained with eval.bleu_every: the last logged /eval/bleu row (greedy
    translations of the first eval.bleu_examples pairs), languages sized by the dataset's
    /languages/train_pairs (root attribute data_path).
Prints the table (rank, language, training pairs, both BLEU scores, the difference) and writes the
figure (default bleu_delta.png). Languages that either side did not score are left out and named.
"""
import argparse
import glob
import math
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402

from common import fail, read_dataset_languages, string_list, text  # noqa: E402


def newest_eval(directory):
    found = []
    for p in glob.glob(os.path.join(directory, "eval-*.h5")):
        m = re.fullmatch(r"eval-(\d+)\.h5", os.path.basename(p))
        if m:
            found.append((int(m.group(1)), p))
    return max(found)[1] if found else None


def read_eval(path, f):
    g = f["languages"]
    names = [text(n) for n in g["name"][()]]
    what = f"{path} (meshmoe eval, step {int(f.attrs['step'])}, beam {int(f.attrs['beam'])})"
    return {n: (float(b), int(t)) for n, b, t in zip(names, g["bleu"][()], g["train_examples"][()])}, what


def read_metrics(path, f):
    if "eval/bleu" not in f:
        fail(f"{path}: no /eval/bleu (train with eval.bleu_every > 0, or run `meshmoe eval` on a checkpoint)")
    bleu = f["eval/bleu"][()]
    rows = np.flatnonzero(np.any(np.isfinite(bleu), axis=1))
    if rows.size == 0:
        fail(f"{path}: /eval/bleu holds no score yet")
    row = int(rows[-1])
    names = string_list(f.attrs.get("languages"))
    data = text(f.attrs.get("data_path", ""))
    try:
        pairs = read_dataset_languages(data)
    except OSError as e:
        fail(f"{path}: the training sizes come from its dataset: {e}")
    what = f"{path} (training's greedy scores, step {int(f['step'][row])})"
    return {n: (float(bleu[row, i]), pairs.get(n, (0, 0))[0]) for i, n in enumerate(names)}, what


def read_scores(arg):
    """{language: (BLEU, training pairs)} and a description of where they come from."""
    path = arg
    if os.path.isdir(arg):
        path = newest_eval(arg) or os.path.join(arg, "metrics.h5")
    if not os.path.exists(path):
        fail(f"{arg}: neither an eval-<step>.h5 nor a metrics.h5 there")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        fail(f"{path}: not readable as HDF5 ({e})")
    with f:
        if text(f.attrs.get("created_by", "")).startswith("meshmoe eval"):
            return read_eval(path, f)
        if "step" in f and "loss" in f:
            return read_metrics(path, f)
    fail(f"{path}: neither a `meshmoe eval` file nor a run's metrics.h5")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("moe", help="eval file, run directory or metrics.h5 of the MoE model")
    ap.add_argument("dense", help="the same of the dense baseline")
    ap.add_argument("-o", "--output", default="bleu_delta.png", help="figure to write (PNG)")
    a = ap.parse_args()
    moe, moe_what = read_scores(a.moe)
    dense, dense_what = read_scores(a.dense)
    both = [n for n in moe if n in dense and math.isfinite(moe[n][0]) and math.isfinite(dense[n][0])]
    left = sorted(set(moe) ^ set(dense) | {n for n in moe if n in dense and n not in both})
    if not both:
        fail("no language has a BLEU score on both sides")
    # Largest training set first (the MoE side's dataset; ties by name).
    both.sort(key=lambda n: (-moe[n][1], n))
    delta = np.array([moe[n][0] - dense[n][0] for n in both])
    print(f"# BLEU per language: MoE {moe_what} minus dense {dense_what}")
    print(f"{'rank':>4}  {'language':<10} {'train pairs':>11} {'BLEU MoE':>9} {'BLEU dense':>10} {'delta':>8}")
    for k, n in enumerate(both):
        print(f"{k + 1:>4}  {n:<10} {moe[n][1]:>11d} {moe[n][0]:>9.2f} {dense[n][0]:>10.2f} {delta[k]:>+8.2f}")
    print(f"mean delta {delta.mean():+.2f} BLEU over {len(both)} languages")
    if left:
        more = f" and {len(left) - 20} more" if len(left) > 20 else ""
        print(f"left out, not scored on both sides ({len(left)}): {', '.join(left[:20])}{more}")

    fig, ax = plt.subplots(figsize=(max(7, 0.22 * len(both) + 3), 4.5))
    x = np.arange(len(both))
    ax.bar(x, delta, color=["C2" if d >= 0 else "C3" for d in delta])
    if len(both) >= 3:  # the trend from high- to low-resource, as GShard's figure draws it
        ax.plot(x, np.polyval(np.polyfit(x, delta, 1), x), "k--", lw=1, label="linear trend")
        ax.legend(fontsize=8)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(both, rotation=90 if len(both) > 12 else 0, fontsize=7 if len(both) > 30 else 9)
    ax.set_xlabel("language, high to low resource (training pairs)")
    ax.set_ylabel("BLEU(MoE) - BLEU(dense)")
    ax.set_title(f"{os.path.basename(os.path.normpath(a.moe))} vs {os.path.basename(os.path.normpath(a.dense))}",
                 fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    try:
        fig.savefig(a.output, dpi=100)
    except OSError as e:
        fail(f"-o {a.output}: cannot write ({e})")
    print(f"figure: {a.output}")


if __name__ == "__main__":
    main()
