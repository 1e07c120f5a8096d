#!/usr/bin/env python3
"""PyTorch reference of the whole meshmoe model.

Reads every $DIR/model_ref_<case>.h5 written by the hidden Catch case [model-torch]
(tests/unit/test_model_reference.cpp), rebuilds the same model in PyTorch from the stored weights,
independently of the C++ code, and compares. Written from the papers and the layer headers' stated
math, not from the C++ loops:
  - pre-LN decoder blocks: x += dropout(attn(ln1(x))); x += ffn(ln2(x)); final LN; head x W^T
    (W = the token embedding when tied); masked cross-entropy, "sum then scale" weights;
  - encoder-decoder (arch "encdec", Vaswani et al. 2017 with pre-LN): encoder blocks 0..L-1 with
    bidirectional self-attention within each packed example, ln_enc; decoder blocks L..2L-1 with
    x += dropout(cross(ln_cross(x), enc)) after the self-attention, the queries of example s seeing
    the encoder tokens of example s; MoE every moe_every-th block of each stack;
  - MoE routing in GShard's dense one-hot einsum form (Algorithm 2): dispatch and combine tensors
    [G, S, E, C] built from this script's own routing decisions (top-k with capacity per group in
    choice-then-token order, random routing of the second expert (GShard 2.2), threshold routing,
    No-Token-Left-Behind (Switch appendix B, the rule stated in src/model/moe/router.cpp), top-1
    gate not renormalised (Switch eq. 2), aux loss Switch eq. 4 per group, z-loss sum of
    logsumexp^2), so autograd gives every gradient; moe.gate softmax_topk (Mixtral section 2.1:
    the chosen gates always renormalised) and sigmoid (DeepSeek-V3 section 2.1.2: torch.sigmoid
    scores, gates normalised over the chosen k, aux loss over s / sum(s), no z-loss), the routed
    scale multiplying the combine weights;
  - the blocks of today's MoE models (docs/ARCHITECTURE.md "Blocks"): norm "rmsnorm" (Zhang and
    Sennrich 2019: x / sqrt(mean(x^2) + eps) * gain, no bias) for every norm; position "rope": no
    position table, the queries and keys of every self-attention (not the cross-attention's)
    rotated as the Hugging Face Llama code does (q * cos + rotate_half(q) * sin, rotate_half(q) =
    cat(-q[D/2:], q[:D/2]), angles position * rope_base^(-2i/D), positions restarting with each
    packed example); activation "swiglu" (silu(x W1) * (x W3)); moe_first_dense leading dense blocks;
  - jitter, random routing, dropout and expert dropout from Philox 4x32-10 reimplemented in numpy
    (philox.py) with the index formulas stated in dropout.hpp, router.cpp and experts.cpp;
  - optimizers: torch.optim.AdamW and the paper Adafactor of optim_reference.py (imported), with
    clip_grad_norm_ and the schedule of optim_reference.py, update t = 1..steps.

Tolerances (fp32 on both sides; "max-rel" = max |cpp - ref| / max |ref| over the tensor):
  routing decisions (expert, slot of every choice)  exactly equal
  logits                                            max-rel <= 1e-5
  ce_sum, aux_sum, z_sum, total loss                |cpp - ref| <= 1e-5 |ref| + 1e-12
  every parameter gradient                          max |cpp - ref| <= 1e-4 max |ref| + 1e-7
  loss curves (AdamW, Adafactor; 10 steps each)     |cpp - ref| <= 1e-4 |ref| per step
  gradient-norm curves                              |cpp - ref| <= 1e-4 |ref| per step
  learning rates                                    |cpp - ref| <= 1e-12 |ref|

Precision "bf16" (the *_bf16 cases): every GEMM of the model (not the router's) takes its operands
rounded to bf16 by PyTorch's own conversion (to nearest, ties to even), in the forward and in both
GEMMs of its backward (Bf16Gemm), products summed in fp32. The tolerances are the fp32 ones above,
and they hold because every bf16 pass is compared with the C++ side's roundings:
  - what differs between the sides is the order of the fp32 sums (PyTorch's and OpenBLAS's GEMMs; and
    OpenBLAS picks its kernel by CPU, OPENBLAS_CORETYPE), so a value both sides round to bf16 differs
    between them by a few units of 2^-23 max(|v|, rms of its operand) (between two OpenBLAS kernels:
    at most 11 units, most 1);
  - the roundings that can then differ are those of values that close to a bf16 rounding midpoint
    (half-way between two bf16 neighbours): of the 1e4-4e4 distinct values a pass rounds (the
    weights aside), 40-500 lie within 4 units, and which of them flip depends on the kernels: 10
    to 18 of the 84 bf16 passes of a run have one (seen over ten pairings of the C++ side's and
    PyTorch's kernels), one in ten of those two;
  - one flip moves an operand element by one bf16 ulp (2^-8 to 2^-7 of itself, 2^16 fp32 ulps), and
    everything downstream rounds afresh from there: one flip at random in the reference moved the
    logits by up to 8e-3 of their largest, a gradient tensor by up to 0.4 of its largest (typically
    1e-3), the gradient norm by up to 1e-2 and the loss by up to 2e-4, beyond every tolerance above
    and as large as the whole difference between bf16 and fp32, so no bound can cover a flip and
    still tell bf16 from fp32;
  - so a bf16 pass that mismatches is run again with candidate roundings taken the other way
    (match_roundings: values within FLIP_RADII units of a midpoint, the weights excepted, which both
    sides read from the same file), one more at a time, at most MAX_FLIPS per pass: a pass that then
    agrees to the tolerances above was compared with the roundings the C++ side took. The roundings
    taken are printed with their distance from the midpoint (seen: 0.0 to 2.6 units);
  - a bug cannot hide there: a flip changes one value that lies at a midpoint by one bf16 ulp, while a
    wrong C++ side (an operand left unrounded, a wrong gradient term) differs in thousands of values
    of every pass, and no MAX_FLIPS flips make such a pass agree to the tolerances; the search has
    SEARCH_LEFT CPU seconds in all, so a wrong side fails in minutes, not hours.
Two checks make sure the cases test bf16: the fp32 model's logits and gradients are at least 10x
further from the C++ ones than the bf16 reference's. The curves: a trajectory run freely on both
sides drifts apart (a master weight a last bit apart rounds to another bf16 value a few steps on,
and the 2^-8 jump feeds back: 1e-2 after 10 steps in encdec_top2_bf16), so for bf16 cases each step
starts from the C++ side's weights at that step (/train/<opt>/params_<t>), and compares its logits
and gradients (/train/<opt>/logits_<t>, grads_<t>) with the single pass's tolerances, and the loss
and gradient-norm curves to 1e-4.
The optimizers, fp32 in both precisions, are compared free-running by the fp32 cases.
Prints the worst error per quantity; exits 1 on any mismatch or a missing case file.
Usage: /usr/bin/python3 tests/reference/model_reference.py DIR
"""
import math
import os
import sys
import time

