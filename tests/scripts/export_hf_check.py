#!/usr/bin/env python3
"""Checks of `meshmoe export --layout hf` files (the Hugging Face Mixtral layout) for
tests/scripts/export_hf.sh.

  export_hf_check.py table FILE CONFIG      the tensors of FILE's header (names, shapes, dtypes) are
                                            docs/export.md's Mixtral table expanded for CONFIG
                                            (config.json), no more, no fewer; CONFIG's keys are the
                                            deck's model (FILE's metadata)
  export_hf_check.py loss FILE CONFIG DATA EVAL_H5
                                            a Mixtral forward written here from the Hugging Face
                                            modeling_mixtral.py equations, reading only FILE's tensors
                                            and CONFIG, gives `meshmoe eval`'s validation loss
                                            (EVAL_H5) within 1e-5 relative
Exit 1 with FAIL lines on a mismatch.
"""
import json
import os
import struct
import sys
import tomllib

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_check import check_loss, fail, meshmoe_torch, table_rows  # noqa: E402


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    return h.pop("__metadata__", {}), h


def expected(cfg):
    letters = {"V": cfg["vocab_size"], "M": cfg["hidden_size"], "heads": cfg["num_attention_heads"],
               "kv": cfg["num_key_value_heads"], "D": cfg["head_dim"], "E": cfg["num_local_experts"],
               "He": cfg["intermediate_size"]}
    out = {}
    for name, shape, present in table_rows("| Hugging Face name | shape |", 3):
        ok = {"always": True, "every layer": True, "every layer, each expert e": True,
              "`model.tied_embeddings = false`": not cfg["tie_word_embeddings"]}.get(present)
        if ok is None:
            fail(f"docs/export.md: unknown condition '{present}'")
        if not ok:
            continue
        dims = []
        for d in shape.strip("[]").split(","):
            v = 1
            for letter in d.split():
                v *= letters[letter]
            dims.append(v)
        layers = range(cfg["num_hidden_layers"]) if ".N." in name else [None]
        experts = range(cfg["num_local_experts"]) if ".e." in name else [None]
        for n in layers:
            for e in experts:
                out[name.replace(".N.", f".{n}.").replace(".e.", f".{e}.")] = dims
    return out


def cmd_table(path, config):
    meta, tensors = header(path)
    cfg = json.load(open(config))
    deck = tomllib.loads(meta["deck"])
    m, moe = deck["model"], deck["moe"]
    k = {"top1": 1, "top2": 2}.get(moe["router"], moe["top_k"])
    want_cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": m["d_model"],
                "intermediate_size": moe["expert_d_ff"] or m["d_ff"], "num_hidden_layers": m["num_layers"],
                "num_attention_heads": m["num_heads"], "num_key_value_heads": m.get("kv_heads") or m["num_heads"],
                "head_dim": m["d_model"] // m["num_heads"], "num_local_experts": moe["num_experts"],
                "num_experts_per_tok": k, "hidden_act": "silu", "rms_norm_eps": m["layernorm_eps"],
                "rope_theta": m["rope_base"], "vocab_size": m["vocab_size"] or int(meta["vocab_size"]),
                "max_position_embeddings": m["seq_len"], "tie_word_embeddings": m["tied_embeddings"],
                "bos_token_id": int(meta["bos_id"]), "eos_token_id": int(meta["eos_id"]),
                "pad_token_id": int(meta["pad_id"])}
    bad = [f"config.json {key} = {cfg.get(key)!r}, the deck's model makes it {v!r}"
           for key, v in want_cfg.items() if cfg.get(key) != v]
    if meta.get("format") != "pt":
        bad.append(f"metadata format = {meta.get('format')!r}, Hugging Face's loader needs 'pt'")
    want = expected(cfg)
    for name in sorted(set(want) | set(tensors)):
        if name not in tensors:
            bad.append(f"{name}: in docs/export.md's Mixtral table, not in the file")
        elif name not in want:
            bad.append(f"{name}: in the file, not in docs/export.md's Mixtral table")
        elif tensors[name]["shape"] != want[name] or tensors[name]["dtype"] != "F32":
            bad.append(f"{name}: {tensors[name]['dtype']} {tensors[name]['shape']} in the file, F32 {want[name]} by the table")
    for b in bad:
        print("FAIL: " + b)
    if bad:
        sys.exit(1)
    print(f"ok   {len(tensors)} tensors of {os.path.basename(path)}: names, shapes and dtypes as docs/export.md's "
          f"Mixtral table; config.json as the deck")


