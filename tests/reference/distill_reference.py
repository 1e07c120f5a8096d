#!/usr/bin/env python3
"""PyTorch reference of distillation's soft-target cross-entropy (Switch section 4.2).

Reads $DIR/distill_ref.h5 written by the hidden Catch case [distill-torch]
(tests/unit/test_distill.cpp) and recomputes every case with torch autograd, from the definition:
  loss = weight * sum_n mask_n * ((1 - alpha) CE(logits_n, target_n) + alpha CE(logits_n, p_n)),
  CE(logits, p) = -sum_v p_v log_softmax(logits)_v,  p = softmax(teacher logits)
(F.cross_entropy for the hard term), dlogits by backward().

Tolerances (fp32 on the C++ side, float64 here; "max-rel" = max |cpp - ref| / max |ref|):
  teacher probabilities                max |cpp - ref| <= 1e-6 max(1, max |teacher logit|)
                                       (fp32 rounds the exponent x - lse to about 1e-7 |x|)
  per-token hard and soft losses       |cpp - ref| <= 1e-5 max(1, |ref|)
  loss                                 |cpp - ref| <= 1e-5 |ref|
  dlogits                              max |cpp - ref| <= 1e-5 max |ref| + 1e-9
Prints the worst error per quantity; exits 1 on any mismatch or a missing file.
Usage: /usr/bin/python3 tests/reference/distill_reference.py DIR
"""
import os
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

TOL_PROBS, TOL_TOKEN, TOL_LOSS, TOL_GRAD_REL, TOL_GRAD_ABS = 1e-6, 1e-5, 1e-5, 1e-5, 1e-9


def check_case(name, g):
    ok = True
    alpha, weight = float(g.attrs["alpha"]), float(g.attrs["weight"])
    logits = torch.tensor(g["logits"][()], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor(g["teacher_logits"][()], dtype=torch.float64)
    targets = torch.tensor(g["targets"][()].astype(np.int64))
    mask = torch.tensor(g["mask"][()], dtype=torch.float64)
    probs = torch.softmax(teacher, dim=-1)
    safe_targets = torch.where(mask > 0, targets, torch.zeros_like(targets))
    hard = F.cross_entropy(logits, safe_targets, reduction="none") * (mask > 0)
    soft = -(probs * F.log_softmax(logits, dim=-1)).sum(-1) * (mask > 0)
    loss = weight * (mask * ((1 - alpha) * hard + alpha * soft)).sum()
    loss.backward()

    def report(what, err, tol):
        nonlocal ok
        good = err <= tol
        ok &= good
        print(f"  {name:18s} {what:8s} worst {err:.3e} (tol {tol:.1e}) {'ok' if good else 'MISMATCH'}")

    report("probs", float(np.abs(g["probs"][()] - probs.numpy()).max()),
           TOL_PROBS * max(1.0, float(teacher.abs().max())))
    for what, ref in (("hard", hard), ("soft", soft)):
        ref = ref.detach().numpy()
        report(what, float((np.abs(g[what][()] - ref) / np.maximum(1.0, np.abs(ref))).max()), TOL_TOKEN)
    ref_loss = float(loss)
    report("loss", abs(float(g.attrs["loss"]) - ref_loss), TOL_LOSS * abs(ref_loss))
    ref_grad = logits.grad.numpy()
    report("dlogits", float(np.abs(g["dlogits"][()] - ref_grad).max()),
           TOL_GRAD_REL * float(np.abs(ref_grad).max()) + TOL_GRAD_ABS)
    return ok


def main():
    path = os.path.join(sys.argv[1], "distill_ref.h5")
    if not os.path.exists(path):
        print(f"distill_reference: {path} is missing (did the [distill-torch] case run?)")
        return 1
    ok = True
    with h5py.File(path, "r") as f:
        names = list(f.keys())
        if len(names) != int(f.attrs["cases"]):
            print(f"distill_reference: {len(names)} cases in the file, {int(f.attrs['cases'])} written")
            ok = False
        for name in names:
            ok &= check_case(name, f[name])
    print("distill_reference:", "all cases match" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