import h5py
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from optim_reference import PaperAdafactor, schedule  # noqa: E402
from philox import DROPOUT, EXPERT_DROPOUT, JITTER, SECOND_EXPERT, Rng  # noqa: E402

CASES = ["dense_relu", "switch_top1", "gshard_top2", "geglu_untied", "encdec_top2", "top2_ntlb", "shared_experts",
         "bias_ntlb", "gshard_line22", "expert_choice", "encdec_expert_choice", "softmax_topk_top1", "sigmoid_bias",
         "sigmoid_aux", "deepseekmoe_gates",
         "dense_relu_bf16", "gshard_top2_bf16", "switch_top1_bf16", "encdec_top2_bf16",
         "blocks_top2", "blocks_encdec", "blocks_top2_bf16", "gqa_top2", "mqa_top2_bf16"]
CLIP_COUNTS = []  # fraction of clipped steps of every training run
TOL_LOGITS, TOL_SCALAR, TOL_GRAD_REL, TOL_GRAD_ABS, TOL_CURVE, TOL_LR = 1e-5, 1e-5, 1e-4, 1e-7, 1e-4, 1e-12
# bf16: the search for the roundings the C++ side took the other way (module docstring, "Precision bf16")
FLIP_RADII = (4.0, 16.0, 128.0)  # rings of candidates, in units of 2^-23 max(|v|, rms) from a midpoint
MAX_FLIPS = 3  # roundings taken the other way in one forward/backward, at most
MAX_TRIES = 1000  # passes run to find one of them, at most
SEARCH_LEFT = [120.0]  # CPU seconds of searching left to the whole script: a broken C++ side fails in time


class Cfg:
    # Attributes of the blocks (docs/ARCHITECTURE.md "Blocks") with the meaning of a file that lacks them.
    norm, position, rope_base, moe_first_dense = "layernorm", "learned", 10000.0, 0
    kv_heads = 0  # grouped-query attention's key/value heads; 0: num_heads

    def __init__(self, attrs):
        for k, v in attrs.items():
            if isinstance(v, bytes):
                v = v.decode()
            elif isinstance(v, np.generic):
                v = v.item()
            setattr(self, k, v)

    def k(self):
        """Choices per token; expert choice: one per expert (taken or not)."""
        return {"top1": 1, "top2": 2, "expert_choice": self.num_experts}.get(self.router, self.top_k)

    def gate_kind(self):
        return getattr(self, "gate", "softmax")

    def renormalised(self):
        """Gates over the chosen k summing to 1 (GShard top-2, top-k; Mixtral's Softmax(TopK); DeepSeek-V3
        eq. 13); softmax top-1 (Switch eq. 2) and expert choice gate with p itself."""
        if self.router == "expert_choice" or self.gate_kind() == "softmax_unnormalised":
            return False
        return self.gate_kind() != "softmax" or self.router != "top1"

    def encoder_layers(self):
        return self.num_layers if self.arch == "encdec" else 0

    def blocks(self):
        return self.num_layers + self.encoder_layers()

    def is_moe(self, i):
        """Block i (global index); the rule counts within each stack."""
        j = i - self.encoder_layers() if i >= self.encoder_layers() else i
        return self.moe_every > 0 and (j + 1) % self.moe_every == 0 and j >= self.moe_first_dense

    def capacity(self):
        """C = ceil(k S cf / E) forgiving 1e-9 relative rounding, in [1, S]; dropless: S (GShard section 2.2, Switch eq. 3)."""
        S = self.group_size
        if self.dropless:
            return S
        per_token = 1 if self.router == "expert_choice" else self.k()  # Zhou et al. 3.1: k = n c / E
        v = per_token * S * self.capacity_factor_train / self.num_experts
        r = round(v)
        c = r if abs(v - r) <= 1e-9 * max(1.0, v) else math.ceil(v)
        return int(min(max(c, 1), S))


class Ctx:
    def __init__(self, seed, step, token_offset, training=True):
        self.seed, self.step, self.token_offset, self.training = int(seed), int(step), int(token_offset), training


# ---------------------------------------------------------------------------------------------
# Random masks (numpy, exact bits), returned as float32 tensors

def dropout_scale(ctx, layer, purpose, rate, N, C):
    """[N, C] keep * 1/(1-rate): element (token g, column c) kept when
    uniform(g * ceil(C/4) + c // 4, lane c % 4) >= rate (dropout.hpp)."""
    per = (C + 3) // 4
    g = ctx.token_offset + np.arange(N, dtype=np.uint64)
    idx = g[:, None] * np.uint64(per) + np.arange(per, dtype=np.uint64)[None, :]
    bits = np.stack(Rng(ctx.seed, ctx.step, layer, purpose).bits(idx), axis=-1).reshape(N, 4 * per)[:, :C]
    u = (bits >> np.uint64(8)).astype(np.float64) / 16777216.0
    return torch.from_numpy(np.where(u >= rate, np.float32(1.0 / (1.0 - rate)), np.float32(0)).astype(np.float32))


def dropout(x, ctx, layer, rate):
    if not ctx.training or rate <= 0:
        return x
    return x * dropout_scale(ctx, layer, DROPOUT, rate, x.shape[0], x.shape[1])


# ---------------------------------------------------------------------------------------------
# The model's GEMMs (precision "bf16": Switch Transformer section 2.4, selective precision)

def to_bf16(t):
    """t rounded to bfloat16 (PyTorch's own conversion: to nearest, ties to even), back in fp32."""
    return t.to(torch.bfloat16).to(torch.float32)


class Roundings:
    """The bf16 roundings of one forward/backward, some taken the other way (module docstring,
    "Precision bf16"): `flips` are the fp32 bit patterns (int32) of values rounded to their other
    bf16 neighbour, not the nearest; every copy of such a value is (a value is rounded once per GEMM
    that reads it, on both sides). Records what was rounded, and when, for the candidates."""

    def __init__(self, flips=()):
        self.flips = np.array(sorted(flips), dtype=np.int32)
        self.seen = []  # the values of every rounded operand, flat, in order
        self.backward = None  # index in `seen` of the backward's first rounding
        self.done = {}  # parameter name -> roundings made before its gradient was complete

    def round(self, t, backward=False):
        if backward and self.backward is None:
            self.backward = len(self.seen)
        r = to_bf16(t)
        v = t.detach().contiguous()
        if self.flips.size:
            m = torch.from_numpy(np.isin(v.view(torch.int32).numpy(), self.flips))
            if bool(m.any()):
                bits = r.contiguous().view(torch.int32)  # the other neighbour: one bf16 ulp towards v
                other = torch.where(v.abs() > r.abs(), bits + 0x10000, bits - 0x10000).view(torch.float32)
                r = torch.where(m, other, r)
        self.seen.append(v.reshape(-1).numpy())
        return r

    def candidates(self, exclude, radius):
        """{bit pattern: (distance, first rounding)} of the nonzero values rounded in this pass within
        `radius` of a bf16 rounding midpoint (half-way between two neighbours), the distance in units
        of 2^-23 max(|v|, rms of the operand), `exclude` (the weights' bit patterns) left out."""
        found = {}
        for i, v in enumerate(self.seen):
            bits = v.view(np.int32)
            v64 = np.abs(v).astype(np.float64)
            # the midpoint has v's upper 16 bits and 0x8000 below them: |low 16 bits - 0x8000| ulps away
            dist = np.abs((bits.astype(np.int64) & 0xFFFF) - 0x8000) * np.spacing(np.abs(v)).astype(np.float64)
            unit = 2.0**-23 * np.maximum(v64, np.sqrt(np.mean(v64 * v64)))
            sel = (v != 0) & (dist <= radius * unit)
            for b, d in zip(bits[sel].tolist(), (dist[sel] / unit[sel]).tolist()):
                if b not in exclude and (b not in found or d < found[b][0]):
                    found[b] = (d, min(i, found.get(b, (0, i))[1]))
        return found


