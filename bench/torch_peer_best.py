#!/usr/bin/env python3
"""PyTorch at its best on a GPU deck: the peer bench/gpu.sh runs beside meshmoe (docs/gpu.md).

The model of bench/torch_peer.py (same shapes, pre-LN blocks, tied head, GELU, no biases, the deck's
micro-batches as gradient accumulation), written as a PyTorch user of a recent version writes it:
  - attention: F.scaled_dot_product_attention(is_causal=True) (flash / memory-efficient backends; the
    T x T matrix never stored);
  - optimizer: AdamW(fused=True);
  - precision: bf16 autocast with fp32 master weights (--precision bf16), or fp32 without TF32;
  - --compile: the model under torch.compile (the first steps, which compile, are not timed);
  - MoE layers routed as the papers (Switch Transformers section 2.2 top-1, GShard section 2.2 /
    Algorithm 1 top-2 with random routing of the second expert): capacity C = ceil(k S f / E) per
    group of S = moe.group_size tokens, first choices take slots before second ones in token order,
    choices beyond C dropped (the residual carries the token); then only the filled slots are
    computed: the kept (token, expert) pairs sorted by expert, one GEMM pair per expert over its
    rows, the outputs added back weighted by their gates. Not the padded [E, C, M] batched GEMM of
    bench/torch_peer.py.
Where this torch lacks a feature (Debian's 1.13: no SDPA, no torch.compile, no fused AdamW) it
falls back (explicit masked softmax attention; AdamW foreach; eager) and the output line says so
under `fallbacks`.

Prints one line of `key value` pairs, starting `torch_peer_best <name>`: mode, device, precision,
step_s (median of the timed steps), tokens (a step), tokens_per_s, flops_per_token (--flops-per-token,
meshmoe's count, or this script's estimate), tflops, mfu_measured (against --peak-tflops, the measured
bf16 GEMM rate of bench/gpu_peak.py), mfu_spec (against --spec-tflops, by default the GPU's dense
bf16 datasheet figure: H100 SXM and H200 989), peak_mem_gib (torch.cuda.max_memory_allocated; on the
host the process's peak resident set), dropped (fraction of the wanted expert choices over capacity
in the last step), attention, adamw, fallbacks. "-" where a value does not apply.
Usage: bench/torch_peer_best.py DECK.toml [--device cuda|cpu] [--precision bf16|fp32] [--compile]
         [--steps 8] [--threads 2] [--peak-tflops X] [--spec-tflops X] [--flops-per-token F]
"""
import argparse
import inspect
import math
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_peer
from benchlib import spec_bf16_tflops


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


class SdpaAttention(torch_peer.Attention):
    @staticmethod
    def causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def capacity(k, S, E, factor):
    """Slots per expert and group (GShard section 2.2, Switch eq. 3), as meshmoe's expert_capacity:
    ceil(k S f / E), forgiving 1e-9 relative rounding, within [1, S]."""
    v = k * S * factor / E
    if not v < S:
        return S
    r = round(v)
    c = r if abs(v - r) <= 1e-9 * max(1.0, v) else math.ceil(v)
    return max(1, min(S, c))


def route(probs, k, C, keep_second=None):
    """The papers' routing of groups. probs [G, S, E] (softmax of the router logits); k 1 or 2;
    keep_second [G, S] bool: whether each token's second choice wants dispatch (GShard random
    routing), None: always. Returns expert, gate, kept, each [G, S, k]: choice j of token s is
    expert[., s, j] with gate[., s, j] (top-1: p, not renormalised; top-2: renormalised over the
    two), kept when it wants dispatch and its slot (first choices in token order, then second
    choices; a declined choice takes no slot) is below C. Also returns slot [G, S, k]."""
    G, S, E = probs.shape
    top_p, top_e = probs.topk(k, dim=-1)  # best first
    gate = top_p if k == 1 else top_p / top_p.sum(-1, keepdim=True)
    want = torch.ones_like(top_e, dtype=torch.bool)
    if k == 2 and keep_second is not None:
        want[..., 1] = keep_second
    filled = torch.zeros(G, E, dtype=torch.long, device=probs.device)
    slots = []
    for j in range(k):
        onehot = F.one_hot(top_e[..., j], E) * want[..., j].unsqueeze(-1)  # [G, S, E]
        before = onehot.cumsum(1) - onehot + filled.unsqueeze(1)  # this expert's slots taken before s
        slots.append((before * onehot).sum(-1))
        filled = filled + onehot.sum(1)
    slot = torch.stack(slots, -1)
    kept = want & (slot < C)
    return top_e, gate, kept, slot


