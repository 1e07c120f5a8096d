"""Shared helpers of the post-processing tools: reading a run's metrics.h5 and its deck, the final
metrics that compare.py and report.py print, the per-language ranking of lang_table.py and report.py,
and the number formats of every table (the tests parse the tables and re-format the HDF5 values with
the same formats, so a format lives in one place: FORMATS).
"""
import math
import os
import sys
import tomllib

import h5py
import numpy as np

# Keys that name a run rather than define it: never reported as "differing".
RUN_IDENTITY_KEYS = ("run.name", "run.out_dir", "run.resume")

# Number format of every table column (Python format spec).
FORMATS = {
    "step": "d",
    "loss": ".4f",         # nats/token, also aux loss and per-language losses
    "tokens_per_s": ".1f",
    "mfu_percent": ".3f",  # MFU * 100
    "dropped": ".4f",
    "time_us": ".2f",      # bench-comm time per call in microseconds
    "gbps": ".3f",         # bench-comm algbw / busbw in GB/s
}


def fail(msg):
    """A user mistake (missing file, wrong kind of file): message on stderr, exit 2."""
    print(f"{os.path.basename(sys.argv[0])}: error: {msg}", file=sys.stderr)
    sys.exit(2)


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def string_list(v):
    """A root attribute holding a list of strings: an HDF5 string array (meshmoe's metrics.h5 since
    the languages became an array), or the comma-joined string of older files."""
    if v is None:
        return []
    if isinstance(v, (bytes, str)):
        return [x for x in text(v).split(",") if x]
    return [text(x) for x in np.asarray(v).ravel()]


def float_list(v):
    """A root attribute holding numbers: a float array, or the comma-joined text of older files."""
    if v is None:
        return []
    if isinstance(v, (bytes, str)):
        return [float(x) for x in text(v).split(",") if x]
    return [float(x) for x in np.asarray(v).ravel()]


def fmt(value, kind):
    """Table cell for a number; n/a for a missing (None or non-finite) value."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if FORMATS[kind] == "d":
        return str(int(value))
    return format(float(value), FORMATS[kind])


def flatten_deck(deck_text, where):
    """{"section.key": value} of a deck's TOML text."""
    try:
        tables = tomllib.loads(deck_text)
    except tomllib.TOMLDecodeError as e:
        fail(f"{where}: the stored deck is not valid TOML: {e}")
    flat = {}
    for section, keys in tables.items():
        if isinstance(keys, dict):
            for k, v in keys.items():
                flat[f"{section}.{k}"] = v
        else:
            flat[section] = keys
    return flat


class Run:
    """One run: its metrics.h5 read into memory (series by name), root attributes and deck."""

    def __init__(self, path):
        self.arg = path
        metrics = os.path.join(path, "metrics.h5") if os.path.isdir(path) else path
        if not os.path.exists(metrics):
            fail(f"{path}: no metrics.h5 (expected a run directory or a metrics.h5 file)")
        self.dir = os.path.dirname(os.path.abspath(metrics))
        self.metrics_path = metrics
        try:
            f = h5py.File(metrics, "r")
        except OSError as e:
            fail(f"{metrics}: not readable as HDF5 ({e})")
        with f:
            if "step" not in f or "loss" not in f:
                fail(f"{metrics}: not a meshmoe metrics file (no /step or /loss)")
            self.attrs = {k: text(v) if isinstance(v, (bytes, str)) else v for k, v in f.attrs.items()}
            self.series = {}
            f.visititems(lambda name, obj: self.series.__setitem__(name, obj[()])
                         if isinstance(obj, h5py.Dataset) and name != "deck" else None)
            self.deck_text = text(f["deck"][()]) if "deck" in f else ""
        self.step = self.series["step"]
        self.deck = flatten_deck(self.deck_text, metrics) if self.deck_text else {}
        self.name = os.path.basename(self.dir.rstrip("/"))
        self.languages = string_list(self.attrs.get("languages"))

    def moe_layers(self):
        """MoE layer group names (layer1, layer3, ...) in block order."""
        names = {n.split("/")[1] for n in self.series if n.startswith("moe/") and n.count("/") == 2}
        return sorted(names, key=lambda n: int("".join(c for c in n if c.isdigit()) or 0))

    def phases(self):
        return [n[len("time/"):] for n in self.series if n.startswith("time/")]

    def finite(self, name):
        """(steps, values) of the rows where series `name` is finite."""
        v = self.series.get(name)
        if v is None:
            return np.array([], dtype=np.int64), np.array([])
        ok = np.isfinite(v)
        return self.step[ok], v[ok]

    def last(self, name):
        """Value of the last row where `name` is finite, or None."""
        _, v = self.finite(name)
        return float(v[-1]) if v.size else None

    def median(self, name):
        _, v = self.finite(name)
        return float(np.median(v)) if v.size else None

    def final(self):
        """The final metrics of compare.py's table (None where the run has no such value)."""
        drops = [self.series[f"moe/{l}/dropped_fraction"] for l in self.moe_layers()]
        drops = np.concatenate(drops) if drops else np.array([])
        drops = drops[np.isfinite(drops)]
        mfu = self.median("mfu")
        return {
            "final_step": int(self.step.max()) if self.step.size else None,
            "train_loss": self.last("loss"),
            "valid_loss": self.last("eval/loss"),
            "aux_loss": self.last("aux_loss"),
            "tokens_per_s": self.median("tokens_per_s"),
            "mfu_percent": None if mfu is None else 100.0 * mfu,
            "dropped_mean": float(np.mean(drops)) if drops.size else None,
        }

    def last_eval(self):
        """(step, overall loss, per-language loss, per-language tokens) of the last evaluation, or None."""
        if "eval/loss" not in self.series:
            return None
        rows = np.flatnonzero(np.isfinite(self.series["eval/loss"]))
        if rows.size == 0:
            return None
        r = rows[-1]
        lang_loss = self.series.get("eval/lang_loss")
        lang_tokens = self.series.get("eval/lang_tokens")
        L = len(self.languages)
        return (int(self.step[r]), float(self.series["eval/loss"][r]),
                lang_loss[r] if lang_loss is not None else np.full(L, np.nan),
                lang_tokens[r] if lang_tokens is not None else np.zeros(L))