ROUNDINGS = None  # the Roundings of the pass being run (bf16), None: plain rounding to nearest


def rounded(t, backward=False):
    return to_bf16(t) if ROUNDINGS is None else ROUNDINGS.round(t, backward)


def watch(P):
    """Hooks noting, in the running pass's Roundings, when each parameter's gradient is complete
    (autograd calls a leaf's hook once, with all contributions summed)."""
    for n, p in P.items():
        p.register_hook(lambda g, n=n: None if ROUNDINGS is None else ROUNDINGS.done.__setitem__(n, len(ROUNDINGS.seen)))


class Bf16Gemm(torch.autograd.Function):
    """alpha (bf16(a) @ bf16(b)): operands rounded to bf16, exact products summed in fp32 (the
    rounding passes the gradient straight through). The backward's two GEMMs round their operands
    too: da = alpha bf16(g) bf16(b)^T, db = alpha bf16(a)^T bf16(g)."""

    @staticmethod
    def forward(ctx, a, b, alpha):
        ctx.save_for_backward(a, b)
        ctx.alpha = alpha
        return scaled(rounded(a) @ rounded(b), alpha)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        g = rounded(g, backward=True)
        da = scaled(g @ rounded(b, True).transpose(-1, -2), ctx.alpha)
        db = scaled(rounded(a, True).transpose(-1, -2) @ g, ctx.alpha)
        return da, db, None


def scaled(t, alpha):
    return t if alpha == 1.0 else t * np.float32(alpha)


def gemm(a, b, cfg, alpha=1.0):
    """A GEMM of the model (not the router's): alpha a @ b, in the case's precision."""
    if getattr(cfg, "precision", "fp32") == "bf16":
        return Bf16Gemm.apply(a, b, alpha)
    return scaled(a @ b, alpha)


# ---------------------------------------------------------------------------------------------
# Layers

def activation(name, pre, H):
    if name == "relu":
        return torch.relu(pre)
    if name == "gelu":
        return F.gelu(pre)
    if name == "swiglu":
        return F.silu(pre[..., :H]) * pre[..., H:]  # silu(x W1) * (x W3)
    return F.gelu(pre[..., :H]) * pre[..., H:]  # geglu: gelu(first H) * linear gate (last H)