class SortedMoe(nn.Module):
    """Switch top-1 or GShard top-2 over groups of S tokens, the filled slots computed by one GEMM
    pair per expert over the tokens sorted by expert."""

    def __init__(self, c):
        super().__init__()
        M, H, E = c["M"], c["expert_d_ff"], c["E"]
        self.E, self.k, self.S = E, c["k"], c["group"]
        self.C = capacity(self.k, self.S, E, c["cf"])
        self.wg = nn.Parameter(torch.randn(M, E) / math.sqrt(M))
        self.w_in = nn.Parameter(torch.randn(E, M, H) / math.sqrt(M))
        self.w_out = nn.Parameter(torch.randn(E, H, M) / math.sqrt(H))
        self.act = F.relu if c["act"] == "relu" else F.gelu
        self.dropped = (0, 0)  # (dropped, wanted) choices of the last forward

    def forward(self, x):
        shape, M = x.shape, x.shape[-1]
        tokens = x.reshape(-1, M)
        with torch.autocast(x.device.type, enabled=False):  # float32 router (Switch section 2.4)
            probs = (tokens.to(self.wg.dtype) @ self.wg).softmax(-1).view(-1, self.S, self.E)
        keep2 = None
        if self.k == 2:  # GShard random routing: dispatch the second with probability min(1, 2 g2)
            g2 = probs.topk(2, dim=-1).values
            keep2 = torch.rand(probs.shape[:2], device=x.device) < 2 * g2[..., 1] / g2.sum(-1)
        expert, gate, kept, _ = route(probs, self.k, self.C, keep2)
        f = F.one_hot(expert[..., 0], self.E).float().mean(1)  # Switch eq. 4-6, per group
        aux = (self.E * (f * probs.mean(1)).sum(-1)).mean()
        want = torch.ones_like(kept) if keep2 is None else torch.stack([torch.ones_like(keep2), keep2], -1)
        self.dropped = (want & ~kept, want)

        token = torch.arange(tokens.shape[0], device=x.device).unsqueeze(1).expand(-1, self.k)
        kept = kept.reshape(-1, self.k)
        e_kept = expert.reshape(-1, self.k)[kept]
        order = torch.sort(e_kept, stable=True).indices
        rows = token[kept][order]
        g_rows = gate.reshape(-1, self.k)[kept][order]
        counts = torch.bincount(e_kept, minlength=self.E).tolist()
        xs = tokens.index_select(0, rows)
        ys = [self.act(xe @ self.w_in[e]) @ self.w_out[e] for e, xe in enumerate(xs.split(counts)) if counts[e]]
        y = torch.cat(ys) if ys else xs[:0]
        out = torch.zeros_like(tokens, dtype=y.dtype).index_add(0, rows, y * g_rows.to(y.dtype).unsqueeze(1))
        return out.view(shape), aux


def estimated_flops_per_token(c):
    """6 x the GEMM parameters a token activates (head included) + causal attention's score and
    value products (6 x 2 x T x M per layer over the whole T x T, halved by the mask)."""
    M, L = c["M"], c["layers"]
    n_moe = L // c["moe_every"] if c["moe_every"] else 0
    per_ffn = 2 * M * c["d_ff"]
    params = L * 4 * M * M + (L - n_moe) * per_ffn + n_moe * c["k"] * 2 * M * c["expert_d_ff"] + c["vocab"] * M
    return 6 * params + 6 * L * c["T"] * M


def make_adamw(params, device):
    sig = inspect.signature(torch.optim.AdamW).parameters
    kw = dict(lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0)
    if "fused" in sig and device == "cuda":
        return torch.optim.AdamW(params, fused=True, **kw), "fused", None
    if "foreach" in sig:
        return torch.optim.AdamW(params, foreach=True, **kw), "foreach", "adamw=foreach"
    return torch.optim.AdamW(params, **kw), "plain", "adamw=plain"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("deck")
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--spec-tflops", type=float, default=None)
    ap.add_argument("--flops-per-token", type=float, default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    cuda = a.device == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    c = torch_peer.deck_config(a.deck)
    fallbacks = []
    attention = SdpaAttention if has_sdpa() else torch_peer.Attention
    if not has_sdpa():
        fallbacks.append("attention=math")
    model = torch_peer.Model(c, attention=attention, moe=SortedMoe).to(dev)
    opt, adamw, why = make_adamw(model.parameters(), a.device)
    if why:
        fallbacks.append(why)
    mode = "eager"
    step_model = model
    if a.compile:
        if hasattr(torch, "compile"):
            step_model, mode = torch.compile(model), "compile"
        else:
            fallbacks.append("compile=eager")
    B, mb, T = c["B"], c["micro_batches"], c["T"]
    if B % mb:
        raise SystemExit(f"torch_peer_best: optim.batch_size {B} is not divisible by optim.micro_batches {mb}")
    tokens = torch.randint(0, c["vocab"], (B, T), device=dev)
    targets = torch.randint(0, c["vocab"], (B, T), device=dev)
    warmup = 3 if mode == "compile" else 2
    times = []
    for step in range(a.steps):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for tk, tg in zip(tokens.chunk(mb), targets.chunk(mb)):
            with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                loss = step_model(tk, tg) / mb
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
    timed = times[warmup:] if len(times) > warmup else times
    step_s = statistics.median(timed)
    tps = B * T / step_s
    fpt = a.flops_per_token or estimated_flops_per_token(c)
    tflops = tps * fpt / 1e12
    name = torch.cuda.get_device_name() if cuda else "cpu"
    spec = a.spec_tflops or spec_bf16_tflops(name)
    fmt = lambda v, f: "-" if v is None else f.format(v)
    if cuda:
        peak_mem = torch.cuda.max_memory_allocated() / 2**30  # the tensors', without the allocator's cache
    else:
        peak_mem = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    moes = [m for m in model.modules() if isinstance(m, SortedMoe)]
    dropped = None
    if moes:
        dropped = sum(int(m.dropped[0].sum()) for m in moes) / sum(int(m.dropped[1].sum()) for m in moes)
    print(f"torch_peer_best {c['name']} mode {mode} device {a.device} precision {a.precision} "
          f"step_s {step_s:.4f} tokens {B * T} tokens_per_s {tps:.1f} flops_per_token {fpt:.4g} tflops {tflops:.4g} "
          f"mfu_measured {fmt(a.peak_tflops and tflops / a.peak_tflops, '{:.4f}')} mfu_spec {fmt(spec and tflops / spec, '{:.4f}')} "
          f"peak_mem_gib {peak_mem:.3f} dropped {fmt(dropped, '{:.4f}')} loss {loss.item() * mb:.4f} "
          f"attention {'sdpa' if attention is SdpaAttention else 'math'} adamw {adamw} "
          f"fallbacks {','.join(fallbacks) or 'none'}")


if __name__ == "__main__":
    main()
