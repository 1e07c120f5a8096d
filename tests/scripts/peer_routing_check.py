#!/usr/bin/env python3
"""Checks bench/torch_peer_best.py's MoE layer (the GPU peer of bench/gpu.sh) against meshmoe's
definition of routing, without meshmoe: tests/reference/model_reference.py's route() and capacity,
whose decisions tests/scripts/model_vs_torch.sh requires exactly equal to meshmoe's, are the oracle.
  1. capacity(k, S, E, f) equals Cfg.capacity() on a grid (including 0.7 x 10 = 7 and the clamps);
  2. route() gives the same expert, slot, kept and dropped choices as model_reference.route() on
     random router probabilities, 64 groups of 32 tokens, 8 experts: top-1 and top-2 (second expert
     always, and by threshold, which the peer receives as its keep mask), capacity factors 0.5, 1.0,
     1.25 (so that choices are dropped);
  3. a hand-computed case of each router (slots, drops, a declined second choice taking no slot);
  4. SortedMoe's output (float64) equals a per-token loop over the kept choices (sum of gate x
     expert(x)) to 1e-12 relative, and its dropped count equals the oracle's.
Prints one line per check; exit 1 on the first failure."""
import math
import os
import sys

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "bench"))
sys.path.insert(0, os.path.join(here, "..", "reference"))

import model_reference as ref  # noqa: E402
import torch_peer_best as peer  # noqa: E402


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def cfg(router, S, E, cf, second="always", thr=0.2):
    return ref.Cfg(dict(router=router, top_k=2, group_size=S, num_experts=E, capacity_factor_train=cf,
                        dropless=0, second_expert=second, second_expert_threshold=thr, no_token_left_behind=0))


# 1. capacity
n = 0
for k in (1, 2):
    for S in (1, 3, 10, 32, 256):
        for E in (1, 2, 4, 8, 64):
            for cf in (0.1, 0.5, 0.7, 1.0, 1.25, 2.0, 1e300):
                want = cfg("top1" if k == 1 else "top2", S, E, cf).capacity()
                got = peer.capacity(k, S, E, cf)
                if got != want:
                    fail(f"capacity(k={k}, S={S}, E={E}, f={cf}) = {got}, meshmoe's rule gives {want}")
                n += 1
if peer.capacity(1, 10, 1, 0.7) != 7:
    fail("capacity(1, 10, 1, 0.7) must be 7")
print(f"capacity: {n} cases equal meshmoe's rule")


# 2. route() against the oracle
def compare(router, second, cf, seed):
    G, S, E = 64, 32, 8
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((G * S, E)) * 2
    probs = torch.tensor(logits, dtype=torch.float32).softmax(-1)
    c = cfg(router, S, E, cf, second)
    expert, slot, _, _ = ref.route(probs.numpy(), c, ref.Ctx(1, 1, 0), 0)
    k = c.k()
    keep2 = None
    if k == 2 and second == "threshold":
        top = probs.topk(2, -1).values
        keep2 = (top[:, 1].double() / top.sum(-1).double() > c.second_expert_threshold).view(G, S)
    e, gate, kept, s = peer.route(probs.view(G, S, E), k, c.capacity(), keep2)
    e, kept, s = e.reshape(-1, k).numpy(), kept.reshape(-1, k).numpy(), s.reshape(-1, k).numpy()
    want = np.ones_like(kept) if keep2 is None else np.stack([np.ones(G * S, bool), keep2.reshape(-1).numpy()], 1)
    if not np.array_equal(np.where(kept, e, np.where(want, -1, -2)), expert):
        fail(f"{router} {second} cf {cf}: experts/drops differ from the oracle")
    if not np.array_equal(np.where(kept, s, -1), slot):
        fail(f"{router} {second} cf {cf}: slots differ from the oracle")
    dropped = int((expert == -1).sum())
    print(f"route {router} second={second} cf={cf}: {G * S} tokens, {dropped} choices dropped, equal to the oracle")
    return dropped


total = 0
for cf in (0.5, 1.0, 1.25):
    total += compare("top1", "always", cf, 1)
    total += compare("top2", "always", cf, 2)
    total += compare("top2", "threshold", cf, 3)
if total == 0:
    fail("no choice dropped in any case: the comparison does not exercise capacity")