def rope(t, positions, base):
    """Rotary embedding of t [B, heads, T, D] at positions [B, T], the Hugging Face Llama way:
    t * cos + rotate_half(t) * sin, rotate_half(t) = cat(-t[..., D/2:], t[..., :D/2]), the angles
    position * base^(-2i/D) (i < D/2) repeated over both halves; angles, cos and sin in float64."""
    D = t.shape[-1]
    inv_freq = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angle = torch.from_numpy(positions.astype(np.float64))[:, None, :, None] * inv_freq  # [B, 1, T, D/2]
    angle = torch.cat([angle, angle], dim=-1)
    cos, sin = angle.cos().to(t.dtype), angle.sin().to(t.dtype)
    half = torch.cat([-t[..., D // 2:], t[..., :D // 2]], dim=-1)
    return t * cos + half * sin


def attention(x, P, pre, cfg, B, T, segment, causal=True, kv=None, kv_segment=None):
    """Multi-head attention, no biases; column head*D + d of wq/wk/wv. segment [B, T]: a query sees
    the keys of its own packed example, up to itself when causal. Cross-attention: keys and values
    from kv [B*Tk, M] with segment ids kv_segment [B, Tk]; a query with no key gets zeros."""
    M, Hh = cfg.d_model, cfg.num_heads
    D = M // Hh
    def heads(src, w, n, count=Hh):
        return gemm(src, P[pre + w], cfg).view(B, n, count, D).transpose(1, 2)  # [B, count, n, D]

    # Grouped-query attention, the Hugging Face Llama/Mixtral way: k, v with kv_heads heads, then
    # repeat_kv (key/value head j serves query heads j * group ... j * group + group - 1).
    KVh = cfg.kv_heads if kv is None and cfg.kv_heads > 0 else Hh

    def repeat_kv(t):
        return t[:, :, None].expand(B, KVh, Hh // KVh, Tk, D).reshape(B, Hh, Tk, D)

    self_attention = kv is None
    if kv is None:
        kv, kv_segment = x, segment
        Tk = T
    else:
        Tk = kv_segment.shape[1]
    q, k, v = heads(x, ".wq", T), heads(kv, ".wk", Tk, KVh), heads(kv, ".wv", Tk, KVh)
    if cfg.position == "rope" and self_attention:  # self-attention only: the cross-attention is not rotated
        pos = example_positions(segment)
        q, k = rope(q, pos, cfg.rope_base), rope(k, pos, cfg.rope_base)
    k, v = repeat_kv(k), repeat_kv(v)
    s = gemm(q, k.transpose(-1, -2), cfg, 1.0 / math.sqrt(D))
    seg = torch.from_numpy(segment.astype(np.int64))
    kseg = torch.from_numpy(kv_segment.astype(np.int64))
    seen = seg[:, :, None] == kseg[:, None, :]  # [B, T, Tk]
    if causal:
        seen = seen & torch.ones(T, Tk, dtype=torch.bool).tril()
    p = torch.softmax(s.masked_fill(~seen[:, None], float("-inf")), dim=-1)
    p = torch.where(seen[:, None].any(-1, keepdim=True), p, torch.zeros_like(p))
    o = gemm(p, v, cfg).transpose(1, 2).reshape(B * T, M)
    return gemm(o, P[pre + ".wo"], cfg)


def mlp(x, P, pre, cfg):
    H = cfg.d_ff
    w_in = P[pre + ".w_in"].reshape(cfg.d_model, -1)  # [M, H] or [M, 2, H] -> [M, 2H]
    return gemm(activation(cfg.activation, gemm(x, w_in, cfg), H), P[pre + ".w_out"], cfg)


def route(probs_np, cfg, ctx, layer, bias=None):
    """Routing decisions from the (fp32) router probabilities: expert and slot of each of the k
    choices of every token (-1 dropped, -2 declined second choice), the top-k sets, the normaliser Z.
    bias [E] (moe.balance = bias): the experts are ranked by probability + bias (in double), the
    gates and Z stay the probabilities'."""
    N, E = probs_np.shape
    k, S, C = cfg.k(), cfg.group_size, cfg.capacity()
    score = probs_np if bias is None else probs_np.astype(np.float64) + bias.astype(np.float64)[None, :]
    order = np.argsort(-score, axis=1, kind="stable")  # best first, ties to the lower expert index
    top = order[:, :k]
    Z = np.ones(N) if not cfg.renormalised() else np.array([sum(float(probs_np[n, e]) for e in top[n]) for n in range(N)])
    want = np.ones((N, k), dtype=bool)
    if cfg.router == "top2" and cfg.second_expert != "always":
        g2 = probs_np[np.arange(N), top[:, 1]].astype(np.float64) / Z
        if cfg.second_expert == "threshold":
            want[:, 1] = g2 > cfg.second_expert_threshold
        elif ctx.training:
            u = Rng(ctx.seed, ctx.step, layer, SECOND_EXPERT).uniform_double(
                ctx.token_offset + np.arange(N, dtype=np.uint64))
            want[:, 1] = 2.0 * g2 > u  # GShard Algorithm 1 line 18: dispatch with prob. min(1, 2 g2)
    expert = np.full((N, k), -1, dtype=np.int64)
    slot = np.full((N, k), -1, dtype=np.int64)
    literal = bool(getattr(cfg, "declined_takes_slot", 0))
    for g in range(N // S):
        count = np.zeros(E, dtype=np.int64)  # position counters c_E of GShard Algorithm 1
        dropped = []
        for i in range(k):  # all first choices of the group, then all second choices, ...
            for s in range(S):
                n = g * S + s
                e = top[n, i]
                if not want[n, i]:
                    expert[n, i] = -2
                    if literal:
                        count[e] += 1  # Algorithm 1 line 22: c_e2 <- c + 1 outside the if
                    continue
                if count[e] < C:
                    expert[n, i], slot[n, i] = e, count[e]
                    count[e] += 1
                else:
                    dropped.append((n, i))
        if cfg.no_token_left_behind:
            # Switch appendix B: each overflowed choice (choice order, then token order) goes to its
            # best-ranked expert outside its original top-k that holds none of its choices and has room.
            for n, i in dropped:
                for e in order[n, k:]:
                    if e in expert[n] or count[e] >= C:
                        continue
                    expert[n, i], slot[n, i] = e, count[e]
                    count[e] += 1
                    break
    return expert, slot, top, Z


def route_expert_choice(probs, cfg):
    """Expert choice (Zhou et al. 2022, section 3.1) in the paper's own terms: per group, S^T [E, S]
    and I = TopK(S^T, C) over the tokens (torch.topk, ties resolved to the lower token index by a
    stable descending sort); the gating G [E, C] is S[I[e, j], e]. Returned as the per-choice arrays
    of route(): choice (n, e) is expert e's take of token n, slot j where I[e, j] = n, -1 when not
    taken."""
    N, E = probs.shape
    S, C = cfg.group_size, cfg.capacity()
    expert = np.full((N, E), -1, dtype=np.int64)
    slot = np.full((N, E), -1, dtype=np.int64)
    p = torch.from_numpy(probs)
    for g in range(N // S):
        st = p[g * S:(g + 1) * S].t()  # [E, S]
        I = torch.sort(st, dim=1, descending=True, stable=True).indices[:, :C]  # [E, C]
        for e in range(E):
            for j, s in enumerate(I[e].tolist()):
                expert[g * S + s, e], slot[g * S + s, e] = e, j
    return expert, slot


def moe(x, P, pre, cfg, ctx, layer, routing_out, bias=None):
    N, M = x.shape
    E, S, C, k = cfg.num_experts, cfg.group_size, cfg.capacity(), cfg.k()
    G, H = N // S, cfg.expert_d_ff
    xr = x
    if ctx.training and cfg.jitter_eps > 0:  # Switch appendix C, keyed by global token * M + m
        idx = (ctx.token_offset + np.arange(N, dtype=np.uint64))[:, None] * np.uint64(M) + np.arange(M, dtype=np.uint64)
        u = Rng(ctx.seed, ctx.step, layer, JITTER).uniform_double(idx)
        xr = x * torch.from_numpy((1.0 - cfg.jitter_eps + 2.0 * cfg.jitter_eps * u).astype(np.float32))
    logits64 = (xr @ P[pre + ".router.wg"]).double()  # router in fp32, softmax in double
    if cfg.gate_kind() == "sigmoid":  # DeepSeek-V3 section 2.1.2 eq. 15; no z-loss
        probs = torch.sigmoid(logits64).float()
        z_sum = torch.zeros((), dtype=torch.float64)
    else:
        lse = torch.logsumexp(logits64, dim=-1)
        probs = torch.softmax(logits64, dim=-1).float()  # [N, E]
        z_sum = (lse * lse).sum()

    if cfg.router == "expert_choice":
        expert, slot = route_expert_choice(probs.detach().numpy(), cfg)
        top = None
    else:
        expert, slot, top, Z = route(probs.detach().numpy(), cfg, ctx, layer, bias)
    routing_out.append((expert, slot))

    # Switch eq. 4-6 per group: f_e from the top-1 choice before capacity, P_e the mean probability.
    frac = np.zeros((G, E))  # expert choice: no aux loss (the paper needs none)
    for n in range(N if top is not None else 0):
        frac[n // S, top[n, 0]] += 1.0 / S
    # Sigmoid scores: P_e over s / sum_e s (DeepSeek-V3 eq. 19-20).
    p_aux = probs.double()
    if cfg.gate_kind() == "sigmoid":
        p_aux = p_aux / p_aux.sum(-1, keepdim=True)
    aux_sum = (E * torch.from_numpy(frac) * p_aux.view(G, S, E).sum(1) / S).sum()

    # GShard Algorithm 2 in dense one-hot form.
    disp = np.zeros((G, S, E, C), dtype=np.float32)
    slot_token = np.full((E, G, C), -1, dtype=np.int64)
    for n in range(N):
        for i in range(k):
            if expert[n, i] >= 0:
                disp[n // S, n % S, expert[n, i], slot[n, i]] = 1
                slot_token[expert[n, i], n // S, slot[n, i]] = ctx.token_offset + n
    dispatch = torch.from_numpy(disp)
    if not cfg.renormalised():
        gates = probs  # Switch eq. 2, and expert choice's G[e, j] = S[I[e, j], e]: not renormalised
    else:
        topmask = torch.zeros(N, E, dtype=torch.float64)
        topmask[torch.arange(N).unsqueeze(1), torch.from_numpy(top)] = 1
        gates = (probs.double() / (probs.double() * topmask).sum(-1, keepdim=True)).float()
    gates = gates * getattr(cfg, "routed_scale", 1.0)  # y = scale * sum of gated outputs + shared
    combine = gates.view(G, S, E, 1) * dispatch  # [G, S, E, C]
    xin = torch.einsum("gsec,gsm->egcm", dispatch, x.view(G, S, M))
    w_in = P[pre + ".experts.w_in"].reshape(E, M, -1)
    h = activation(cfg.activation, gemm(xin.reshape(E, G * C, M), w_in, cfg).view(E, G, C, -1), H)  # egcm,emh->egch
    p = cfg.expert_dropout if ctx.training else 0.0
    if p > 0:  # Switch 2.4 expert dropout, keyed by (global token, expert, hidden unit)
        tok = np.maximum(slot_token, 0).astype(np.uint64)
        idx = ((tok * np.uint64(E) + np.arange(E, dtype=np.uint64)[:, None, None])[..., None] * np.uint64(H)
               + np.arange(H, dtype=np.uint64))
        u = Rng(ctx.seed, ctx.step, layer, EXPERT_DROPOUT).uniform_double(idx)
        drop = (slot_token >= 0)[..., None] & (u < p)
        h = h * torch.from_numpy(np.where(drop, np.float32(0), np.float32(1.0 / (1.0 - p))).astype(np.float32))
    out = gemm(h.reshape(E, G * C, H), P[pre + ".experts.w_out"], cfg).view(E, G, C, M)  # egch,ehm->egcm
    y = torch.einsum("gsec,egcm->gsm", combine, out).reshape(N, M)
    # Shared experts (DeepSeekMoE eq. 3): each of the n experts on its own slice [i H, (i+1) H) of
    # the hidden units, summed (an independent form of the C++ one-feed-forward-of-width-n-H).
    n = getattr(cfg, "shared_experts", 0)
    if n > 0:
        w_in = P[pre + ".shared.w_in"].reshape(M, -1, n * H)  # [M, 1 or 2, nH]
        w_out = P[pre + ".shared.w_out"]  # [nH, M]
        for i in range(n):
            cols = w_in[:, :, i * H:(i + 1) * H].reshape(M, -1)  # expert i's [M, H] or [M, 2H]
            y = y + gemm(activation(cfg.activation, gemm(x, cols, cfg), H), w_out[i * H:(i + 1) * H], cfg)
    return y, aux_sum, z_sum


def example_positions(segment):
    """[B, T] position of each token within its packed example (segments are runs of equal ids)."""
    pos = np.zeros(segment.shape, dtype=np.int64)
    for b in range(segment.shape[0]):
        for j in range(1, segment.shape[1]):
            pos[b, j] = pos[b, j - 1] + 1 if segment[b, j] == segment[b, j - 1] else 0
    return pos


def forward(P, cfg, inputs, targets, mask, segment, ctx, enc_inputs=None, enc_segment=None, bias=None):
    """Returns logits [N, V], ce_sum (fp32 tensor), aux_sum, z_sum (fp64 tensors), routing list.
    encdec: enc_inputs, enc_segment [B, T] are the encoder side (inputs etc. the decoder's).
    bias: {block: [E]} selection biases of the MoE blocks (moe.balance = bias)."""
    B, T = inputs.shape
    N, M = B * T, cfg.d_model
    aux = torch.zeros((), dtype=torch.float64)
    z = torch.zeros((), dtype=torch.float64)
    routing = []
    def ln(v, p):
        if cfg.norm == "rmsnorm":
            return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + cfg.layernorm_eps) * P[p + ".gain"]
        return F.layer_norm(v, (M,), P[p + ".gain"], P[p + ".bias"], cfg.layernorm_eps)

    def embed(tokens, seg):
        tok = torch.from_numpy(tokens.reshape(-1).astype(np.int64))
        if cfg.position == "rope":
            return P["embed.wte"][tok]
        return P["embed.wte"][tok] + P["embed.wpe"][torch.from_numpy(example_positions(seg).reshape(-1))]

    def block(x, i, seg, causal, enc=None):
        nonlocal aux, z
        b = f"blocks.{i}"
        x = x + dropout(attention(ln(x, b + ".ln1"), P, b + ".attn", cfg, B, T, seg, causal), ctx, 16 * i + 1,
                        cfg.dropout)
        if enc is not None:
            c = attention(ln(x, b + ".ln_cross"), P, b + ".cross", cfg, B, T, seg, False, enc, enc_segment)
            x = x + dropout(c, ctx, 16 * i + 4, cfg.dropout)
        h = ln(x, b + ".ln2")
        if cfg.is_moe(i):
            f, a, zz = moe(h, P, b + ".moe", cfg, ctx, 16 * i + 3, routing, (bias or {}).get(i))
            aux, z = aux + a, z + zz
        else:
            f = dropout(mlp(h, P, b + ".mlp", cfg), ctx, 16 * i + 2, cfg.dropout)
        return x + f

    L_enc = cfg.encoder_layers()
    enc = None
    if L_enc:
        e = embed(enc_inputs, enc_segment)
        for i in range(L_enc):
            e = block(e, i, enc_segment, False)
        enc = ln(e, "ln_enc")
    x = embed(inputs, segment)
    for i in range(L_enc, cfg.blocks()):
        x = block(x, i, segment, True, enc)
    W = P["embed.wte"] if cfg.tied_embeddings else P["head.wout"]
    logits = gemm(ln(x, "ln_f"), W.t(), cfg)
    m = torch.from_numpy(mask.reshape(-1).astype(np.float32))
    t = torch.from_numpy(np.maximum(targets.reshape(-1), 0).astype(np.int64))
    nll = torch.logsumexp(logits, -1) - logits.gather(1, t.unsqueeze(1)).squeeze(1)
    return logits, (m * nll).sum(), aux, z, routing


def loss_weights(cfg, mask):
    tokens = float(mask.size)
    return 1.0 / max(1.0, float(mask.sum())), cfg.aux_loss_coef / (tokens / cfg.group_size), cfg.z_loss_coef / tokens


# ---------------------------------------------------------------------------------------------
# Comparison

class Report:
    def __init__(self, case):
        self.case, self.failures = case, []

    def check(self, what, err, limit, detail=""):
        ok = err <= limit
        print(f"  {'ok  ' if ok else 'FAIL'} {what:<34} worst {err:.3e} (limit {limit:.3e}){detail}")
        if not ok:
            self.failures.append(f"{self.case}: {what}")


def mismatch(pairs):
    """{name: max |cpp - ref| / limit} of [(name, cpp, ref, limit)]."""
    return {n: float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)))) / lim
            for n, a, b, lim in pairs}


def grad_pairs(cpp, grads, init):
    """(name, cpp, ref, limit) of every parameter's gradient, the limit TOL_GRAD_REL max |ref| +
    TOL_GRAD_ABS; a gradient missing on the C++ side or of another shape: an infinite mismatch."""
    pairs = []
    for n in init:
        ref = grads[n].detach().numpy() if grads.get(n) is not None else np.zeros_like(init[n])
        got = cpp.get(n)
        ok = got is not None and got.shape == ref.shape
        pairs.append((n, got if ok else np.inf, ref if ok else 0.0,
                      TOL_GRAD_REL * float(np.abs(ref).max()) + TOL_GRAD_ABS))
    return pairs


def weight_bits(params):
    """The fp32 bit patterns of the weights (both sides use the same ones: no candidates)."""
    return set(np.concatenate([np.asarray(v, dtype=np.float32).reshape(-1).view(np.int32) for v in params.values()]).tolist())


def match_roundings(run, compare, exclude):
    """A bf16 forward/backward with the C++ side's roundings (module docstring, "Precision bf16").
    run(flips) -> (result, Roundings); compare(result) -> {name: err / limit} (names of parameters
    for their gradients, "logits" for the logits). First rounded to nearest; while some err / limit
    exceeds 1, candidates (Roundings.candidates) are tried taken the other way, one more at a time,
    up to MAX_FLIPS: first those that can have caused the mismatch (only the forward's when the
    logits differ; only roundings made before the first mismatching gradient was complete: where one
    rounding differs), then the others, ring by ring (FLIP_RADII), nearest to their midpoint first.
    The first candidate that lowers the score (sum of the squared ratios) to a half is taken, else
    the one that lowered it most. Returns (result, flips, [(value, distance)])."""
    flips, adopted = [], []
    res, rnd = first = run(flips)
    ratios = compare(res)
    start, tries = time.process_time(), 0
    while max(ratios.values()) > 1 and len(flips) < MAX_FLIPS:
        score = sum(r * r for r in ratios.values())
        found = rnd.candidates(exclude | set(flips), FLIP_RADII[-1])
        bad = [n for n, r in ratios.items() if r > 1]
        before = min([rnd.done[n] for n in bad if n in rnd.done] or [len(rnd.seen)])
        if "logits" in bad and rnd.backward is not None:
            before = min(before, rnd.backward)
        ring = lambda d: next(i for i, r in enumerate(FLIP_RADII) if d <= r)  # noqa: E731
        key = lambda b: (ring(found[b][0]), found[b][1] >= before, found[b][0])  # noqa: E731
        best = None
        for b in sorted(found, key=key):
            if tries >= MAX_TRIES or time.process_time() - start >= SEARCH_LEFT[0]:
                break
            r2, rnd2 = run(flips + [b])
            q2 = compare(r2)
            s2 = sum(r * r for r in q2.values())
            tries += 1
            if best is None or s2 < best[1]:
                best = (q2, s2, b, r2, rnd2)
            if s2 <= score / 2:  # it explains much of the mismatch (all of it when every ratio <= 1): take it
                break
        if best is None or best[1] >= score:
            break
        ratios, _, b, res, rnd = best
        flips.append(b)
        adopted.append((float(np.array([b], dtype=np.int32).view(np.float32)[0]), found[b][0]))
    spent = time.process_time() - start
    SEARCH_LEFT[0] -= spent
    if max(ratios.values()) > 1:  # not the C++ side's roundings: compared as rounded to nearest
        print(f"    no {MAX_FLIPS} roundings taken the other way explain the mismatch ({tries} tried, {spent:.1f} s"
              f"{'; no search time left' if SEARCH_LEFT[0] <= 0 else ''})")
        return first[0], [], []
    return res, flips, adopted


def report_roundings(where, adopted):
    if adopted:
        print(f"    {where}: {len(adopted)} bf16 rounding(s) taken the other way, as the C++ side took them: "
              + ", ".join(f"{v:.8g} ({d:.1f} units from its midpoint)" for v, d in adopted))


def check_case(path, case):
    rep = Report(case)
    with h5py.File(path, "r") as f:
        cfg = Cfg(f["config"].attrs)
        init = {n: f["params"][n][()] for n in f["params"]}
        no_wd = {n for n in f["params"] if int(f["params"][n].attrs["no_weight_decay"])}
        inputs, targets, mask, segment = (f["batch"][k][()] for k in ("inputs", "targets", "mask", "segment"))
        enc_batch = [f["batch"][k][()] for k in ("enc_inputs", "enc_segment")] if cfg.arch == "encdec" else []
        c = f["ctx"].attrs
        ctx = Ctx(c["seed"], c["step"], c["token_offset"])
        out = dict(f["out"].attrs)
        cpp_logits = f["out/logits"][()]
        cpp_grads = {n: f["grads"][n][()] for n in f["grads"]}
        cpp_routing = {int(b[len("block"):]): (f["routing"][b]["expert"][()], f["routing"][b]["slot"][()])
                       for b in (f["routing"] if "routing" in f else [])}
        given_bias = {int(b[len("block"):]): f["bias"][b][()] for b in (f["bias"] if "bias" in f else [])}
        batches = [f["train/batches"][k][()] for k in ("inputs", "targets", "mask", "segment")]
        if cfg.arch == "encdec":
            batches += [f["train/batches"][k][()] for k in ("enc_inputs", "enc_segment")]
        curves = {o: {k: f["train"][o][k][()] for k in ("loss", "grad_norm", "lr")} for o in ("adamw", "adafactor")}
        peaks = {o: (float(f["train"][o].attrs["lr_peak"]), f["train"][o].attrs["schedule"]) for o in curves}
        # bf16: the C++ weights at the start of every step (see the curves below)
        forced = {o: [{n: g[f"params_{t}"][n][()] for n in g[f"params_{t}"]} for t in range(1, len(curves[o]["loss"]) + 1)]
                  for o in curves if "params_1" in (g := f["train"][o])}
        # bf16: the logits and gradients (before clipping) of every step, compared as the single pass's
        step_out = {o: [(g[f"logits_{t}"][()], {n: g[f"grads_{t}"][n][()] for n in g[f"grads_{t}"]})
                        for t in range(1, len(curves[o]["loss"]) + 1)] for o in forced if "logits_1" in (g := f["train"][o])}
    moe_desc = (f"moe every {cfg.moe_every}: E={cfg.num_experts} router={cfg.router} k={cfg.k()} C={cfg.capacity()} "
                f"second={cfg.second_expert} expert_dropout={cfg.expert_dropout} jitter={cfg.jitter_eps} "
                f"ntlb={cfg.no_token_left_behind} shared={getattr(cfg, 'shared_experts', 0)}" if cfg.moe_every > 0 else "dense")
    print(f"{case}: arch={cfg.arch} layers={cfg.num_layers} act={cfg.activation} tied={cfg.tied_embeddings} dropout={cfg.dropout} "
          f"{moe_desc}")

    # --- one forward/backward
    precision = getattr(cfg, "precision", "fp32")
    bf16 = precision == "bf16"
    w_ce, w_aux, w_z = loss_weights(cfg, mask)
    moe_blocks = [i for i in range(cfg.blocks()) if cfg.is_moe(i)]

    def routing_mismatches(routing):
        """Choices whose expert or slot differs from the C++ side's (C++ marks declined choices -2 and
        dropped -1; slot -1 for both)."""
        bad = int(sorted(cpp_routing) != moe_blocks)
        for b, (e, s) in zip(moe_blocks, routing):
            ce_, cs_ = cpp_routing.get(b, (None, None))
            if ce_ is None or ce_.shape != e.reshape(-1).shape:
                bad += 1
                continue
            bad += int(np.sum(ce_ != e.reshape(-1)) + np.sum(cs_ != s.reshape(-1)))
        return bad

    def single_pass(flips):
        global ROUNDINGS
        P = {n: torch.tensor(v, requires_grad=True) for n, v in init.items()}
        watch(P)
        ROUNDINGS = rnd = Roundings(flips) if bf16 else None
        try:
            logits, ce, aux, z, routing = forward(P, cfg, inputs, targets, mask, segment, ctx, *enc_batch,
                                                  bias=given_bias or None)
            loss = ce.double() * w_ce + aux * w_aux + z * w_z
            loss.backward()
        finally:
            ROUNDINGS = None
        return (P, logits, ce, aux, z, routing, loss), rnd

    def compare_single(res):  # the comparisons below, {name: err / limit}, for the search
        P, logits, ce, aux, z, routing, loss = res
        ref = logits.detach().numpy()
        pairs = [("logits", cpp_logits, ref, TOL_LOGITS * float(np.abs(ref).max()))]
        pairs += [(k, float(out[k]), v.item(), TOL_SCALAR * abs(v.item()) + 1e-12)
                  for k, v in (("ce_sum", ce), ("aux_sum", aux), ("z_sum", z), ("loss", loss))]
        ratios = mismatch(pairs + grad_pairs(cpp_grads, {n: p.grad for n, p in P.items()}, init))
        ratios["routing"] = 1e3 * routing_mismatches(routing)  # exact: any other choice fails
        return ratios

    if bf16:
        res, _, adopted = match_roundings(single_pass, compare_single, weight_bits(init))
        report_roundings("one forward/backward", adopted)
    else:
        res = single_pass(())[0]
    P, logits, ce, aux, z, routing, loss = res
    if given_bias:  # the biases must change some choice, else the case tests nothing of them
        with torch.no_grad():
            unbiased = forward(P, cfg, inputs, targets, mask, segment, ctx, *enc_batch)[4]
        changed = sum(int(np.sum(a[0] != b[0])) for a, b in zip(routing, unbiased))
        rep.check("selection bias changes some choice", 0 if changed else 1, 0, f" ({changed} choices changed)")
    if getattr(cfg, "declined_takes_slot", 0):  # the empty slots must cost some choice its place
        with torch.no_grad():
            compact = Cfg(vars(cfg) | {"declined_takes_slot": 0})
            plain = forward(P, compact, inputs, targets, mask, segment, ctx, *enc_batch)[4]
        changed = sum(int(np.sum(a[0] != b[0])) for a, b in zip(routing, plain))
        rep.check("line 22 changes some choice", 0 if changed else 1, 0, f" ({changed} choices changed)")

    bad, ec_zero, ec_several = routing_mismatches(routing), 0, 0
    for b, (e, s) in zip(moe_blocks, routing):
        nd, nr = int(np.sum(e == -1)), int(np.sum(e == -2))
        if cfg.router == "expert_choice":  # a token gets 0..E experts
            got = np.sum(e >= 0, axis=1)
            ec_zero, ec_several = ec_zero + int(np.sum(got == 0)), ec_several + int(np.sum(got >= 2))
            print(f"    block {b}: tokens with 0, 1, 2, >=3 experts: {[int(np.sum(got == j)) for j in (0, 1, 2)]}"
                  f" {int(np.sum(got >= 3))}")
        else:
            print(f"    block {b}: {nd} dropped, {nr} declined of {e.size} choices")
    rep.check("routing decisions (mismatches)", bad, 0)
    if cfg.router == "expert_choice":  # the case must show both ends
        rep.check("tokens with 0 and with >= 2 experts", 0 if ec_zero and ec_several else 1, 0,
                  f" ({ec_zero} and {ec_several})")

    ref_logits = logits.detach().numpy()
    logits_err = np.abs(cpp_logits - ref_logits).max() / np.abs(ref_logits).max()
    rep.check("logits max-rel", logits_err, TOL_LOGITS)
    for name, ref in (("ce_sum", ce.item()), ("aux_sum", aux.item()), ("z_sum", z.item()), ("loss", loss.item())):
        err = abs(float(out[name]) - ref)
        rep.check(f"{name} ({ref:.6g})", err, TOL_SCALAR * abs(ref) + 1e-12)
    rep.check("mask_sum", abs(float(out["mask_sum"]) - float(mask.sum())), 0)
    for name, ref in (("w_ce", w_ce), ("w_aux", w_aux), ("w_z", w_z)):
        rep.check(name, abs(float(out[name]) - ref), 1e-15 * abs(ref))

    if set(cpp_grads) != set(P):
        rep.check("gradient names match", 1, 0, f" cpp-only {set(cpp_grads) - set(P)} ref-only {set(P) - set(cpp_grads)}")
    worst, worst_name = -1.0, ""
    for n, p in P.items():
        ref = p.grad.numpy() if p.grad is not None else np.zeros_like(init[n])
        got = cpp_grads.get(n)
        if got is None or got.shape != ref.shape:
            rep.check(f"grad {n} shape", 1, 0)
            continue
        err = float(np.abs(got - ref).max())
        lim = TOL_GRAD_REL * float(np.abs(ref).max()) + TOL_GRAD_ABS
        ratio = err / lim
        if ratio > worst:
            worst, worst_name = ratio, n
        if err > lim:
            rep.check(f"grad {n}", err, lim)
    rep.check(f"grads: worst err/limit ({worst_name})", worst, 1.0)
    if precision == "bf16":
        # The test must tell bf16 from fp32: the fp32 model is far further from the C++ bf16 logits
        # and gradients than the bf16 reference is.
        P32 = {n: torch.tensor(v, requires_grad=True) for n, v in init.items()}
        lg32, ce32, aux32, z32, _ = forward(P32, Cfg(vars(cfg) | {"precision": "fp32"}), inputs, targets, mask, segment,
                                            ctx, *enc_batch, bias=given_bias or None)
        (ce32.double() * w_ce + aux32 * w_aux + z32 * w_z).backward()
        fp32_err = np.abs(cpp_logits - lg32.detach().numpy()).max() / np.abs(ref_logits).max()
        rep.check("fp32 model: logits max-rel >= 10x", 10 * logits_err, fp32_err, f" (fp32 model {fp32_err:.3e})")
        g_bf16 = max(float(np.abs(cpp_grads[n] - P[n].grad.numpy()).max()) for n in P if P[n].grad is not None)
        g_fp32 = max(float(np.abs(cpp_grads[n] - P32[n].grad.numpy()).max()) for n in P32 if P32[n].grad is not None)
        rep.check("fp32 model: grads max-abs >= 10x", 10 * g_bf16, g_fp32, f" (fp32 model {g_fp32:.3e})")

    # --- 10 AdamW and 10 Adafactor steps from the same init, as the trainer
    c = dict(lr=0.0, warmup_steps=int(cfg.warmup_steps), run_steps=int(cfg.run_steps),
             min_lr_ratio=float(cfg.min_lr_ratio), schedule="")
    steps = batches[0].shape[0]
    for o in ("adamw", "adafactor"):
        c["lr"], c["schedule"] = peaks[o][0], peaks[o][1].decode() if isinstance(peaks[o][1], bytes) else peaks[o][1]
        P = {n: torch.tensor(v, requires_grad=True) for n, v in init.items()}
        watch(P)
        plist = list(P.values())
        if o == "adamw":
            opt = torch.optim.AdamW(
                [{"params": [P[n] for n in P if n not in no_wd], "weight_decay": cfg.weight_decay},
                 {"params": [P[n] for n in P if n in no_wd], "weight_decay": 0.0}],
                lr=c["lr"], betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
        else:
            # optim_reference.PaperAdafactor forms R C / sum(R) in the parameter's dtype; in fp32 that
            # underflows to 0/0 when a whole expert slice has zero gradient (an expert that got no
            # token this step). So it runs on float64 shadows of the fp32 parameters, with float64 state
            # (update in double as the C++ computes it; parameters rounded back to fp32 every step).
            shadow = [p.detach().double() for p in plist]
            opt = PaperAdafactor(shadow, cfg.adafactor_decay, cfg.adafactor_eps, cfg.adafactor_clip)
        losses, norms, lrs = [], [], []
        use_bias = getattr(cfg, "balance", "aux_loss") == "bias"
        bias = {i: np.zeros(cfg.num_experts, dtype=np.float32) for i in range(cfg.blocks()) if cfg.is_moe(i)}
        worst_logits = worst_grads = 0.0
        for t in range(1, steps + 1):
            bi, bt, bm, bs, *benc = (a[t - 1] for a in batches)
            w_ce, w_aux, w_z = loss_weights(cfg, bm)

            def step_pass(flips):  # forward/backward of step t from P's weights, gradients left in P
                global ROUNDINGS
                for p in plist:
                    p.grad = None
                ROUNDINGS = rnd = Roundings(flips) if bf16 else None
                try:
                    lg, ce, aux, z, step_routing = forward(P, cfg, bi, bt, bm, bs, Ctx(cfg.seed, t, 0), *benc,
                                                           bias=bias if use_bias else None)
                    loss = ce.double() * w_ce + aux * w_aux + z * w_z
                    loss.backward()
                finally:
                    ROUNDINGS = None
                grads = {n: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for n, p in P.items()}
                norm = torch.norm(torch.stack([torch.norm(g, 2.0) for g in grads.values()]), 2.0).item()  # as clip_grad_norm_
                return (lg, loss, grads, norm, step_routing), rnd

            if o in forced:
                with torch.no_grad():
                    for n, p in P.items():
                        p.copy_(torch.from_numpy(forced[o][t - 1][n]))
            if o in step_out:
                cpp_lg, cpp_g = step_out[o][t - 1]

                def compare_step(res):
                    lg, loss, grads, norm, _ = res
                    ref = lg.detach().numpy()
                    return mismatch([("logits", cpp_lg, ref, TOL_LOGITS * float(np.abs(ref).max())),
                                     ("loss", curves[o]["loss"][t - 1], loss.item(), TOL_CURVE * abs(loss.item())),
                                     ("grad_norm", curves[o]["grad_norm"][t - 1], norm, TOL_CURVE * norm)]
                                    + grad_pairs(cpp_g, grads, init))

                res, flips, adopted = match_roundings(step_pass, compare_step, weight_bits(forced[o][t - 1]))
                report_roundings(f"{o} step {t}", adopted)
                lg, loss, grads, norm, step_routing = step_pass(flips)[0]  # P's gradients: the pass matched
                ref = lg.detach().numpy()
                worst_logits = max(worst_logits, float(np.abs(cpp_lg - ref).max() / np.abs(ref).max()))
                worst_grads = max([worst_grads] + list(mismatch(grad_pairs(cpp_g, grads, init)).values()))
            else:
                lg, loss, grads, norm, step_routing = step_pass(())[0]
            if use_bias:  # Wang et al. 2024: b_e += u * sign(mean load - load_e), loads = dispatched choices
                for i, (e, _) in zip(sorted(bias), step_routing):
                    load = np.array([np.sum(e == j) for j in range(cfg.num_experts)], dtype=np.float64)
                    step = cfg.bias_update_rate * np.sign(load.mean() - load)
                    bias[i] = (bias[i].astype(np.float64) + step).astype(np.float32)
            for p in plist:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            losses.append(loss.item())
            norms.append(torch.nn.utils.clip_grad_norm_(plist, cfg.grad_clip).item())
            lr = schedule(t, c)
            lrs.append(lr)
            if o == "adamw":
                for group in opt.param_groups:
                    group["lr"] = lr
                opt.step()
            else:
                with torch.no_grad():
                    for p, q in zip(plist, shadow):
                        q.copy_(p.double())
                        q.grad = p.grad.double()
                    torch.set_default_dtype(torch.float64)  # PaperAdafactor creates its state with the default dtype
                    try:
                        opt.step(lr, t)
                    finally:
                        torch.set_default_dtype(torch.float32)
                    for p, q in zip(plist, shadow):
                        p.copy_(q.float())
        cur = curves[o]
        rel = lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)) / np.abs(np.asarray(b))))  # noqa: E731
        clipped = sum(1 for n in norms if cfg.grad_clip / (n + 1e-6) < 1)
        CLIP_COUNTS.append(clipped / steps)
        rep.check(f"{o} loss curve rel ({losses[0]:.4f}->{losses[-1]:.4f})", rel(cur["loss"], losses), TOL_CURVE)
        rep.check(f"{o} grad-norm curve rel ({clipped}/{steps} clipped)", rel(cur["grad_norm"], norms), TOL_CURVE)
        rep.check(f"{o} lr rel", rel(cur["lr"], lrs), TOL_LR)
        if o in step_out:
            rep.check(f"{o} logits max-rel, every step", worst_logits, TOL_LOGITS)
            rep.check(f"{o} grads: worst err/limit, every step", worst_grads, 1.0)
    return rep.failures


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.set_num_threads(1)
    failures = []
    for case in CASES:
        path = os.path.join(sys.argv[1], f"model_ref_{case}.h5")
        if not os.path.exists(path):
            failures.append(f"{case}: {path} missing (did the [model-torch] Catch case run?)")
            continue
        try:
            failures += check_case(path, case)
        except Exception as e:  # an unreadable file (C++ side crashed while writing) is a mismatch
            failures.append(f"{case}: {type(e).__name__}: {e}")
    # Both branches of global-norm clipping must be exercised somewhere, or the curves test less.
    if CLIP_COUNTS and (max(CLIP_COUNTS) == 0 or min(CLIP_COUNTS) == 1):
        failures.append(f"configurations do not exercise both branches of gradient clipping: {CLIP_COUNTS}")
    print()
    for f in failures:
        print("MISMATCH", f)
    print(f"model vs torch: {len(CASES)} cases, {len(failures)} mismatches")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