class Mixtral(torch.nn.Module):
    """MixtralForCausalLM's forward (Hugging Face modeling_mixtral.py) from config.json and the
    file's tensors alone, with the packing of meshmoe's batches: attention within each example
    (causal), rotary positions restarting with each example (position_ids)."""

    def __init__(self, cfg, tensors, deck_cfg):
        super().__init__()
        self.c, self.w, self.cfg = cfg, tensors, deck_cfg  # self.cfg: the batches' sizes (validation_loss)

    def rms(self, x, name):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.w[name] * (x * torch.rsqrt(var + self.c["rms_norm_eps"]))

    def rotate(self, x, position):
        """x [B, heads, T, D]: q * cos + rotate_half(q) * sin (MixtralRotaryEmbedding, fp32)."""
        D = x.shape[-1]
        inv_freq = 1.0 / (self.c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
        freqs = position.float().unsqueeze(-1) * inv_freq  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
        half = torch.cat((-x[..., D // 2:], x[..., : D // 2]), dim=-1)
        return x * cos + half * sin

    def attention(self, x, p, B, T, segment, position):
        heads, kv, D = self.c["num_attention_heads"], self.c["num_key_value_heads"], self.c["head_dim"]
        q = F.linear(x, self.w[p + "q_proj.weight"]).view(B, T, heads, D).transpose(1, 2)
        k = F.linear(x, self.w[p + "k_proj.weight"]).view(B, T, kv, D).transpose(1, 2)
        v = F.linear(x, self.w[p + "v_proj.weight"]).view(B, T, kv, D).transpose(1, 2)
        q, k = self.rotate(q, position), self.rotate(k, position)
        k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)  # repeat_kv
        s = q @ k.transpose(-1, -2) / D ** 0.5
        allowed = torch.tril(torch.ones(T, T, dtype=torch.bool)) & (segment.unsqueeze(2) == segment.unsqueeze(1)).unsqueeze(1)
        a = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1) @ v
        return F.linear(a.transpose(1, 2).reshape(B * T, heads * D), self.w[p + "o_proj.weight"])

    def sparse_moe(self, x, p):
        """MixtralSparseMoeBlock: softmax over the experts, the top k renormalised, every token
        to its k experts (no capacity)."""
        probs = torch.softmax(F.linear(x, self.w[p + "gate.weight"]), dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(probs, self.c["num_experts_per_tok"], dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        y = torch.zeros_like(x)
        for e in range(self.c["num_local_experts"]):
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            q = p + f"experts.{e}."
            h = F.silu(F.linear(x[rows], self.w[q + "w1.weight"])) * F.linear(x[rows], self.w[q + "w3.weight"])
            y.index_add_(0, rows, weights[rows, slot].unsqueeze(1) * F.linear(h, self.w[q + "w2.weight"]))
        return y

    @torch.no_grad()
    def forward(self, inputs, segment, position):
        B, T = inputs.shape
        x = self.w["model.embed_tokens.weight"][inputs.reshape(-1)]
        for n in range(self.c["num_hidden_layers"]):
            p = f"model.layers.{n}."
            x = x + self.attention(self.rms(x, p + "input_layernorm.weight"), p + "self_attn.", B, T, segment, position)
            x = x + self.sparse_moe(self.rms(x, p + "post_attention_layernorm.weight"), p + "block_sparse_moe.")
        head = self.w["model.embed_tokens.weight"] if self.c["tie_word_embeddings"] else self.w["lm_head.weight"]
        return F.linear(self.rms(x, "model.norm.weight"), head)


def cmd_loss(path, config, data, eval_h5):
    tensors, meta = meshmoe_torch.read_safetensors(path)
    model = Mixtral(json.load(open(config)), tensors, meshmoe_torch.Config(meta["deck"]))
    check_loss(model, "Mixtral forward", path, data, eval_h5)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"table": cmd_table, "loss": cmd_loss}[cmd](*args)
