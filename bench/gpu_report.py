#!/usr/bin/env python3
"""Report of bench/gpu.sh: reads its results folder OUT and prints one markdown table; with --json
FILE also appends one record per deck and precision to FILE (a JSON list; created when missing).

OUT holds: peak.txt (bench/gpu_peak.py: `gpu NAME torch V ...` and `ceiling gemm_bf16_n8192 X
TFLOP/s`, ...; in --host mode only the gpu line), NAME.deck (the deck file of deck NAME), and for
each run RUN = NAME-PRECISION: RUN.rc, RUN.log, RUN.mem_mib and RUN/metrics.h5 (meshmoe), and
torch-PEER-RUN.{rc,log,mem_mib} (PEER eager or compile: bench/torch_peer_best.py; legacy:
bench/torch_peer.py).

A record (docs/gpu.md "The record"):
  date (UTC), commit (of the meshmoe binary measured: OUT/version.txt, its --version line), gpu, torch, host (true:
  a --host run on the CPU, not a GPU figure), deck, deck_file, precision, steps,
  ceilings: gemm_bf16_tflops (measured, n = 8192), spec_bf16_tflops (datasheet; null if unknown),
  meshmoe: status ("ok" or "exit N"), tokens_per_s (median over the steps after the first three),
           flops_per_token (the deck's train FLOPs per token, as MFU counts them), tflops,
           mfu_measured, mfu_spec, peak_mem_gib (the GPU's memory.used sampled during the run; on
           the host the process's peak resident set), dropped_fraction (mean over MoE layers, last step),
  peers: {PEER: status, tokens_per_s, tflops, mfu_measured, mfu_spec (the same FLOPs per token as
           meshmoe's), peak_mem_gib (torch.cuda.max_memory_allocated; host: resident set),
           peak_mem_sampled_gib (as meshmoe's), mode, attention, adamw, fallbacks, dropped_fraction},
  speedup: {PEER: meshmoe tokens/s over the peer's}.
null where a value does not exist (a failed run, no ceiling measured).
Usage: bench/gpu_report.py OUT [--json FILE]"""
import argparse
import datetime
import json
import os
import re
import statistics

import h5py

from benchlib import spec_bf16_tflops


def read(path):
    return open(path).read() if os.path.exists(path) else None


def ceilings(out):
    text = read(os.path.join(out, "peak.txt")) or ""
    m = re.search(r"^gpu (.*?) torch (\S+)", text, re.M)
    c = re.search(r"^ceiling gemm_bf16_n8192 ([0-9.]+)", text, re.M)
    f = re.search(r"^ceiling gemm_fp32_n8192 ([0-9.]+)", text, re.M)
    return dict(gpu=m.group(1) if m else None, torch=m.group(2) if m else None,
                bf16=float(c.group(1)) if c else None, fp32=float(f.group(1)) if f else None)


def status(out, name):
    rc = read(os.path.join(out, name + ".rc"))
    return "ok" if rc is not None and rc.strip() == "0" else "missing" if rc is None else f"exit {rc.strip()}"


def sampled_gib(out, name):
    v = read(os.path.join(out, name + ".mem_mib"))
    return int(v) / 1024 if v and v.strip().isdigit() else None


def meshmoe(out, run):
    r = dict(status=status(out, run), tokens_per_s=None, flops_per_token=None, dropped_fraction=None, steps=None,
             peak_mem_gib=sampled_gib(out, run))
    path = os.path.join(out, run, "metrics.h5")
    if r["status"] == "ok" and os.path.exists(path):
        with h5py.File(path, "r") as f:
            tps = list(f["tokens_per_s"][()])
            r["steps"] = len(tps)
            r["tokens_per_s"] = float(statistics.median(tps[3:] if len(tps) > 5 else tps))
            r["flops_per_token"] = float(f.attrs["train_flops_per_token"])
            layers = [f["moe"][k]["dropped_fraction"][-1] for k in f["moe"]] if "moe" in f else []
            r["dropped_fraction"] = float(sum(layers) / len(layers)) if layers else None
    return r


def peer(out, name):
    """The last output line of a peer run as a dict (its `key value` pairs)."""
    r = dict(status=status(out, name), tokens_per_s=None, peak_mem_sampled_gib=sampled_gib(out, name))
    lines = [l for l in (read(os.path.join(out, name + ".log")) or "").splitlines() if l.startswith("torch_peer")]
    if r["status"] != "ok" or not lines:
        return r
    words = lines[-1].split()
    kv = dict(zip(words[2::2], words[3::2]))
    num = lambda k: float(kv[k]) if kv.get(k, "-") != "-" else None  # "-": not applicable; absent: None
    r["tokens_per_s"] = num("tokens_per_s") or num("tokens") / num("step_s")  # legacy: tokens and step_s only
    r["peak_mem_gib"] = num("peak_mem_gib")
    r["dropped_fraction"] = num("dropped")
    for k in ("mode", "attention", "adamw", "fallbacks"):
        r[k] = kv.get(k)
    return r


