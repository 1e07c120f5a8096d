#!/usr/bin/python3
"""Validation loss per language from a run's metrics.h5, for the largest and smallest languages.

    /usr/bin/python3 postprocess/lang_table.py runs/m4-switch-tiny [--top 10] [--dataset data/gettext.h5]

Languages with validation pairs are ranked by their training pairs in the dataset the run used
(root attribute data_path of metrics.h5, or --dataset). Prints a markdown table; the numbers are those of the
last evaluation in the file, beside the target tokens the run trained per language up to its last row
(/data/lang_tokens, with their share: data.temperature's effect).
"""
import argparse
import sys

import numpy as np

from common import Run, fail, rank_languages, read_dataset_languages


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="run directory (holding metrics.h5)")
    ap.add_argument("--top", type=int, default=10, help="languages at each end of the ranking")
    ap.add_argument("--dataset", help="dataset file (default: the run's data.path)")
    a = ap.parse_args()
    run = Run(a.run)
    langs = run.languages
    ev = run.last_eval()
    if ev is None:
        sys.exit("no evaluation in " + run.metrics_path)
    step, overall, lang_loss, lang_tokens = ev
    try:
        info = read_dataset_languages(a.dataset or run.attrs["data_path"])
    except OSError as e:
        fail(f"{e} (pass --dataset)")
    # Languages without validation pairs cannot be scored: rank the others.
    order = rank_languages(langs, info)
    k = min(a.top, len(order) // 2) if len(order) > 1 else len(order)
    print(f"validation loss at step {step}: {overall:.4f} nats/token overall\n")
    trained = run.series.get("data/lang_tokens")
    trained = trained[-1] if trained is not None and len(trained) else np.zeros(len(langs))
    total = max(trained.sum(), 1)
    print("| rank | language | train pairs | trained tokens (share) | valid tokens | valid loss |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for pos in list(range(k)) + list(range(len(order) - k, len(order))):
        i = order[pos]
        loss = "n/a" if not np.isfinite(lang_loss[i]) else f"{lang_loss[i]:.4f}"
        print(f"| {pos + 1} | {langs[i]} | {info.get(langs[i], (0, 0))[0]} | {int(trained[i])} ({trained[i] / total:.1%}) "
              f"| {int(lang_tokens[i])} | {loss} |")
        if pos == k - 1 and len(order) > 2 * k:
            print("| ... | | | | | |")


if __name__ == "__main__":
    main()
