#!/usr/bin/python3
"""Plots and a markdown summary of one or several meshmoe runs.

    /usr/bin/python3 postprocess/report.py RUN... [-o OUTDIR] [--baseline RUN] [--dataset FILE]
                                           [--bench-comm FILE...] [--sweep-key SECTION.KEY]

RUN is a run directory (holding metrics.h5) or a metrics.h5 file. Writes OUTDIR/report.md and, next to
it, PNG figures:
  loss.png                  training loss (lines) and validation loss (markers) against step, all runs
  expert_load_<run>.png     per MoE layer a heatmap of the expert load (expert x step), and the dropped
                            fraction of every MoE layer against step
  time_<run>.png            seconds per phase in each logging interval, stacked (GShard figure 8), a
                            gap where a row has no value, only the phases the run's mesh has; nested phases (tensor_allreduce inside attention/dense_ffn, moe_alltoall and
                            moe_allreduce inside the MoE stages, pipeline_recompute around a forward)
                            drawn as lines, not stacked
  lang_loss.png             with --baseline: per-language validation loss of each run and of the dense
                            baseline, languages from largest to smallest training set (GShard figure 6):
                            the 12 largest, then the rest as one group (report.md's table has them all)
  comm.png                  with --bench-comm: collective time and bus bandwidth against message size
                            (GShard figure 9)
  scaling.png               with two or more runs differing in one deck key (or --sweep-key): final losses
                            and median tokens/s against that key
Every number in report.md's tables is the HDF5 value printed with common.FORMATS.
"""
import argparse
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402

from common import (Run, compare_table, deck_value, differing_keys, fail, fmt, md_table,  # noqa: E402
                    rank_languages, read_dataset_languages, text, unique_labels)

# Phases that run inside other timed phases (src/train/trainer.cpp kPhases): stacking them would
# count their time twice, so they are drawn as lines over the stack.
NESTED_PHASES = {
    "tensor_allreduce": "inside attention and dense_ffn",
    "moe_alltoall": "inside dispatch and combine",
    "moe_allreduce": "inside expert or combine",
    "pipeline_recompute": "a stage's forward again, its attention/FFN/MoE phases counted there too",
}
# The trainer's order of phases (roughly the order within a step); others go last.
PHASE_ORDER = ["teacher_forward", "attention", "dense_ffn", "gate", "dispatch", "expert", "combine", "moe_alltoall", "moe_allreduce",
               "head_loss", "tensor_allreduce", "pipeline_wait", "pipeline_recompute", "grad_allreduce", "optimizer",
               "eval"]
DPI = 100
LINES = ["-", "--", ":", "-."]  # runs cycle through these too, so identical curves stay visible


def file_label(label):
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "run"


def colors(n):
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def save(fig, outdir, name):
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, name), dpi=DPI)
    plt.close(fig)
    return name