def unique_labels(runs):
    """Run labels for tables and legends: the directory name, or the path given where names repeat."""
    names = [r.name for r in runs]
    labels = [r.name if names.count(r.name) == 1 else r.arg.rstrip("/") for r in runs]
    return [lab if labels.count(lab) == 1 else f"{lab}#{k + 1}" for k, lab in enumerate(labels)]


def differing_keys(runs):
    """Deck keys (section.key) whose value is not the same in every run, sorted."""
    keys = set()
    for r in runs:
        keys |= set(r.deck)
    missing = object()
    out = []
    for k in sorted(keys):
        if k in RUN_IDENTITY_KEYS:
            continue
        vals = [r.deck.get(k, missing) for r in runs]
        if any(v != vals[0] for v in vals[1:]):
            out.append(k)
    return out


def deck_value(v):
    """A deck value as the TOML text a user would write."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


def read_dataset_languages(path):
    """{language: (train_pairs, valid_pairs)} from a dataset file written by `meshmoe prep`."""
    try:
        with h5py.File(path, "r") as d:
            names = [text(n) for n in d["languages/name"][()]]
            train = d["languages/train_pairs"][()]
            valid = d["languages/valid_pairs"][()]
    except (OSError, KeyError) as e:
        raise OSError(f"{path}: cannot read /languages ({e})") from e
    return {n: (int(t), int(v)) for n, t, v in zip(names, train, valid)}


def rank_languages(langs, pairs):
    """Indices into `langs` of the languages that have validation pairs, largest training set first
    (GShard figure 6 orders languages by resource size). `pairs` is read_dataset_languages()."""
    scored = [i for i in range(len(langs)) if pairs.get(langs[i], (0, 0))[1] > 0]
    return sorted(scored, key=lambda i: -pairs.get(langs[i], (0, 0))[0])


def md_table(header, rows, align=None):
    """Markdown table; align is a string of 'l'/'r' per column (default: first left, others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    out = ["| " + " | ".join(header) + " |",
           "| " + " | ".join("---" if a == "l" else "---:" for a in align) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def compare_table(runs):
    """compare.py's table of final metrics, one row per run."""
    labels = unique_labels(runs)
    diff = differing_keys(runs)
    header = ["run", "final step", "final train loss", "final valid loss", "final aux loss", "tokens/s median",
              "MFU median (%)", "dropped fraction mean", "differing deck keys"]
    rows = []
    for label, r in zip(labels, runs):
        f = r.final()
        keys = ", ".join(f"{k}={deck_value(r.deck[k])}" if k in r.deck else f"{k} unset" for k in diff)
        rows.append([label, fmt(f["final_step"], "step"), fmt(f["train_loss"], "loss"),
                     fmt(f["valid_loss"], "loss"), fmt(f["aux_loss"], "loss"),
                     fmt(f["tokens_per_s"], "tokens_per_s"), fmt(f["mfu_percent"], "mfu_percent"),
                     fmt(f["dropped_mean"], "dropped"), keys or "-"])
    return md_table(header, rows, "lrrrrrrrl")
