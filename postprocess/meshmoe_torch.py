#!/usr/bin/env python3
"""meshmoe's model as a plain PyTorch module, built from a `meshmoe export` safetensors file.

    /usr/bin/python3 postprocess/meshmoe_torch.py model.safetensors --data data.h5   # prints the validation loss

In Python:

    from meshmoe_torch import load
    model = load("model.safetensors")          # MeshmoeModel (torch.nn.Module), eval mode
    logits = model(inputs, segment, position)  # [B, T] int64 each -> [B * T, V]

The file (docs/export.md) is read with the standard library (struct, json) and torch.frombuffer,
so no safetensors package is needed; the model is rebuilt from the effective deck in its
metadata. It computes what meshmoe's evaluation computes (docs/ARCHITECTURE.md "One training
step", with ctx.training false): pre-LN blocks x += attn(ln1(x)); [encdec decoder: x +=
cross(ln_cross(x), enc)]; x += ffn(ln2(x)); final LN; head x W^T (W the token embedding when
tied); attention within each packed example (causal for the decoder); learned positions that
restart with each example. An MoE block routes as meshmoe's evaluation does: router logits in
fp32, softmax in double, top-k by probability (plus the selection bias with moe.balance = bias),
ties to the lower expert; capacity C = ceil(k S f / E) per routing group of S consecutive tokens
of the batch with f = moe.capacity_factor_eval (S with moe.dropless), choices placed first choices
first, in token order; top-1 and expert-choice gates are the probabilities (Switch eq. 2), top-2
and top-k gates are renormalised over the k; No-Token-Left-Behind and the threshold second expert
as in training; no jitter, no random second expert, no dropout (GShard Algorithm 1; Switch
sections 2.1-2.2, appendix B).

`--data` scores the validation split as `meshmoe eval` does: the deck's eval.examples_per_language
sample (or eval.batches seeded batches of the whole split), packed by the same rules into
optim.batch_size rows of model.seq_len tokens (EvalBatches), so the routing groups, the
capacity drops and hence the loss are meshmoe's (to float rounding: within 1e-5 relative,
tests/scripts/export_torch.sh).
"""
import argparse
import base64
import json
import math
import struct
import sys
import tomllib

import numpy as np
import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# The file


def read_safetensors(path):
    """({name: float32 tensor}, {metadata key: string}) of a safetensors file (its published layout:
    8-byte little-endian header size N, N bytes of JSON, the byte buffer)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        buffer = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {name} is {info['dtype']}, meshmoe exports F32")
        begin, end = info["data_offsets"]
        shape = info["shape"]
        if end > begin:
            t = torch.frombuffer(bytearray(buffer[begin:end]), dtype=torch.float32)
        else:
            t = torch.zeros(0, dtype=torch.float32)
        tensors[name] = t.reshape(shape)
    return tensors, meta


class Config:
    """The deck's sections as attributes: cfg.model.d_model, cfg.moe.router, ..."""

    def __init__(self, deck_text):
        deck = tomllib.loads(deck_text)
        for section, keys in deck.items():
            setattr(self, section, type(section, (), dict(keys)))

    def k(self):
        return {"top1": 1, "top2": 2, "expert_choice": self.moe.num_experts}.get(self.moe.router, self.moe.top_k)

    def is_moe(self, j):
        """Block j of its stack (the encoder's and the decoder's counted alike)."""
        return self.moe.every > 0 and (j + 1) % self.moe.every == 0

    def capacity(self):
        """C = ceil(k S f / E) with f = capacity_factor_eval, in [1, S]; dropless: S."""
        S = self.moe.group_size
        if self.moe.dropless:
            return S
        per_token = 1 if self.moe.router == "expert_choice" else self.k()
        v = per_token * S * self.moe.capacity_factor_eval / self.moe.num_experts
        r = round(v)
        c = r if abs(v - r) <= 1e-9 * max(1.0, v) else math.ceil(v)
        return int(min(max(c, 1), S))


# ---------------------------------------------------------------------------------------------
# The model


