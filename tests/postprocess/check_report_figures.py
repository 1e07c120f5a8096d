#!/usr/bin/python3
"""report.py's figures on made-up metrics files (tests/scripts/report_figures.sh):

  - a value that is missing (NaN) is a gap, not a zero: the stacked bars of time_<run>.png are drawn
    only at the rows that have the phase's time, a nested phase's line keeps its NaN;
  - legends only for what ran: pipeline_wait and pipeline_recompute with mesh.pipe > 1 only,
    tensor_allreduce with mesh.tensor > 1 only, a phase with no time never;
  - the per-language figure stays readable with 168 languages: the 12 largest one by one, the other
    156 as one group whose loss is their summed loss over their summed tokens, in a 900 x 700 px
    figure;
  - the root attributes `languages` and `lang_sampling_probability` read as arrays and, from older
    files, as comma-joined text.
"""
import os
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "postprocess"))
import report  # noqa: E402
from common import Run, float_list, string_list  # noqa: E402

errors = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        errors.append(what)


def write_metrics(path, deck, languages, series, as_text=False):
    with h5py.File(path, "w") as f:
        f["deck"] = deck
        f.attrs["rows"] = len(series["step"])
        if as_text:
            f.attrs["languages"] = ",".join(languages)
            f.attrs["lang_sampling_probability"] = ",".join(["0.5", "0.5"][:len(languages)])
        else:
            f.attrs["languages"] = np.array(languages, dtype=h5py.string_dtype())
            f.attrs["lang_sampling_probability"] = np.full(len(languages), 1.0 / len(languages))
        for name, v in series.items():
            f[name] = v


def main():
    d = tempfile.mkdtemp()
    nan = np.nan
    step = np.array([2, 4, 5, 6, 8])  # row 5: an evaluation-only row, no training time
    series = {"step": step, "loss": np.array([3.0, 2.5, nan, 2.2, 2.0]),
              "time/attention": np.array([0.1, 0.1, nan, 0.1, 0.1]),
              "time/moe_alltoall": np.array([0.02, nan, nan, 0.02, 0.02]),  # row 4: not recorded
              "time/pipeline_wait": np.array([1e-6, 1e-6, nan, 1e-6, 1e-6]),
              "time/tensor_allreduce": np.array([1e-6, 1e-6, nan, 1e-6, 1e-6]),
              "time/teacher_forward": np.zeros(5),
              "eval/loss": np.array([nan, nan, 2.4, nan, nan])}
    one = os.path.join(d, "pipe1.h5")
    write_metrics(one, "[mesh]\npipe = 1\ndata = 2\n", ["de", "fr"], series)
    two = os.path.join(d, "pipe2.h5")
    write_metrics(two, "[mesh]\npipe = 2\ntensor = 2\n", ["de", "fr"], series, as_text=True)

    r1, r2 = Run(one), Run(two)
    check(r1.languages == ["de", "fr"] and r2.languages == ["de", "fr"], "languages from a string array and from text")
    check(float_list(h5py.File(one, "r").attrs["lang_sampling_probability"]) == [0.5, 0.5]
          and float_list("0.5,0.5") == [0.5, 0.5] and string_list(None) == [], "lang_sampling_probability both ways")

    fig = report.time_figure(r1, "pipe1")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    check(sorted(labels) == ["attention", "moe_alltoall (nested, not stacked)"],
          f"pipe = 1, tensor = 1: legend only for what ran: {labels}")
    bars = [p for p in fig.axes[0].patches]
    check(len(bars) == 4, f"attention drawn at its 4 rows with a time, none at the evaluation row ({len(bars)} bars)")
    line = fig.axes[0].get_lines()[0].get_ydata()
    check(np.isnan(line[1]) and np.isnan(line[2]) and line[0] == 0.02,
          f"moe_alltoall's missing rows stay gaps (NaN), not 0: {list(line)}")
    labels2 = report.time_figure(r2, "pipe2").axes[0].get_legend_handles_labels()[1]
    check("pipeline_wait" in labels2 and "tensor_allreduce (nested, not stacked)" in labels2,
          f"pipe = 2, tensor = 2: pipeline_wait and tensor_allreduce drawn: {labels2}")

    # 168 languages, largest first; the last evaluation's losses and tokens.
    names = [f"l{i:03d}" for i in range(168)]
    rng = np.random.default_rng(1)
    loss, tokens = rng.uniform(1, 4, 168), rng.integers(1, 50, 168).astype(float)
    tokens[100] = 0
    loss[100] = nan
    lang_series = {"step": np.array([10]), "loss": np.array([2.0]), "eval/loss": np.array([2.0]),
                   "eval/lang_loss": loss[None, :], "eval/lang_tokens": tokens[None, :]}
    base_path = os.path.join(d, "base.h5")
    write_metrics(base_path, "[mesh]\n", names, lang_series)
    base = Run(base_path)
    fig = report.language_figure([base], ["run"], [base.last_eval()], base, "base", base.last_eval(), names, "x.h5")
    w, h = fig.get_size_inches() * report.DPI
    ticks = [t.get_text() for t in fig.axes[1].get_xticklabels()]
    check(w <= 1000 and h <= 800, f"the figure is {w:.0f} x {h:.0f} px")
    check(ticks == names[:12] + ["other 156"], f"12 languages and one group: {ticks[:3]} ... {ticks[-2:]}")
    rest = slice(12, None)
    ok = tokens[rest] > 0
    want = np.sum(loss[rest][ok] * tokens[rest][ok]) / np.sum(tokens[rest][ok])
    got = fig.axes[0].get_lines()[0].get_ydata()[-1]
    check(abs(got - want) <= 1e-12 * want, f"the group's loss is its summed loss over its tokens: {got} vs {want}")
    if errors:
        print(f"check_report_figures: {len(errors)} failure(s)")
        return 1
    print("check_report_figures: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