def plot_loss(runs, labels, outdir):
    fig, ax = plt.subplots(figsize=(8, 5))
    for k, (r, label, c) in enumerate(zip(runs, labels, colors(len(runs)))):
        s, v = r.finite("loss")
        ax.plot(s, v, LINES[k % len(LINES)], color=c, lw=1.2, label=f"{label} train")
        s, v = r.finite("eval/loss")
        if v.size:
            ax.plot(s, v, "o", color=c, ms=7 - 1.5 * (k % 3), label=f"{label} valid")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("training (lines) and validation (markers) loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, outdir, "loss.png")


def edges(x):
    """Cell edges around sorted centres x (for pcolormesh)."""
    x = np.asarray(x, dtype=float)
    if x.size == 1:
        return np.array([x[0] - 0.5, x[0] + 0.5])
    mid = (x[1:] + x[:-1]) / 2
    return np.concatenate([[x[0] - (mid[0] - x[0])], mid, [x[-1] + (x[-1] - mid[-1])]])


def plot_expert_load(run, label, outdir):
    layers = run.moe_layers()
    fig, axes = plt.subplots(len(layers) + 1, 1, figsize=(8, 2.4 * len(layers) + 2.6), squeeze=False)
    axes = axes[:, 0]
    for ax, layer in zip(axes, layers):
        load = run.series[f"moe/{layer}/expert_load"]  # [rows, E]
        ok = np.all(np.isfinite(load), axis=1)
        E = load.shape[1]
        im = ax.pcolormesh(edges(run.step[ok]), np.arange(E + 1) - 0.5, load[ok].T, cmap="viridis",
                           shading="flat", vmin=0)
        ax.set_ylabel("expert")
        ax.set_title(f"{label} {layer}: expert load (fraction of dispatched choices; uniform = {1 / E:.3g})",
                     fontsize=9)
        fig.colorbar(im, ax=ax, pad=0.01)
    ax = axes[-1]
    for layer, c in zip(layers, colors(len(layers))):
        s, v = run.finite(f"moe/{layer}/dropped_fraction")
        ax.plot(s, v, "-o", ms=3, color=c, label=layer)
    ax.set_xlabel("step")
    ax.set_ylabel("dropped fraction")
    ax.set_title("fraction of token-to-expert choices dropped for capacity", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, outdir, f"expert_load_{file_label(label)}.png")


def ran_phases(run):
    """The phases this run timed: some time recorded, and the mesh has the axis the phase waits on
    (a pipe = 1 run records no pipeline wait worth a legend entry, a tensor = 1 run no tensor
    all-reduce)."""
    pipe, tensor = int(run.deck.get("mesh.pipe", 1)), int(run.deck.get("mesh.tensor", 1))
    needs = {"pipeline_wait": pipe > 1, "pipeline_recompute": pipe > 1, "tensor_allreduce": tensor > 1}
    phases = [p for p in run.phases() if np.nansum(np.abs(run.series[f"time/{p}"])) > 0 and needs.get(p, True)]
    phases.sort(key=lambda p: (PHASE_ORDER.index(p) if p in PHASE_ORDER else len(PHASE_ORDER), p))
    return phases


def time_figure(run, label):
    """The stacked phase times of one run. A row without a value (an evaluation-only row, a phase
    not yet recorded) is a gap, not a zero."""
    steps = run.step
    phases = ran_phases(run)
    stacked = [p for p in phases if p not in NESTED_PHASES]
    nested = [p for p in phases if p in NESTED_PHASES]
    fig, ax = plt.subplots(figsize=(9, 5))
    cols = colors(len(stacked) + len(nested))
    bottom = np.zeros(len(steps))
    gaps = np.diff(np.unique(steps))
    width = 0.8 * (gaps.min() if gaps.size else 1)
    for p, c in zip(stacked, cols):
        v = run.series[f"time/{p}"]
        ok = np.isfinite(v)
        if len(steps) <= 300:
            ax.bar(steps[ok], v[ok], width, bottom=bottom[ok], color=c, label=p)
        else:
            ax.fill_between(steps, bottom, np.where(ok, bottom + np.nan_to_num(v), np.nan), color=c, label=p,
                            step="mid", lw=0)
        bottom = bottom + np.nan_to_num(v)
    for p, c in zip(nested, cols[len(stacked):]):
        ax.plot(steps, run.series[f"time/{p}"], "--", color=c, lw=1.5, label=f"{p} (nested, not stacked)")
    if not phases:
        ax.text(0.5, 0.5, "no phase time recorded", transform=ax.transAxes, ha="center")
    log_every = run.deck.get("run.log_every", "?")
    ax.set_xlabel("step")
    ax.set_ylabel(f"seconds per logging interval ({log_every} steps), max over ranks")
    ax.set_title(f"{label}: time per phase ({run.attrs.get('mesh', '')})", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    if phases:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def plot_time(run, label, outdir):
    return save(time_figure(run, label), outdir, f"time_{file_label(label)}.png")


# The per-language figure shows this many of the largest languages one by one and the rest as one
# group, so that its labels stay readable whatever the dataset (report.md's table lists every one).
LANG_FIGURE_TOP = 12


def language_groups(names, top=LANG_FIGURE_TOP):
    """[(label, [language, ...])]: the `top` first of `names` (largest first) alone, the rest together."""
    groups = [(n, [n]) for n in names[:top]]
    if len(names) > top:
        groups.append((f"other {len(names) - top}", list(names[top:])))
    return groups


def group_loss(run, ev, members):
    """Validation loss of a group of languages: their summed loss over their summed tokens (as
    /eval/loss sums over languages); NaN when none of them has a token."""
    if ev is None:
        return np.nan
    idx = [run.languages.index(m) for m in members if m in run.languages]
    loss, tokens = np.asarray(ev[2], dtype=float)[idx], np.asarray(ev[3], dtype=float)[idx]
    ok = np.isfinite(loss) & (tokens > 0)
    return float(np.sum(loss[ok] * tokens[ok]) / np.sum(tokens[ok])) if ok.any() else np.nan


def language_figure(runs, labels, evals, base, base_label, be, names, path):
    groups = language_groups(names)
    base_loss = np.array([group_loss(base, be, m) for _, m in groups])
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    x = np.arange(len(groups))
    ax.plot(x, base_loss, "k-s", ms=4, label=f"{base_label} (baseline)")
    width = 0.8 / len(runs)  # grouped bars, one per run
    for k, (r, ev, label, c) in enumerate(zip(runs, evals, labels, colors(len(runs)))):
        r_loss = np.array([group_loss(r, ev, m) for _, m in groups])
        ax.plot(x, r_loss, LINES[k % len(LINES)], marker="o", color=c, ms=6 - 1.5 * (k % 3), label=label)
        ax2.bar(x - 0.4 + (k + 0.5) * width, base_loss - r_loss, width, color=c, label=label)
    ax.set_ylabel("validation loss (nats/token)")
    rest = f"; the other {len(names) - LANG_FIGURE_TOP} together" if len(names) > LANG_FIGURE_TOP else ""
    ax.set_title(f"per-language validation loss at the last evaluation; the {min(len(names), LANG_FIGURE_TOP)} "
                 f"largest languages by training pairs{rest} ({os.path.basename(path)})", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax2.axhline(0, color="k", lw=0.8)
    ax2.set_ylabel("baseline - run (> 0: run better)")
    ax2.set_xticks(x)
    ax2.set_xticklabels([g for g, _ in groups], rotation=45, ha="right", fontsize=9)
    ax2.set_xlabel("language (largest training set first)")
    ax2.grid(alpha=0.3, axis="y")
    return fig


def language_section(runs, labels, base, base_label, dataset, outdir):
    """Per-language validation loss of each run against the baseline: (markdown, png or None)."""
    path = dataset or base.attrs.get("data_path", "")
    try:
        pairs = read_dataset_languages(path)
    except OSError as e:
        return f"Per-language comparison skipped: {e} (pass --dataset).\n", None
    be = base.last_eval()
    if be is None:
        return f"Per-language comparison skipped: the baseline {base_label} has no evaluation.\n", None
    evals = [r.last_eval() for r in runs]
    order = rank_languages(base.languages, pairs)
    names = [base.languages[i] for i in order]

    def loss_of(run, ev, lang):
        if ev is None or lang not in run.languages:
            return np.nan
        return float(ev[2][run.languages.index(lang)])

    base_loss = np.array([loss_of(base, be, n) for n in names])
    run_loss = [np.array([loss_of(r, ev, n) for n in names]) for r, ev in zip(runs, evals)]

    fig = language_figure(runs, labels, evals, base, base_label, be, names, path)
    png = save(fig, outdir, "lang_loss.png")

    header = ["rank", "language", "train pairs", f"{base_label} (baseline)"]
    for label in labels:
        header += [label, f"{base_label} - {label}"]
    rows = []
    for k, name in enumerate(names):
        row = [k + 1, name, pairs[name][0], fmt(base_loss[k], "loss")]
        for r_loss in run_loss:
            row += [fmt(r_loss[k], "loss"), fmt(base_loss[k] - r_loss[k], "loss")]
        rows.append(row)
    steps = ", ".join(f"{label} step {ev[0] if ev else 'n/a'}" for label, ev in zip(labels, evals))
    md = (f"Validation loss (nats/token) per language at the last evaluation ({base_label} step {be[0]}, "
          f"{steps}); languages with validation pairs, ordered by training pairs in `{path}`. "
          "n/a: no validation token of that language in the evaluated batches.\n\n"
          + md_table(header, rows, "rlr" + "r" * (len(header) - 3)) + "\n")
    return md, png


def read_bench(path):
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        fail(f"{path}: not readable as HDF5 ({e})")
    with f:
        if "sizes" not in f or text(f.attrs.get("created_by", "")).split(" ")[:2] != ["meshmoe", "bench-comm"]:
            fail(f"{path}: not a file written by meshmoe bench-comm (no /sizes or created_by)")
        ops = {op: {d: f[f"{op}/{d}"][()] for d in f[op]} for op in f if op != "sizes"}
        return {"sizes": f["sizes"][()], "ops": ops,
                "title": f"{os.path.basename(path)}: mesh {text(f.attrs.get('mesh', '?'))}, "
                         f"axis {text(f.attrs.get('axis', '?'))} ({f.attrs.get('axis_ranks', '?')} ranks)"}


def comm_section(paths, outdir):
    benches = [read_bench(p) for p in paths]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    styles = ["-o", "--s", ":^", "-.v"]
    rows = []
    ops = sorted({op for b in benches for op in b["ops"]})
    cols = dict(zip(ops, colors(len(ops))))
    for k, (path, b) in enumerate(zip(paths, benches)):
        for op, d in b["ops"].items():
            label = op if len(benches) == 1 else f"{op} ({os.path.basename(path)})"
            ax.loglog(b["sizes"], d["time_s"] * 1e6, styles[k % 4], color=cols[op], label=label)
            ax2.semilogx(b["sizes"], d["busbw"], styles[k % 4], color=cols[op], label=label)
            for i, size in enumerate(b["sizes"]):
                rows.append([os.path.basename(path), op, int(size), int(d["bytes"][i]),
                             fmt(d["time_s"][i] * 1e6, "time_us"), fmt(d["algbw"][i], "gbps"),
                             fmt(d["busbw"][i], "gbps"), int(d["iters"][i])])
    ax.set_xlabel("message size per rank (bytes)")
    ax.set_ylabel("time per call (us), max over ranks")
    ax2.set_xlabel("message size per rank (bytes)")
    ax2.set_ylabel("bus bandwidth (GB/s)")
    for a in (ax, ax2):
        a.grid(alpha=0.3, which="both")
        a.legend(fontsize=7)
    fig.suptitle("; ".join(b["title"] for b in benches), fontsize=9)
    png = save(fig, outdir, "comm.png")
    md = ("Collective timings from `meshmoe bench-comm` (" + "; ".join(b["title"] for b in benches) + ").\n\n"
          + md_table(["file", "op", "size (bytes)", "bytes moved", "time (us)", "algbw (GB/s)", "busbw (GB/s)",
                      "iters"], rows, "llrrrrrr") + "\n")
    return md, png


def sweep_order(values):
    """Sort key for sweep values: numbers by value, anything else by text."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return lambda v: (0, v, "")
    return lambda v: (1, 0, deck_value(v))


def scaling_section(runs, labels, key, outdir):
    """Final losses and throughput against the one deck key the runs differ in: (markdown, png or None)."""
    diff = differing_keys(runs)
    if key is None:
        if len(diff) != 1:
            return (f"No scaling plot: the runs differ in {len(diff)} deck keys ({', '.join(diff) or 'none'}); "
                    "pass --sweep-key to pick one.\n", None)
        key = diff[0]
    elif not all(key in r.deck for r in runs):
        fail(f"--sweep-key {key}: not a key of every run's deck (differing keys: {', '.join(diff) or 'none'})")
    values = [r.deck[key] for r in runs]
    skey = sweep_order(values)
    order = sorted(range(len(runs)), key=lambda i: skey(values[i]))
    finals = [runs[i].final() for i in order]
    vals = [values[i] for i in order]
    numeric = skey(vals[0])[0] == 0
    x = np.array(vals, dtype=float) if numeric else np.arange(len(vals))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for name, m in (("train_loss", "-o"), ("valid_loss", "--s")):
        y = np.array([np.nan if f[name] is None else f[name] for f in finals])
        ax.plot(x, y, m, label=f"final {name.replace('_', ' ')}")
    y = np.array([np.nan if f["tokens_per_s"] is None else f["tokens_per_s"] for f in finals])
    ax2.plot(x, y, "-o", color="C2")
    if numeric and np.all(x > 0) and x.max() / x.min() >= 4:
        ax.set_xscale("log", base=2)
        ax2.set_xscale("log", base=2)
    for a in (ax, ax2):
        a.set_xticks(x)
        a.set_xticklabels([deck_value(v) for v in vals])
        a.set_xlabel(key)
        a.grid(alpha=0.3)
    ax.set_ylabel("loss (nats/token)")
    ax.legend(fontsize=8)
    ax2.set_ylabel("tokens/s (median over logged steps)")
    fig.suptitle(f"sweep over {key}", fontsize=10)
    png = save(fig, outdir, "scaling.png")
    rows = [[deck_value(v), labels[i], fmt(f["train_loss"], "loss"), fmt(f["valid_loss"], "loss"),
             fmt(f["tokens_per_s"], "tokens_per_s")] for v, i, f in zip(vals, order, finals)]
    md = (f"Sweep over `{key}` ({len(runs)} runs).\n\n"
          + md_table([key, "run", "final train loss", "final valid loss", "tokens/s median"], rows, "llrrr") + "\n")
    return md, png


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run directory or metrics.h5")
    ap.add_argument("-o", "--outdir", default="report", help="output directory (default: ./report)")
    ap.add_argument("--baseline", metavar="RUN", help="dense baseline run for the per-language comparison")
    ap.add_argument("--dataset", help="dataset for the language ranking (default: the baseline's data_path)")
    ap.add_argument("--bench-comm", nargs="+", default=[], metavar="FILE", help="files written by meshmoe bench-comm")
    ap.add_argument("--sweep-key", metavar="SECTION.KEY", help="deck key of the scaling plot (default: the one "
                    "key the runs differ in)")
    a = ap.parse_args()
    runs = [Run(p) for p in a.runs]
    base = Run(a.baseline) if a.baseline else None
    every = runs + ([base] if base else [])
    every_labels = unique_labels(every)
    labels = every_labels[:len(runs)]
    base_label = every_labels[-1] if base else None
    os.makedirs(a.outdir, exist_ok=True)

    md = ["# meshmoe report", ""]
    md += [f"- `{lab}`: {r.metrics_path} (run {r.attrs.get('run_name', '?')}, {r.attrs.get('mesh', '?')})"
           + (" **baseline**" if r is base else "") for lab, r in zip(every_labels, every)]
    md += ["", "## Final metrics", "", compare_table(every), ""]
    md += ["## Loss", "", f"![loss]({plot_loss(every, every_labels, a.outdir)})", "",
           "Training loss at every logged step (lines) and validation loss (markers).", ""]

    md += ["## Expert load and dropped tokens", ""]
    for r, lab in zip(every, every_labels):
        if r.moe_layers():
            md += [f"![expert load {lab}]({plot_expert_load(r, lab, a.outdir)})", ""]
        else:
            md += [f"`{lab}` has no MoE layer.", ""]
    md += ["Heatmaps: fraction of the step's dispatched choices per expert, per MoE layer (balanced: 1/E). "
           "Bottom: fraction of choices dropped for capacity.", ""]

    md += ["## Time per phase", ""]
    md += [f"![time {lab}]({plot_time(r, lab, a.outdir)})" for r, lab in zip(every, every_labels)]
    md += ["", "Seconds per phase in each logging interval (max over ranks), stacked. Nested phases are lines: "
           + "; ".join(f"{p} ({why})" for p, why in NESTED_PHASES.items()) + ".", ""]

    if base:
        text_md, png = language_section(runs, labels, base, base_label, a.dataset, a.outdir)
        md += ["## Per-language validation loss against the baseline", ""]
        md += ([f"![per-language loss]({png})", ""] if png else []) + [text_md]
    if a.bench_comm:
        text_md, png = comm_section(a.bench_comm, a.outdir)
        md += ["## Collective timings", "", f"![collectives]({png})", "", text_md]
    if len(runs) >= 2:
        text_md, png = scaling_section(runs, labels, a.sweep_key, a.outdir)
        md += ["## Scaling", ""] + ([f"![scaling]({png})", ""] if png else []) + [text_md]
    out = os.path.join(a.outdir, "report.md")
    with open(out, "w") as f:
        f.write("\n".join(md).rstrip() + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