# 3. hand-computed cases
# top-1, S = 6, E = 3, f = 1: C = 2; first choices 0 0 0 1 2 0 -> expert 0 takes tokens 0 and 1
# (slots 0, 1), tokens 2 and 5 are dropped, token 3 -> expert 1 slot 0, token 4 -> expert 2 slot 0.
p = torch.tensor([[.6, .3, .1], [.5, .2, .3], [.7, .2, .1], [.2, .7, .1], [.1, .2, .7], [.4, .3, .3]])
e, g, kept, s = peer.route(p.view(1, 6, 3), 1, peer.capacity(1, 6, 3, 1.0), None)
if peer.capacity(1, 6, 3, 1.0) != 2 or e.view(-1).tolist() != [0, 0, 0, 1, 2, 0] or \
        kept.view(-1).tolist() != [True, True, False, True, True, False] or s.view(-1).tolist() != [0, 1, 2, 0, 0, 3] or \
        not torch.equal(g.view(-1), p.max(-1).values):
    fail(f"hand case top-1: experts {e.view(-1).tolist()} kept {kept.view(-1).tolist()} slots {s.view(-1).tolist()}")
# top-2, S = 4, E = 3, f = 1: C = ceil(8/3) = 3. First choices 0 0 1 0 fill expert 0 (slots 0-2) and
# expert 1 (slot 0); second choices 1 2 0 1, token 3's declined: token 0 -> expert 1 slot 1, token 1
# -> expert 2 slot 0, token 2 -> expert 0 slot 3 >= C dropped, token 3 takes no slot.
p = torch.tensor([[.5, .3, .2], [.5, .1, .4], [.3, .6, .1], [.7, .2, .1]])
e, g, kept, s = peer.route(p.view(1, 4, 3), 2, peer.capacity(2, 4, 3, 1.0), torch.tensor([[True, True, True, False]]))
if peer.capacity(2, 4, 3, 1.0) != 3 or e.view(4, 2).tolist() != [[0, 1], [0, 2], [1, 0], [0, 1]] or \
        kept.view(4, 2).tolist() != [[True, True], [True, True], [True, False], [True, False]] or \
        s.view(4, 2)[:, 1].tolist()[:3] != [1, 0, 3] or not torch.allclose(g.view(4, 2)[0], torch.tensor([.5 / .8, .3 / .8])):
    fail(f"hand case top-2: experts {e.view(4, 2).tolist()} kept {kept.view(4, 2).tolist()} slots {s.view(4, 2).tolist()}")
print("hand cases: top-1 (2 dropped) and top-2 (1 dropped, 1 declined) as computed by hand")

# 4. SortedMoe's output against a per-token loop over the kept choices
torch.manual_seed(0)
for router in ("top1", "top2"):
    c = dict(M=16, expert_d_ff=24, E=4, k=1 if router == "top1" else 2, group=8, cf=1.0, act="gelu")
    layer = peer.SortedMoe(c).double()
    x = torch.randn(3, 16, 16, dtype=torch.float64)
    torch.manual_seed(5)
    y, _ = layer(x)
    torch.manual_seed(5)  # the same random-routing draws
    tokens = x.reshape(-1, 16)
    probs = (tokens @ layer.wg).softmax(-1).view(-1, 8, 4)
    keep2 = None
    if c["k"] == 2:
        g2 = probs.topk(2, dim=-1).values
        keep2 = torch.rand(probs.shape[:2], dtype=torch.float32) < 2 * g2[..., 1] / g2.sum(-1)
    e, g, kept, _ = peer.route(probs, c["k"], layer.C, keep2)
    e, g, kept = e.reshape(-1, c["k"]), g.reshape(-1, c["k"]), kept.reshape(-1, c["k"])
    want = torch.zeros_like(tokens)
    for t in range(tokens.shape[0]):
        for j in range(c["k"]):
            if kept[t, j]:
                h = torch.nn.functional.gelu(tokens[t] @ layer.w_in[e[t, j]])
                want[t] += g[t, j] * (h @ layer.w_out[e[t, j]])
    # float64 sums of at most 24 products and 2 gates in any order differ by ~24 x 1.1e-16 relative
    # to the sum of |terms| (a few times the output here): 1e-12 holds for any BLAS kernel.
    err = (y.reshape(-1, 16) - want).abs().max().item() / want.abs().max().item()
    dropped, wanted = int(layer.dropped[0].sum()), int(layer.dropped[1].sum())
    if err > 1e-12 or dropped != int((~kept).sum()) - (0 if keep2 is None else int((~keep2).sum())) or dropped == 0:
        fail(f"SortedMoe {router}: output max-rel {err:.3g} against the per-token loop, dropped {dropped} of {wanted}")
    print(f"SortedMoe {router}: output equals the per-token loop (max-rel {err:.2g}), {dropped} of {wanted} choices dropped")
print("peer_routing_check: ok")
