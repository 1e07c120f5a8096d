#!/usr/bin/python3
"""Checks the output of postprocess/report.py and compare.py against the HDF5 files they read.

    check_report.py --report DIR --compare FILE --runs RUN... --baseline RUN --bench FILE --sweep-key KEY
                    --expect-moe LABEL...

Every expected PNG exists, is larger than 200 px each way and is not blank (pixel variance > 0, more
than one colour). Every markdown table is parsed and each cell is compared, as text, with the value
recomputed here from the HDF5 files (independently of postprocess/common.py) and printed with the format
the tools document (losses .4f, tokens/s .1f, MFU percent .3f, dropped fraction .4f, bench-comm time in
us .2f, bandwidths .3f): text equality is the tolerance, i.e. the printed rounding. Then, so that this
check can fail, every table is checked again with one number changed in the last digit, which must be
reported.
"""
import argparse
import os
import re
import sys
import tomllib

import h5py
import numpy as np
from PIL import Image

errors = []


def expect(cond, what):
    if not cond:
        errors.append(what)
    return cond


def s(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def f4(x):
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.4f}"


def last_finite(a):
    a = a[np.isfinite(a)]
    return float(a[-1]) if a.size else None


class H5Run:
    def __init__(self, path):
        self.label = os.path.basename(path.rstrip("/"))
        with h5py.File(os.path.join(path, "metrics.h5"), "r") as f:
            self.d = {}
            f.visititems(lambda n, o: self.d.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
            self.attrs = {k: s(v) if isinstance(v, (bytes, str)) else v for k, v in f.attrs.items()}
        self.deck = {f"{sec}.{k}": v for sec, t in tomllib.loads(s(self.d["deck"])).items() for k, v in t.items()}

    def expected_final(self):
        d = self.d
        drops = [d[n] for n in d if re.fullmatch(r"moe/layer\d+/dropped_fraction", n)]
        drops = np.concatenate(drops) if drops else np.array([])
        drops = drops[np.isfinite(drops)]
        tps = d["tokens_per_s"][np.isfinite(d["tokens_per_s"])]
        mfu = d["mfu"][np.isfinite(d["mfu"])]
        return [str(int(d["step"].max())), f4(last_finite(d["loss"])), f4(last_finite(d["eval/loss"])),
                f4(last_finite(d["aux_loss"])), f"{np.median(tps):.1f}", f"{100 * np.median(mfu):.3f}",
                f"{np.mean(drops):.4f}" if drops.size else "n/a"]

    def last_eval_row(self):
        return int(np.flatnonzero(np.isfinite(self.d["eval/loss"]))[-1])


def toml_text(v):
    return ("true" if v else "false") if isinstance(v, bool) else f'"{v}"' if isinstance(v, str) else str(v)


def tables(md):
    """Every markdown table: (header cells, [row cells]); the alignment row is dropped."""
    out, block = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif block:
            out.append((block[0], block[2:]))
            block = []
    return out


def check_final(header, rows, runs, where):
    """The final-metrics table of compare.py (also in report.md)."""
    expect(header[:8] == ["run", "final step", "final train loss", "final valid loss", "final aux loss",
                          "tokens/s median", "MFU median (%)", "dropped fraction mean"], f"{where}: header {header}")
    expect(sorted(r[0] for r in rows) == sorted(runs), f"{where}: rows {[r[0] for r in rows]}, runs {list(runs)}")
    keys = sorted(k for k in set().union(*(r.deck for r in runs.values()))
                  if k not in ("run.name", "run.out_dir", "run.resume")
                  and len({toml_text(r.deck.get(k)) for r in runs.values()}) > 1)
    for row in rows:
        r = runs.get(row[0])
        if not expect(r is not None, f"{where}: unknown run {row[0]}"):
            continue
        exp = r.expected_final() + [", ".join(f"{k}={toml_text(r.deck[k])}" for k in keys) or "-"]
        for col, got, want in zip(header[1:], row[1:], exp):
            expect(got == want, f"{where}: {row[0]} {col}: table {got}, HDF5 {want}")


def check_lang(header, rows, runs, base, dataset, where):
    with h5py.File(dataset, "r") as d:
        names = [s(n) for n in d["languages/name"][()]]
        train = dict(zip(names, d["languages/train_pairs"][()].tolist()))
        valid = dict(zip(names, d["languages/valid_pairs"][()].tolist()))
    langs = [s(x) for x in base.attrs["languages"]]  # a string array
    order = sorted((l for l in langs if valid[l] > 0), key=lambda l: -train[l])
    expect(len(set(train.values())) > 1, f"{where}: test dataset should have languages of different sizes")
    expect([r[1] for r in rows] == order, f"{where}: languages {[r[1] for r in rows]}, expected {order}")
    run_labels = header[4::2]
    expect(header[3] == f"{base.label} (baseline)", f"{where}: header {header}")
    evals = {lab: runs[lab].d["eval/lang_loss"][runs[lab].last_eval_row()] for lab in run_labels}
    b = base.d["eval/lang_loss"][base.last_eval_row()]
    for k, row in enumerate(rows):
        lang = row[1]
        if lang not in langs:
            continue
        i = langs.index(lang)
        exp = [str(k + 1), lang, str(train[lang]), f4(b[i])]
        for lab in run_labels:
            exp += [f4(evals[lab][i]), f4(b[i] - evals[lab][i])]
        expect(row == exp, f"{where}: row {row}, HDF5 {exp}")
    expect(any(r[3] != "n/a" and r[4] != "n/a" for r in rows), f"{where}: no language has both losses")


def check_comm(header, rows, bench, where):
    expect(header == ["file", "op", "size (bytes)", "bytes moved", "time (us)", "algbw (GB/s)", "busbw (GB/s)",
                      "iters"], f"{where}: header {header}")
    with h5py.File(bench, "r") as f:
        sizes = f["sizes"][()]
        exp = [[os.path.basename(bench), op, str(int(sz)), str(int(f[op]["bytes"][i])),
                f"{f[op]['time_s'][i] * 1e6:.2f}", f"{f[op]['algbw'][i]:.3f}", f"{f[op]['busbw'][i]:.3f}",
                str(int(f[op]["iters"][i]))]
               for op in f if op != "sizes" for i, sz in enumerate(sizes)]
    expect(sorted(rows) == sorted(exp), f"{where}: rows differ from {bench}: {rows} vs {exp}")


def check_sweep(header, rows, runs, key, where):
    expect(header == [key, "run", "final train loss", "final valid loss", "tokens/s median"], f"{where}: {header}")
    exp = []
    for lab, r in sorted(runs.items(), key=lambda kv: kv[1].deck[key]):
        e = r.expected_final()
        exp.append([toml_text(r.deck[key]), lab, e[1], e[2], e[4]])
    expect(rows == exp, f"{where}: rows {rows}, expected {exp}")


def check_png(path):
    if not expect(os.path.isfile(path), f"{path} missing"):
        return
    img = Image.open(path)
    w, h = img.size
    expect(w > 200 and h > 200, f"{path}: {w}x{h} px, expected > 200 each way")
    a = np.asarray(img.convert("RGB"), dtype=np.float64)
    expect(a.var() > 0, f"{path}: blank (pixel variance 0)")
    expect(len(np.unique(a.reshape(-1, 3), axis=0)) > 1, f"{path}: a single colour")


def check_all(report_md, compare_md, a, runs, base):
    """Every table of both files against the HDF5 values; returns the number of tables seen."""
    everyone = dict(runs, **{base.label: base})
    kinds = []
    for header, rows in tables(compare_md):
        check_final(header, rows, everyone, "compare.py")
        kinds.append("compare")
    for header, rows in tables(report_md):
        if header[:2] == ["run", "final step"]:
            check_final(header, rows, everyone, "report.md final metrics"); kinds.append("final")
        elif header[:2] == ["rank", "language"]:
            check_lang(header, rows, runs, base, a.dataset, "report.md languages"); kinds.append("lang")
        elif header[:2] == ["file", "op"]:
            check_comm(header, rows, a.bench, "report.md bench-comm"); kinds.append("comm")
        elif header[:2] == [a.sweep_key, "run"]:
            check_sweep(header, rows, runs, a.sweep_key, "report.md sweep"); kinds.append("sweep")
        else:
            errors.append(f"report.md: unexpected table {header}")
    return kinds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", required=True)
    ap.add_argument("--compare", required=True)
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--sweep-key", required=True)
    ap.add_argument("--expect-moe", nargs="+", required=True)
    a = ap.parse_args()
    runs = {H5Run(p).label: H5Run(p) for p in a.runs}
    base = H5Run(a.baseline)
    report_md = open(os.path.join(a.report, "report.md")).read()
    compare_md = open(a.compare).read()

    pngs = ["loss.png", "lang_loss.png", "comm.png", "scaling.png"]
    pngs += [f"expert_load_{lab}.png" for lab in a.expect_moe]
    pngs += [f"time_{lab}.png" for lab in list(runs) + [base.label]]
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report_md)
    expect(sorted(linked) == sorted(pngs), f"report.md links {sorted(linked)}, expected {sorted(pngs)}")
    for p in sorted(set(pngs) | set(linked)):
        check_png(os.path.join(a.report, p))

    kinds = check_all(report_md, compare_md, a, runs, base)
    expect(sorted(kinds) == ["comm", "compare", "final", "lang", "sweep"], f"tables found: {kinds}")
    print(f"checked {len(set(pngs) | set(linked))} PNGs and {len(kinds)} tables: {len(errors)} problem(s)")
    for e in errors:
        print("  FAIL:", e)
    if errors:
        sys.exit(1)

    # The check must be able to fail: change one number per table (last digit) and expect a report.
    missed = 0
    for name, md in (("report.md", report_md), ("compare", compare_md)):
        for t, (_, rows) in enumerate(tables(md)):
            cell = next((c for row in rows for c in row[1:] if re.fullmatch(r"-?\d+(\.\d+)?", c)), None)
            if cell is None:
                continue
            bumped = cell[:-1] + str((int(cell[-1]) + 1) % 10)
            lines = md.splitlines()
            k = next(i for i, l in enumerate(lines) if f"| {cell} |" in l and l.startswith("|")
                     and i > 0 and sum(1 for x in tables("\n".join(lines[:i + 1]))) == t + 1)
            lines[k] = lines[k].replace(f"| {cell} |", f"| {bumped} |", 1)
            errors.clear()
            tampered = "\n".join(lines)
            check_all(tampered if name == "report.md" else report_md, tampered if name == "compare" else compare_md,
                      a, runs, base)
            if not errors:
                missed += 1
                print(f"  FAIL: {name} table {t}: {cell} -> {bumped} not detected")
    print(f"tamper test: {missed} change(s) not detected")
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
