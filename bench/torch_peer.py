#!/usr/bin/python3
"""The PyTorch peer of `make bench` (bench/speed.sh): the model of a meshmoe speed deck, written in
plain PyTorch 1.13 at its best on this host, timed per training step (forward, backward, AdamW).

Same shapes and the same work per token as meshmoe: token + position embedding, pre-LN blocks of
causal self-attention (q, k, v, o without biases) and a feed-forward (ReLU or GELU, no biases) that
is dense or MoE on every moe.every-th block, final LayerNorm, tied output projection, masked
cross-entropy over every token. The MoE layer is Switch top-1 or GShard top-2 routing in float32 with
capacity per group of moe.group_size tokens, the slot of each choice by cumulative sum (Tutel's
fast dispatch), tokens gathered into an [E, C, M] buffer, the experts as one batched GEMM, the
outputs scattered back weighted by their gates; the load-balancing loss is included. Random second
expert (GShard 2.2) as meshmoe's default. Only speed is compared here: correctness of meshmoe
against PyTorch is tests/reference/model_reference.py.

Best settings (bench/RESULTS.md "Host speed decks"; twice its default speed on 2 cores): OPENBLAS_NUM_THREADS=1 and torch.set_num_threads(T).
On a GPU (`--device cuda`, the peer of `make bench-gpu`): eager mode, fp32 without TF32 (meshmoe's
fp32 path) or `--precision bf16` (autocast to bf16 with fp32 master weights, PyTorch's usual mixed
precision); steps are timed with a device synchronisation at each end.
Usage: OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/torch_peer.py DECK.toml [--threads 2] [--steps 12]
                                  [--device cpu|cuda] [--precision fp32|bf16]
Prints one line: `torch_peer <name> step_s <median seconds> tokens <per step>`.
"""
import argparse
import math
import time
import tomllib

import h5py
import torch
import torch.nn as nn
import torch.nn.functional as F


def deck_config(path):
    with open(path, "rb") as f:
        d = tomllib.load(f)
    model, moe, optim = d.get("model", {}), d.get("moe", {}), d.get("optim", {})
    vocab = model.get("vocab_size", 0)
    if vocab == 0:
        with h5py.File(d.get("data", {}).get("path", "data/gettext.h5"), "r") as f:
            vocab = int(f.attrs["vocab_size"])
    every = moe.get("every", 2)
    num_experts = moe.get("num_experts", 8)
    return dict(name=d.get("run", {}).get("name", path), vocab=vocab, T=model.get("seq_len", 128),
                M=model.get("d_model", 128), layers=model.get("num_layers", 4), heads=model.get("num_heads", 4),
                d_ff=model.get("d_ff", 512), act=model.get("activation", "relu"),
                moe_every=every if num_experts > 1 else 0, E=num_experts,
                k=1 if moe.get("router", "top2") == "top1" else 2,
                expert_d_ff=moe.get("expert_d_ff", 0) or model.get("d_ff", 512),
                group=moe.get("group_size", 256), cf=moe.get("capacity_factor_train", 1.25),
                B=optim.get("batch_size", 16), micro_batches=optim.get("micro_batches", 1))


class Attention(nn.Module):
    def __init__(self, M, H):
        super().__init__()
        self.H = H
        self.qkv = nn.Linear(M, 3 * M, bias=False)
        self.o = nn.Linear(M, M, bias=False)

    def forward(self, x):
        B, T, M = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.H, M // self.H).permute(2, 0, 3, 1, 4)
        return self.o(self.causal(q, k, v).transpose(1, 2).reshape(B, T, M))

    @staticmethod
    def causal(q, k, v):
        """softmax(q k^T / sqrt(D) + causal mask) v over [B, H, T, D]: the T x T matrix materialised."""
        T = q.shape[-2]
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        return s.masked_fill(mask, float("-inf")).softmax(-1) @ v


class Dense(nn.Module):
    def __init__(self, M, H, act):
        super().__init__()
        self.w_in, self.w_out = nn.Linear(M, H, bias=False), nn.Linear(H, M, bias=False)
        self.act = F.relu if act == "relu" else F.gelu

    def forward(self, x):
        return self.w_out(self.act(self.w_in(x))), x.new_zeros(())