def records(out):
    ceil = ceilings(out)
    host = ceil["gpu"] is not None and ceil["gpu"].startswith("host")
    spec = spec_bf16_tflops(ceil["gpu"] or "") if not host else None
    v = re.match(r"meshmoe (\S+)", read(os.path.join(out, "version.txt")) or "")
    binary = v.group(1) if v else None
    runs = sorted(m.groups() for f in os.listdir(out) if (m := re.match(r"(?!torch-)(.+)-(fp32|bf16)\.rc$", f)))
    for name, prec in runs:
        run = f"{name}-{prec}"
        mm = meshmoe(out, run)
        fpt = mm["flops_per_token"]

        def rates(tps):
            tf = tps * fpt / 1e12 if tps and fpt else None
            return dict(tflops=tf, mfu_measured=tf / ceil["bf16"] if tf and ceil["bf16"] else None,
                        mfu_spec=tf / spec if tf and spec else None)
        mm.update(rates(mm["tokens_per_s"]))
        peers = {}
        for f in sorted(os.listdir(out)):
            m = re.match(rf"torch-(\w+)-{re.escape(run)}\.rc$", f)
            if m:
                p = peer(out, f"torch-{m.group(1)}-{run}")
                p.update(rates(p["tokens_per_s"]))
                peers[m.group(1)] = p
        deck_file = (read(os.path.join(out, name + ".deck")) or "").strip() or None
        yield dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                   commit=binary, gpu=ceil["gpu"], torch=ceil["torch"], host=host, deck=name, deck_file=deck_file,
                   precision=prec, steps=mm.pop("steps"),
                   ceilings=dict(gemm_bf16_tflops=ceil["bf16"], spec_bf16_tflops=spec),
                   meshmoe=mm, peers=peers,
                   speedup={k: mm["tokens_per_s"] / p["tokens_per_s"] if mm["tokens_per_s"] and p["tokens_per_s"] else None
                            for k, p in peers.items()})


def table(recs):
    fmt = lambda v, f: "-" if v is None else f.format(v)
    print("| deck | precision | meshmoe tok/s | MFU (measured bf16) | MFU (spec) | peak GiB | "
          "peer | peer tok/s | peer MFU (measured) | peer peak GiB | meshmoe / peer |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        mm = r["meshmoe"]
        head = (f"| {r['deck']} | {r['precision']} | {fmt(mm['tokens_per_s'], '{:.0f}')} | {fmt(mm['mfu_measured'], '{:.1%}')} | "
                f"{fmt(mm['mfu_spec'], '{:.1%}')} | {fmt(mm['peak_mem_gib'], '{:.2f}')}")
        for k, p in (r["peers"] or {"-": None}).items():
            if p is None:
                print(head + " | - | - | - | - | - |")
                continue
            print(head + f" | {k}{' (' + p['fallbacks'] + ')' if p.get('fallbacks') not in (None, 'none') else ''} | "
                  f"{fmt(p['tokens_per_s'], '{:.0f}')} | {fmt(p['mfu_measured'], '{:.1%}')} | {fmt(p.get('peak_mem_gib'), '{:.2f}')} | "
                  f"{fmt(r['speedup'][k], '{:.2f}x')} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--json", help="append the records to this JSON list")
    a = ap.parse_args()
    recs = list(records(a.out))
    ceil = recs[0]["ceilings"] if recs else {}
    print(f"{recs[0]['gpu'] if recs else '-'}: measured bf16 GEMM {ceil.get('gemm_bf16_tflops')} TFLOP/s, "
          f"spec {ceil.get('spec_bf16_tflops')} TFLOP/s")
    table(recs)
    if a.json:
        old = json.load(open(a.json)) if os.path.exists(a.json) and os.path.getsize(a.json) else []
        if not isinstance(old, list):
            raise SystemExit(f"gpu_report: {a.json} is not a JSON list of records")
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(old + recs, f, indent=1)
            f.write("\n")
        os.replace(tmp, a.json)
        print(f"gpu_report: {len(recs)} records appended to {a.json} ({len(old) + len(recs)} in all)")


if __name__ == "__main__":
    main()