def activation(name, pre, H):
    if name == "relu":
        return torch.relu(pre)
    if name == "gelu":
        return F.gelu(pre)  # the erf form, as meshmoe's
    return F.gelu(pre[..., :H]) * pre[..., H:]  # geglu: gelu(first H) * the linear gate (last H)


class MeshmoeModel(torch.nn.Module):
    """meshmoe's Transformer (decoder or encoder-decoder) with its parameters under meshmoe's names
    (self.p(name)); forward() is the evaluation forward."""

    def __init__(self, cfg, tensors):
        super().__init__()
        self.cfg = cfg
        self.names = list(tensors)
        self.weights = torch.nn.ParameterDict({n.replace(".", "__").replace("/", "___"): torch.nn.Parameter(t, requires_grad=False)
                                               for n, t in tensors.items()})
        self.eval()

    def p(self, name):
        return self.weights[name.replace(".", "__").replace("/", "___")]

    def has(self, name):
        return name.replace(".", "__").replace("/", "___") in self.weights

    def ln(self, x, pre):
        return F.layer_norm(x, (x.shape[-1],), self.p(pre + ".gain"), self.p(pre + ".bias"), self.cfg.model.layernorm_eps)

    def attention(self, x, pre, B, T, segment, causal, kv=None, kv_segment=None):
        """Heads of width D = M / heads, no biases; a query sees the keys of its own example (and
        only earlier ones when causal); a query with no key gets zeros. Grouped-query attention
        (model.kv_heads, self-attention): k and v have kv_heads heads, each repeated for its
        heads / kv_heads query heads (the Hugging Face Llama/Mixtral repeat_kv)."""
        M, heads = self.cfg.model.d_model, self.cfg.model.num_heads
        D = M // heads
        kv_heads = heads
        if kv is None:
            kv, kv_segment = x, segment
            kv_heads = getattr(self.cfg.model, "kv_heads", 0) or heads
        Tk = kv_segment.shape[1]
        q = (x @ self.p(pre + ".wq")).view(B, T, heads, D).transpose(1, 2)
        k = (kv @ self.p(pre + ".wk")).view(B, Tk, kv_heads, D).transpose(1, 2)
        v = (kv @ self.p(pre + ".wv")).view(B, Tk, kv_heads, D).transpose(1, 2)
        k = k.repeat_interleave(heads // kv_heads, dim=1)  # query head h reads key/value head h // group
        v = v.repeat_interleave(heads // kv_heads, dim=1)
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D))
        seen = segment[:, :, None] == kv_segment[:, None, :]
        if causal:
            seen = seen & torch.ones(T, Tk, dtype=torch.bool).tril()
        prob = torch.softmax(s.masked_fill(~seen[:, None], float("-inf")), dim=-1)
        prob = torch.where(seen[:, None].any(-1, keepdim=True), prob, torch.zeros_like(prob))
        return (prob @ v).transpose(1, 2).reshape(B * T, M) @ self.p(pre + ".wo")

    def ffn(self, x, w_in, w_out, H):
        return activation(self.cfg.model.activation, x @ w_in.reshape(x.shape[-1], -1), H) @ w_out

    def route(self, probs, bias):
        """Expert and slot of each of the k choices of every token (-1: dropped or declined), and the gates."""
        cfg = self.cfg
        N, E = probs.shape
        k, S, C = cfg.k(), cfg.moe.group_size, cfg.capacity()
        expert = np.full((N, k), -1, dtype=np.int64)
        slot = np.full((N, k), -1, dtype=np.int64)
        if cfg.moe.router == "expert_choice":  # Zhou et al. 3.1: expert e takes its top-C tokens of the group
            for g in range(N // S):
                order = torch.sort(probs[g * S:(g + 1) * S].t(), dim=1, descending=True, stable=True).indices[:, :C]
                for e in range(E):
                    for j, s in enumerate(order[e].tolist()):
                        expert[g * S + s, e], slot[g * S + s, e] = e, j
            return expert, slot, probs
        p = probs.numpy()
        score = p if bias is None else p.astype(np.float64) + bias.numpy().astype(np.float64)[None, :]
        order = np.argsort(-score, axis=1, kind="stable")
        top = order[:, :k]
        want = np.ones((N, k), dtype=bool)
        if cfg.moe.router == "top2" and cfg.moe.second_expert == "threshold":
            Z = p[np.arange(N), top[:, 0]].astype(np.float64) + p[np.arange(N), top[:, 1]]
            want[:, 1] = p[np.arange(N), top[:, 1]].astype(np.float64) / Z > cfg.moe.second_expert_threshold
        literal = cfg.moe.declined_takes_slot
        for g in range(N // S):
            count = np.zeros(E, dtype=np.int64)
            dropped = []
            for i in range(k):  # every first choice of the group, then every second, ...
                for n in range(g * S, (g + 1) * S):
                    e = top[n, i]
                    if not want[n, i]:
                        count[e] += 1 if literal else 0
                        continue
                    if count[e] < C:
                        expert[n, i], slot[n, i] = e, count[e]
                        count[e] += 1
                    else:
                        dropped.append((n, i))
            if cfg.moe.no_token_left_behind:  # Switch appendix B: the best expert with room outside the top-k
                for n, i in dropped:
                    for e in order[n, k:]:
                        if e in expert[n] or count[e] >= C:
                            continue
                        expert[n, i], slot[n, i] = e, count[e]
                        count[e] += 1
                        break
        if cfg.moe.router == "top1":
            gates = probs
        else:
            mask = torch.zeros(N, E, dtype=torch.float64)
            mask[torch.arange(N).unsqueeze(1), torch.from_numpy(top)] = 1
            gates = (probs.double() / (probs.double() * mask).sum(-1, keepdim=True)).float()
        return expert, slot, gates

    def moe(self, x, pre):
        cfg = self.cfg
        N, M = x.shape
        E, H = cfg.moe.num_experts, cfg.moe.expert_d_ff or cfg.model.d_ff
        logits = (x @ self.p(pre + ".router.wg")).double()
        probs = torch.softmax(logits, dim=-1).float()
        bias_name = pre + ".router/selection_bias"
        expert, slot, gates = self.route(probs, self.p(bias_name) if self.has(bias_name) else None)
        w_in, w_out = self.p(pre + ".experts.w_in"), self.p(pre + ".experts.w_out")
        y = torch.zeros_like(x)
        for e in range(E):
            rows, choice = np.nonzero(expert == e)
            if rows.size == 0:
                continue
            t = torch.from_numpy(rows)
            out = self.ffn(x[t], w_in[e], w_out[e], H)
            y.index_add_(0, t, gates[t, e].unsqueeze(1) * out)
        n = getattr(cfg.moe, "shared_experts", 0)
        if n > 0:  # n shared experts as one feed-forward of width n H (DeepSeekMoE eq. 3)
            y = y + self.ffn(x, self.p(pre + ".shared.w_in"), self.p(pre + ".shared.w_out"), n * H)
        return y

    def block(self, x, i, j, B, T, seg, causal, enc=None, enc_seg=None):
        b = f"blocks.{i}"
        x = x + self.attention(self.ln(x, b + ".ln1"), b + ".attn", B, T, seg, causal)
        if enc is not None:
            x = x + self.attention(self.ln(x, b + ".ln_cross"), b + ".cross", B, T, seg, False, enc, enc_seg)
        h = self.ln(x, b + ".ln2")
        if self.cfg.is_moe(j):
            return x + self.moe(h, b + ".moe")
        return x + self.ffn(h, self.p(b + ".mlp.w_in"), self.p(b + ".mlp.w_out"), self.cfg.model.d_ff)

    def embed(self, tokens, position):
        return self.p("embed.wte")[tokens.reshape(-1)] + self.p("embed.wpe")[position.reshape(-1)]

    @torch.no_grad()
    def forward(self, inputs, segment, position, enc_inputs=None, enc_segment=None, enc_position=None):
        """inputs, segment, position [B, T] (int64): the decoder's tokens, their example within the
        row and position within it; encdec: the encoder's too. Returns the logits [B * T, V]."""
        cfg = self.cfg
        B, T = inputs.shape
        L = cfg.model.num_layers
        encdec = cfg.model.arch == "encdec"
        enc = None
        if encdec:
            e = self.embed(enc_inputs, enc_position)
            for i in range(L):
                e = self.block(e, i, i, B, T, enc_segment, False)
            enc = self.ln(e, "ln_enc")
        x = self.embed(inputs, position)
        first = L if encdec else 0
        for i in range(first, first + L):
            x = self.block(x, i, i - first, B, T, segment, True, enc, enc_segment)
        W = self.p("embed.wte") if cfg.model.tied_embeddings else self.p("head.wout")
        return self.ln(x, "ln_f") @ W.t()


# Deck choices this module computes, and the values it computes them for: a model trained with
# another (the gates and blocks of docs/user-guide.md "Routing options" and docs/ARCHITECTURE.md
# "Blocks") is refused rather than given a loss that is not meshmoe's.
WRITTEN_FOR = {("model", "norm"): "layernorm", ("model", "position"): "learned", ("moe", "gate"): "softmax",
               ("moe", "routed_scale"): 1.0, ("moe", "first_dense"): 0}
ACTIVATIONS = ("relu", "gelu", "geglu")


def check_written(cfg, path):
    for (section, key), value in WRITTEN_FOR.items():
        got = getattr(getattr(cfg, section, None), key, value)
        if got != value:
            raise ValueError(f"{path}: {section}.{key} = {got!r}: this module computes {section}.{key} = "
                             f"{value!r} only")
    if cfg.model.activation not in ACTIVATIONS:
        raise ValueError(f"{path}: model.activation = {cfg.model.activation!r}: this module computes "
                         f"{', '.join(ACTIVATIONS)} only")


def load(path):
    """The model of a `meshmoe export` file, and its metadata (deck, tokenizer: docs/export.md)."""
    tensors, meta = read_safetensors(path)
    if meta.get("layout") == "hf":
        raise ValueError(f"{path}: an export of --layout hf (Hugging Face Mixtral names): load it with transformers' "
                         "MixtralForCausalLM; this module reads meshmoe's layout (export without --layout)")
    if meta.get("format") != "meshmoe":
        raise ValueError(f"{path}: not a meshmoe export (metadata format = {meta.get('format')!r})")
    cfg = Config(meta["deck"])
    check_written(cfg, path)
    model = MeshmoeModel(cfg, tensors)
    model.metadata = meta
    return model


def spm_model(meta):
    """The SentencePiece model's bytes (sentencepiece.SentencePieceProcessor(model_proto=...)), or b''
    for the byte tokenizer (ids 0-255 bytes, 256 PAD, 257 BOS, 258 EOS, 259 SEP, 260 + i the tag of
    language i of json.loads(meta['languages']))."""
    return base64.b64decode(meta.get("spm_model_base64", ""))


# ---------------------------------------------------------------------------------------------
# Evaluation batches: meshmoe's Batcher (src/data/batcher.hpp) at temperature 1, and the sample of
# eval.examples_per_language (src/data/dataset.cpp, per_language_sample)

MASK64 = (1 << 64) - 1


def mix64(x):
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox 4x32-10 (Salmon et al. 2011) over numpy uint64 arrays holding 32-bit values."""
    M0, M1, m32 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57), np.uint64(0xFFFFFFFF)
    c = [np.asarray(v, dtype=np.uint64) & m32 for v in (c0, c1, c2, c3)]
    for _ in range(10):
        p0, p1 = M0 * c[0], M1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & m32, (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & m32]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c


DATA_SHUFFLE = 6  # RngPurpose::DataShuffle


class Split:
    def __init__(self, tokens, offsets, lang, loss_mask):
        self.tokens, self.offsets, self.lang, self.loss_mask = tokens, offsets, lang, loss_mask

    def example(self, e):
        b, n = int(self.offsets[e]), int(self.offsets[e + 1])
        return self.tokens[b:n], self.loss_mask[b:n]

    def size(self):
        return len(self.lang)


def read_valid(path):
    import h5py

    with h5py.File(path, "r") as f:
        s = Split(f["valid/tokens"][...].astype(np.int64), f["valid/doc_offsets"][...], f["valid/lang"][...].astype(np.int64),
                  f["valid/loss_mask"][...].astype(np.uint8))
        languages = len(f["languages/name"])
        info = {k: int(f.attrs[k]) for k in ("bos_id", "sep_id", "pad_id")}
    return s, languages, info


def per_language_sample(s, languages, per_language):
    groups = [[] for _ in range(languages + 1)]
    for e in range(s.size()):
        lang = int(s.lang[e])
        groups[lang if 0 <= lang < languages else languages].append(e)
    out = []
    for g, members in enumerate(groups):
        if 0 < per_language < len(members):
            keyed = sorted((mix64((g << 32) | j), j) for j in range(len(members)))[:per_language]
            members = [members[j] for _, j in keyed]
        out.extend(members)
    out.sort()
    tokens, mask, offsets = [], [], [0]
    for e in out:
        t, m = s.example(e)
        tokens.append(t), mask.append(m), offsets.append(offsets[-1] + len(t))
    cat = lambda parts, dt: np.concatenate(parts) if parts else np.zeros(0, dtype=dt)  # noqa: E731
    return Split(cat(tokens, np.int64), np.array(offsets), s.lang[out], cat(mask, np.uint8))


class EvalBatches:
    """The batches of meshmoe's evaluation: rows of T + 1 tokens (encdec: T on each side) packed
    with whole examples in the epoch's order, a row's PAD tail one more segment."""

    def __init__(self, split, cfg, info, shuffle):
        self.s, self.cfg, self.info, self.shuffle = split, cfg, info, shuffle
        self.T, self.seed = cfg.model.seq_len, cfg.run.seed
        self.set_epoch(0)

    def set_epoch(self, epoch):
        self.epoch, self.position = epoch, 0
        n = self.s.size()
        if not self.shuffle:
            self.order = list(range(n))
            return
        i = np.arange(n, dtype=np.uint64)
        b = philox4x32_10(i & np.uint64(0xFFFFFFFF), i >> np.uint64(32), np.uint64(epoch), np.uint64(DATA_SHUFFLE),
                          self.seed & 0xFFFFFFFF, self.seed >> 32)
        key = (b[0] << np.uint64(32)) | b[1]
        self.order = sorted(range(n), key=lambda e: (int(key[e]), e))

    def at_cursor(self):
        if self.position == len(self.order):
            self.set_epoch(self.epoch + 1)
        return self.order[self.position]

    def fit(self, e):
        """(kept token indices of example e) or None when dropped (src/data/batcher.cpp, fit_example)."""
        t, m = self.s.example(e)
        n, cap = len(t), self.T + 1
        if n <= cap:
            return list(range(n))
        first = 1
        while first < n and m[first] == 0:
            first += 1
        if first == n:
            return list(range(cap))
        tail = n - (first - 1)
        if first == 1 or tail + 1 > cap:
            return None
        head = cap - tail
        return list(range(head)) + list(range(n - tail, n))

    def decoder_row(self):
        cap = self.T + 1
        tok, msk, seg, pos = [self.info["pad_id"]] * cap, [0] * cap, [0] * cap, [0] * cap
        fill, segment = 0, 0
        while fill < cap:
            e = self.at_cursor()
            kept = self.fit(e)
            if kept is None:
                self.position += 1
                continue
            if fill > 0 and fill + len(kept) > cap:
                break
            t, m = self.s.example(e)
            for j, src in enumerate(kept):
                tok[fill + j], msk[fill + j], seg[fill + j], pos[fill + j] = int(t[src]), int(m[src]), segment, j
            fill += len(kept)
            segment += 1
            self.position += 1
        for j in range(fill, cap):
            seg[j], pos[j] = segment, j - fill
        T = self.T
        mask = [float(msk[j + 1]) if seg[j + 1] == seg[j] else 0.0 for j in range(T)]
        return dict(inputs=tok[:T], targets=tok[1:], mask=mask, segment=seg[:T], position=pos[:T])

    def encdec_row(self):
        T, sep_id, bos = self.T, self.info["sep_id"], self.info["bos_id"]
        pad = self.info["pad_id"]
        r = dict(enc_inputs=[pad] * T, enc_segment=[0] * T, enc_position=[0] * T, inputs=[pad] * T, targets=[pad] * T,
                 mask=[0.0] * T, segment=[0] * T, position=[0] * T)
        ef, df, segment = 0, 0, 0
        while ef < T and df < T:
            e = self.at_cursor()
            t, m = self.s.example(e)
            n = len(t)
            sep = next((i for i in range(n) if t[i] == sep_id), n)
            target = n - min(n, sep + 1)
            if sep == n or sep == 0 or target == 0 or target > T:
                self.position += 1
                continue
            source = min(sep, T)
            if segment > 0 and (ef + source > T or df + target > T):
                break
            for j in range(source):
                r["enc_inputs"][ef + j], r["enc_segment"][ef + j], r["enc_position"][ef + j] = int(t[j]), segment, j
            for j in range(target):
                r["inputs"][df + j] = bos if j == 0 else int(t[sep + j])
                r["targets"][df + j], r["mask"][df + j] = int(t[sep + 1 + j]), float(m[sep + 1 + j])
                r["segment"][df + j], r["position"][df + j] = segment, j
            ef, df, segment = ef + source, df + target, segment + 1
            self.position += 1
        for j in range(ef, T):
            r["enc_segment"][j], r["enc_position"][j] = segment, j - ef
        for j in range(df, T):
            r["segment"][j], r["position"][j] = segment, j - df
        return r

    def next(self, B):
        rows = [self.encdec_row() if self.cfg.model.arch == "encdec" else self.decoder_row() for _ in range(B)]
        return {k: torch.tensor([r[k] for r in rows], dtype=torch.float32 if k == "mask" else torch.int64) for k in rows[0]}


def validation_loss(model, data_path):
    """(loss, target tokens): meshmoe's validation loss of the model on the dataset's valid split."""
    cfg = model.cfg
    split, languages, info = read_valid(data_path)
    whole = cfg.eval.examples_per_language > 0
    if whole:
        split = per_language_sample(split, languages, cfg.eval.examples_per_language)
    batches = EvalBatches(split, cfg, info, shuffle=not whole)
    loss_sum, tokens, b = 0.0, 0.0, 0
    while (batches.epoch == 0) if whole else (b < cfg.eval.batches):
        b += 1
        batch = batches.next(cfg.optim.batch_size)
        if not bool((batch["mask"] == 1).any()):
            continue
        enc = {k: batch[k] for k in ("enc_inputs", "enc_segment", "enc_position")} if "enc_inputs" in batch else {}
        logits = model(batch["inputs"], batch["segment"], batch["position"], **enc)
        nll = torch.logsumexp(logits, -1) - logits.gather(1, batch["targets"].reshape(-1, 1)).squeeze(1)
        m = batch["mask"].reshape(-1)
        loss_sum += float((m.double() * nll.double()).sum())
        tokens += float(m.sum())
    return loss_sum / tokens if tokens else float("nan"), tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a safetensors file written by `meshmoe export`")
    ap.add_argument("--data", required=True, help="the dataset (HDF5, `meshmoe prep`) whose valid split is scored")
    args = ap.parse_args()
    try:
        model = load(args.model)
    except ValueError as e:
        print(f"meshmoe_torch.py: {e}", file=sys.stderr)
        return 2
    loss, tokens = validation_loss(model, args.data)
    print(f"validation loss {loss:.9g} over {tokens:.0f} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
