#!/usr/bin/env python3
"""PyTorch reference for meshmoe's optimizers (src/train/): writes an HDF5 file that the hidden
Catch test case [optim-torch] (tests/unit/test_optim.cpp) reads and replays in C++.

Three parameters (a matrix, a vector without weight decay, a 3-D expert tensor [E, M, H]) and a fixed
sequence of 10 gradients, all from a seeded torch.Generator. Each step: global-norm clipping with
torch.nn.utils.clip_grad_norm_, the learning rate of the schedule, one optimizer update:
  /adamw      torch.optim.AdamW (param groups: weight decay off for the vector)
  /adafactor  Adafactor written here from Shazeer & Stern 2018 Alg. 4 (factored, with row and column
              *sums*) and Alg. 5 (vectors), beta1 = 0, beta2_t = 1 - t^-c, update clipping d,
              plain learning rate (GShard appendix A.2); torch 1.13 has no Adafactor.
Layout: /init/<p> [shape] (attr no_weight_decay), /grads/<p> [steps, shape],
        /<case>/params/<p> [steps, shape] (after each step), /<case>/lr [steps], /<case>/clipped [steps],
        /<case> attrs: the deck's optim.* keys and run_steps.
Usage: /usr/bin/python3 tests/reference/optim_reference.py OUT.h5
"""
import math
import sys

import h5py
import numpy as np
import torch

STEPS = 10
SHAPES = {"w": (6, 5), "b": (5,), "experts": (3, 4, 6)}
NO_WD = {"b"}
# Per-step gradient scale: the global norm is about 10.3 * scale, so grad_clip = 1 clips some steps only.
SCALES = [0.02, 0.15, 0.05, 0.3, 0.01, 0.2, 0.08, 0.12, 0.03, 0.25]

CASES = {
    "adamw": dict(name="adamw", schedule="cosine", lr=1e-2, warmup_steps=3, min_lr_ratio=0.1, run_steps=10,
                  beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0,
                  adafactor_decay=0.8, adafactor_clip=1.0, adafactor_eps=1e-30),
    "adafactor": dict(name="adafactor", schedule="rsqrt", lr=5e-2, warmup_steps=3, min_lr_ratio=0.1, run_steps=10,
                      beta1=0.0, beta2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0,
                      adafactor_decay=0.8, adafactor_clip=1.0, adafactor_eps=1e-30),
}


def schedule(t, c):
    """Learning rate of update t (1-based): linear warm-up, then constant | rsqrt | cosine."""
    lr, w, total = c["lr"], c["warmup_steps"], c["run_steps"]
    if t <= w:
        return lr * t / w
    if c["schedule"] == "constant":
        return lr
    if c["schedule"] == "rsqrt":
        return lr * math.sqrt(max(w, 1) / t)
    p = 1.0 if total <= w else min(max((t - w) / (total - w), 0.0), 1.0)
    lo = c["min_lr_ratio"] * lr
    return lo + (lr - lo) * 0.5 * (1 + math.cos(math.pi * p))


class PaperAdafactor:
    """Shazeer & Stern 2018, Algorithms 4 and 5, beta1 = 0, no relative step, fp32."""

    def __init__(self, params, decay, eps1, d):
        self.params, self.decay, self.eps1, self.d = params, decay, eps1, d
        self.state = [None] * len(params)
        self.clip_events = []  # (t, param index, RMS(U)/d)

    @torch.no_grad()
    def step(self, lr, t):
        beta = 1.0 - t ** (-self.decay)
        for k, p in enumerate(self.params):
            g2 = p.grad * p.grad + self.eps1
            if p.dim() >= 2:
                if self.state[k] is None:
                    self.state[k] = (torch.zeros(p.shape[:-1]), torch.zeros(p.shape[:-2] + p.shape[-1:]))
                R, C = self.state[k]
                R.mul_(beta).add_((1 - beta) * g2.sum(-1))   # R_t = b R + (1-b)(G^2 + eps1) 1_m
                C.mul_(beta).add_((1 - beta) * g2.sum(-2))   # C_t = b C + (1-b) 1_n^T (G^2 + eps1)
                V = R.unsqueeze(-1) * C.unsqueeze(-2) / R.sum(-1, keepdim=True).unsqueeze(-1)  # R C / 1^T R
            else:
                if self.state[k] is None:
                    self.state[k] = torch.zeros_like(p)
                V = self.state[k]
                V.mul_(beta).add_((1 - beta) * g2)
            U = p.grad / V.sqrt()
            rms_d = U.pow(2).mean().sqrt().item() / self.d
            self.clip_events.append((t, k, rms_d))
            p.sub_(lr * U / max(1.0, rms_d))


def main():
    out = sys.argv[1]
    gen = torch.Generator().manual_seed(20200630)
    init = {n: torch.randn(s, generator=gen) for n, s in SHAPES.items()}
    grads = {n: torch.randn((STEPS,) + s, generator=gen) for n, s in SHAPES.items()}
    for n in grads:
        for t in range(STEPS):
            grads[n][t] *= SCALES[t]
    with h5py.File(out, "w") as f:
        for n in SHAPES:
            d = f.create_dataset(f"init/{n}", data=init[n].numpy().astype(np.float32))
            d.attrs["no_weight_decay"] = int(n in NO_WD)
            f.create_dataset(f"grads/{n}", data=grads[n].numpy().astype(np.float32))
        for case, c in CASES.items():
            params = {n: init[n].clone().requires_grad_(True) for n in SHAPES}
            plist = list(params.values())
            if case == "adamw":
                opt = torch.optim.AdamW(
                    [{"params": [params[n] for n in SHAPES if n not in NO_WD], "weight_decay": c["weight_decay"]},
                     {"params": [params[n] for n in SHAPES if n in NO_WD], "weight_decay": 0.0}],
                    lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"])
            else:
                opt = PaperAdafactor(plist, c["adafactor_decay"], c["adafactor_eps"], c["adafactor_clip"])
            hist = {n: [] for n in SHAPES}
            lrs, clipped = [], []
            for t in range(1, STEPS + 1):
                for n, p in params.items():
                    p.grad = grads[n][t - 1].clone()
                norm = torch.nn.utils.clip_grad_norm_(plist, c["grad_clip"]).item()
                clipped.append(float(c["grad_clip"] / (norm + 1e-6) < 1.0))
                lr = schedule(t, c)
                lrs.append(lr)
                if case == "adamw":
                    for group in opt.param_groups:
                        group["lr"] = lr
                    opt.step()
                else:
                    opt.step(lr, t)
                for n, p in params.items():
                    hist[n].append(p.detach().clone().numpy())
            g = f.create_group(case)
            for key, v in c.items():
                g.attrs[key] = np.bytes_(v) if isinstance(v, str) else float(v)
            for n in SHAPES:
                g.create_dataset(f"params/{n}", data=np.stack(hist[n]).astype(np.float32))
            g.create_dataset("lr", data=np.array(lrs, dtype=np.float32))
            g.create_dataset("clipped", data=np.array(clipped, dtype=np.float32))
            msg = f"{case}: {int(sum(clipped))}/{STEPS} steps grad-clipped"
            if case == "adafactor":
                n_upd = sum(1 for _, _, r in opt.clip_events if r > 1.0)
                msg += f", {n_upd}/{len(opt.clip_events)} updates clipped (RMS(U) > d)"
                if n_upd == 0 or n_upd == len(opt.clip_events):
                    sys.exit("reference does not exercise both branches of Adafactor update clipping")
            print(msg)


if __name__ == "__main__":
    main()
