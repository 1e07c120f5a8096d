"""Comparison of two training runs' metrics.h5, shared by the test scripts that hold a run on one
mesh against the single-rank run (train_invariance.sh, bf16_train.sh), or a run against the same run
another way (deferred_device.sh, cuda_graphs.sh: every logged number). Each returns the number of
mismatches and prints one line per quantity compared, so that a failing script shows all of them.
Import with sys.path.insert(0, "tests/lib") (the scripts run from the repository root)."""
import numpy as np

# The per-step scalars of metrics.h5 that every mesh must reproduce.
SCALARS = ["loss", "aux_loss", "z_loss", "grad_norm", "eval/loss"]
# Routing counts are sums of integers over the ranks: equal on every mesh.
ROUTING_COUNTS = ["dropped_fraction", "rerouted_fraction", "declined_fraction", "capacity", "experts_per_token"]


# Names of metrics.h5's datasets that hold timings (or text), which differ between equal runs.
TIMINGS = ("time", "throughput", "tokens_per_s", "mfu", "deck", "wall", "bubble")


def logged_numbers(f, prefix=""):
    """Every numeric dataset of metrics.h5 (an open h5py file or group) but the timings, by path."""
    import h5py
    out = {}
    for k, v in f.items():
        name = prefix + k
        if isinstance(v, h5py.Group):
            out.update(logged_numbers(v, name + "/"))
        elif not any(s in name for s in TIMINGS) and v.dtype.kind in "fiub":
            out[name] = v[()]
    return out


def max_rel_diff(a, b):
    """Largest |a - b| / |a| over the steps where a is finite (NaN marks steps without a value)."""
    ok = np.isfinite(a)
    if not ok.any():
        return np.inf
    return np.max(np.abs(a[ok] - b[ok]) / np.maximum(np.abs(a[ok]), 1e-30))


def compare_scalars(ref, f, run, tol=1e-5, keys=SCALARS):
    """The scalars of `f` against `ref` (open h5py files) on the same steps: within `tol` relative
    (a number, or a function of the key), NaN on the same steps, and at least one finite value;
    tol = 0: bitwise equal."""
    bad = 0
    if not np.array_equal(f["step"][()], ref["step"][()]):
        print(f"{run:24s} logged other steps than its reference MISMATCH")
        return 1
    for key in keys:
        a, b = ref[key][()], f[key][()]
        if tol == 0:
            same = np.array_equal(a, b, equal_nan=True)
            bad += not same
            print(f"{run:24s} {key:10s} bitwise {'ok' if same else 'MISMATCH'}")
            continue
        rel = max_rel_diff(a, b)
        t = tol(key) if callable(tol) else tol
        good = rel <= t and np.array_equal(np.isfinite(a), np.isfinite(b))
        bad += not good
        print(f"{run:24s} {key:10s} max rel diff {rel:.2e} (tolerance {t:.0e}) {'ok' if good else 'MISMATCH'}")
    return bad


def compare_routing(ref, f, run, counts=ROUTING_COUNTS, entropy_tol=1e-5):
    """Per MoE layer: expert loads and the routing counts equal, the balancing bias (when there is
    one) within 1e-6 and the router entropy within `entropy_tol` relative. counts=() compares only
    the loads."""
    if ("moe" in ref) != ("moe" in f):
        print(f"{run}: MoE layers differ from its reference MISMATCH")
        return 1
    bad = 0
    for layer in (ref["moe"] if "moe" in ref else []):
        g, h = ref[f"moe/{layer}"], f[f"moe/{layer}"]
        same = np.array_equal(g["expert_load"][()], h["expert_load"][()])
        bad += not same
        print(f"{run:24s} moe/{layer}/expert_load exact {'ok' if same else 'MISMATCH'}")
        for key in counts:
            same = np.array_equal(g[key][()], h[key][()])
            bad += not same
            if not same: print(f"{run:24s} moe/{layer}/{key} exact MISMATCH")
        if not counts:
            continue
        if "bias_max_abs" in g:
            a, b = g["bias_max_abs"][()], h["bias_max_abs"][()]
            same = np.allclose(a, b, rtol=1e-6, atol=0) and a[-1] > 0
            bad += not same
            if not same: print(f"{run:24s} moe/{layer}/bias_max_abs {a} vs {b} MISMATCH")
        a, b = g["router_entropy"][()], h["router_entropy"][()]
        rel = np.max(np.abs(a - b) / np.abs(a))
        bad += not (rel <= entropy_tol)
        if not rel <= entropy_tol: print(f"{run:24s} moe/{layer}/router_entropy max rel diff {rel:.2e} MISMATCH")
    return bad