class Moe(nn.Module):
    def __init__(self, c):
        super().__init__()
        M, H, E = c["M"], c["expert_d_ff"], c["E"]
        self.E, self.k, self.S = E, c["k"], c["group"]
        self.C = min(self.S, math.ceil(self.k * self.S * c["cf"] / E))
        self.wg = nn.Parameter(torch.randn(M, E) / math.sqrt(M))
        self.w_in = nn.Parameter(torch.randn(E, M, H) / math.sqrt(M))
        self.w_out = nn.Parameter(torch.randn(E, H, M) / math.sqrt(H))
        self.act = F.relu if c["act"] == "relu" else F.gelu

    def forward(self, x):
        shape, M = x.shape, x.shape[-1]
        x = x.reshape(-1, self.S, M)  # [G, S, M]
        G, S, E, C = x.shape[0], self.S, self.E, self.C
        with torch.autocast(x.device.type, enabled=False):  # float32 router (Switch 2.4)
            gates = (x.float() @ self.wg).softmax(-1)  # [G, S, E]
        g1, e1 = gates.max(-1)
        choices = [(e1, g1)]
        if self.k == 2:
            g2, e2 = gates.masked_fill(F.one_hot(e1, E).bool(), 0).max(-1)
            denom = g1 + g2 + 1e-9
            keep2 = torch.rand_like(g2) < 2 * g2 / denom  # random routing of the second expert
            choices = [(e1, g1 / denom), (e2.masked_fill(~keep2, -1), g2 / denom)]
        # Load-balancing loss (Switch eq. 4) per group: E * sum_e f_e P_e.
        f = F.one_hot(e1, E).float().mean(1)
        aux = (E * (f * gates.mean(1)).sum(-1)).mean()
        # Slots by cumulative sum over the group, first choices before second ones (GShard Alg. 2).
        filled = torch.zeros(G, E, dtype=torch.long, device=x.device)
        buf = x.new_zeros(G * E * C + 1, M)  # the last row takes dropped choices
        rows = []
        for e, g in choices:
            oh = F.one_hot(e.clamp(min=0), E) * (e >= 0).unsqueeze(-1)
            slot = (oh.cumsum(1) - 1 + filled.unsqueeze(1)) * oh
            filled = filled + oh.sum(1)
            slot = slot.sum(-1)
            ok = (e >= 0) & (slot < C)
            row = torch.where(ok, (torch.arange(G, device=x.device).unsqueeze(1) * E + e.clamp(min=0)) * C + slot, G * E * C)
            rows.append((row.reshape(-1), (g * ok).reshape(-1, 1)))
        flat = x.reshape(-1, M)
        for row, _ in rows:
            buf = buf.index_copy(0, row, flat)
        h = buf[:-1].view(G, E, C, M).transpose(0, 1).reshape(E, G * C, M)
        out = torch.bmm(self.act(torch.bmm(h, self.w_in)), self.w_out)
        out = torch.cat([out.view(E, G, C, M).transpose(0, 1).reshape(-1, M), out.new_zeros(1, M)])
        y = sum(out.index_select(0, row) * g.to(out.dtype) for row, g in rows)
        return y.view(shape), aux


class Model(nn.Module):
    """attention and moe: the classes of the attention and MoE layers (bench/torch_peer_best.py passes
    its fused-attention and sorted-token ones)."""

    def __init__(self, c, attention=Attention, moe=Moe):
        super().__init__()
        M = c["M"]
        self.wte, self.wpe = nn.Embedding(c["vocab"], M), nn.Embedding(c["T"], M)
        self.blocks = nn.ModuleList()
        for i in range(c["layers"]):
            is_moe = c["moe_every"] > 0 and (i + 1) % c["moe_every"] == 0
            self.blocks.append(nn.ModuleList([nn.LayerNorm(M), attention(M, c["heads"]), nn.LayerNorm(M),
                                              moe(c) if is_moe else Dense(M, c["d_ff"], c["act"])]))
        self.lnf = nn.LayerNorm(M)
        for emb in (self.wte, self.wpe):
            nn.init.normal_(emb.weight, std=M ** -0.5)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe.weight[: tokens.shape[1]]
        aux = x.new_zeros(())
        for ln1, attn, ln2, ffn in self.blocks:
            x = x + attn(ln1(x))
            y, a = ffn(ln2(x))
            x, aux = x + y, aux + a
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1)) + 0.01 * aux


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("deck")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 is fp32, as meshmoe's cuBLAS path
        torch.backends.cudnn.allow_tf32 = False
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    c = deck_config(a.deck)
    model = Model(c).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0)
    tokens = torch.randint(0, c["vocab"], (c["B"], c["T"]), device=dev)
    targets = torch.randint(0, c["vocab"], (c["B"], c["T"]), device=dev)
    times = []
    for step in range(a.steps):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
    steady = sorted(times[2:]) if len(times) > 4 else sorted(times)
    mem = f" peak_mem_gib {torch.cuda.max_memory_allocated() / 2**30:.1f}" if a.device == "cuda" else ""
    print(f"torch_peer {c['name']} step_s {steady[len(steady) // 2]:.4f} tokens {c['B'] * c['T']} "
          f"loss {loss.item():.4f} device {a.device} precision {a.precision}{mem}")


if __name__ == "__main__":
    main()
