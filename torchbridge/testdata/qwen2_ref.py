#!/usr/bin/python3
"""Independent Qwen2 reference implementation that writes golden fixtures.

Run (regenerates everything in this directory):

    /usr/bin/python3 torchbridge/testdata/qwen2_ref.py

Needs only torch (>= 1.13) and numpy; no transformers, no safetensors.

Reads   torchbridge/testdata/prompts.json   (list of {"text": str, "ids": [int]})
Writes  torchbridge/testdata/qwen2_golden.json

Checkpoints are not stored. Every weight is generated from a seed by the PRNG
below, which the Go tests re-implement bit-exactly.

PRNG (all integer arithmetic mod 2^64)
--------------------------------------
For a tensor with Hugging Face name ``name`` (e.g.
"model.layers.0.self_attn.q_proj.weight"), shape S (row-major, numel n),
element i (0-based flat row-major index, 0 <= i < n) is

    base = fnv1a64(utf8(name)) XOR uint64(seed)
    x    = splitmix64(base + i)                     # uint64 wraparound add
    u    = float64(x >> 40) / 2^24                  # exact, in [0, 1)
    r    = (2*u - 1) * scale                        # float64, one rounding
    v    = offset + r                               # float64 (skip when offset == 0)
    value = float32(v)                              # round-to-nearest-even

    splitmix64(z):
        z = z + 0x9E3779B97F4A7C15
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        return z ^ (z >> 31)

    fnv1a64(bytes): h = 0xcbf29ce484222325; for each byte b: h = (h ^ b) * 0x100000001b3

(In Go, keep the float64 steps unfused: write ``v := offset + float64(r)``
so the compiler may not contract ``(2u-1)*scale + offset`` into an FMA.)

Scale / offset table (see TENSOR_RULES):

    model.embed_tokens.weight              scale 0.25  offset 0
    lm_head.weight (untied only)           scale 1.0   offset 0
    *.self_attn.{q,k}_proj.weight          scale 0.3   offset 0
    *.self_attn.{v,o}_proj.weight          scale 0.2   offset 0
    *.self_attn.{q,k,v}_proj.bias          scale 0.1   offset 0
    *.mlp.{gate,up,down}_proj.weight       scale 0.2   offset 0
    *layernorm.weight, model.norm.weight   scale 0.1   offset 1.0

The model is Qwen2 exactly as Hugging Face's modeling_qwen2 (eager attention)
defines it; see forward_nocache().
"""

import argparse
import json
import math
import os
import sys

if __name__ == "__main__":
    # Single-threaded reference: deterministic and, with Debian's torch
    # (libgomp + OpenBLAS-pthread), faster than oversubscribed threads.
    for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_k, "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS_PATH = os.path.join(HERE, "prompts.json")
GOLDEN_PATH = os.path.join(HERE, "qwen2_golden.json")

MASK64 = (1 << 64) - 1
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3

QWEN25_VOCAB = 151936
BOS_ID = 151643  # <|endoftext|>
EOS_ID = 151645  # <|im_end|>

MAX_NEW_TOKENS = 32
MARGIN_THRESHOLD = 1e-3
SCORING_LEN = 12
MAX_SEED_TRIES = 64
MIN_DISTINCT = 8  # a generation must contain at least this many distinct ids

# --------------------------------------------------------------------------
# PRNG
# --------------------------------------------------------------------------


def fnv1a64(data: bytes) -> int:
    h = FNV_OFFSET
    for b in data:
        h ^= b
        h = (h * FNV_PRIME) & MASK64
    return h


def splitmix64_np(z: np.ndarray) -> np.ndarray:
    """Vectorised splitmix64 over a uint64 array (wraparound arithmetic)."""
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def splitmix64_int(z: int) -> int:
    """Scalar splitmix64 on Python ints (used to cross-check the numpy path)."""
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def prng_tensor(name: str, shape, seed: int, scale: float, offset: float = 0.0) -> np.ndarray:
    """float32 array of `shape` following the PRNG spec in the module docstring."""
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    base = np.uint64((fnv1a64(name.encode("utf-8")) ^ (seed & MASK64)) & MASK64)
    with np.errstate(over="ignore"):
        z = base + np.arange(n, dtype=np.uint64)  # wraps mod 2^64
    x = splitmix64_np(z)
    u = (x >> np.uint64(40)).astype(np.float64) / float(1 << 24)
    v = (2.0 * u - 1.0) * float(scale)
    if offset != 0.0:
        v = float(offset) + v
    return v.astype(np.float32).reshape(shape)


def prng_value_scalar(name: str, i: int, seed: int, scale: float, offset: float = 0.0) -> float:
    """Pure-Python single element (independent of numpy), returns the float32 value as float."""
    base = fnv1a64(name.encode("utf-8")) ^ (seed & MASK64)
    x = splitmix64_int((base + i) & MASK64)
    u = (x >> 40) / float(1 << 24)
    v = (2.0 * u - 1.0) * scale
    if offset != 0.0:
        v = offset + v
    return float(np.float32(v))


# (name suffix, scale, offset); first match wins.
TENSOR_RULES = [
    # embed is small relative to the layer outputs so that, with a tied head, the
    # current token's own embedding does not dominate the logits (greedy would
    # just repeat the last token).
    ("model.embed_tokens.weight", 0.25, 0.0),
    ("lm_head.weight", 1.0, 0.0),
    ("self_attn.q_proj.weight", 0.3, 0.0),
    ("self_attn.k_proj.weight", 0.3, 0.0),
    ("self_attn.v_proj.weight", 0.2, 0.0),
    ("self_attn.o_proj.weight", 0.2, 0.0),
    ("_proj.bias", 0.1, 0.0),
    ("mlp.gate_proj.weight", 0.2, 0.0),
    ("mlp.up_proj.weight", 0.2, 0.0),
    ("mlp.down_proj.weight", 0.2, 0.0),
    ("layernorm.weight", 0.1, 1.0),
    ("model.norm.weight", 0.1, 1.0),
]


def rule_for(name):
    for suffix, scale, offset in TENSOR_RULES:
        if name.endswith(suffix):
            return scale, offset
    raise KeyError(name)


def tensor_specs(cfg):
    """Ordered list of (hf_name, shape) for a Qwen2ForCausalLM config dict."""
    H = cfg["hidden_size"]
    I = cfg["intermediate_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg["num_key_value_heads"]
    hd = H // nh
    specs = [("model.embed_tokens.weight", [cfg["vocab_size"], H])]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        specs += [
            (p + "input_layernorm.weight", [H]),
            (p + "self_attn.q_proj.weight", [nh * hd, H]),
            (p + "self_attn.q_proj.bias", [nh * hd]),
            (p + "self_attn.k_proj.weight", [nkv * hd, H]),
            (p + "self_attn.k_proj.bias", [nkv * hd]),
            (p + "self_attn.v_proj.weight", [nkv * hd, H]),
            (p + "self_attn.v_proj.bias", [nkv * hd]),
            (p + "self_attn.o_proj.weight", [H, nh * hd]),
            (p + "post_attention_layernorm.weight", [H]),
            (p + "mlp.gate_proj.weight", [I, H]),
            (p + "mlp.up_proj.weight", [I, H]),
            (p + "mlp.down_proj.weight", [H, I]),
        ]
    specs.append(("model.norm.weight", [H]))
    if not cfg["tie_word_embeddings"]:
        specs.append(("lm_head.weight", [cfg["vocab_size"], H]))
    return specs


def make_weights(cfg, seed):
    """dict hf_name -> float32 torch tensor."""
    w = {}
    for name, shape in tensor_specs(cfg):
        scale, offset = rule_for(name)
        w[name] = torch.from_numpy(prng_tensor(name, shape, seed, scale, offset))
    return w


# --------------------------------------------------------------------------
# Functional Qwen2 (HF modeling_qwen2, eager attention), no KV cache
# --------------------------------------------------------------------------


def rms_norm(x, weight, eps):
    # HF Qwen2RMSNorm: compute in float32 (we keep float64 when the run is float64)
    in_dtype = x.dtype
    h = x.to(torch.float32) if in_dtype != torch.float64 else x
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return weight * h.to(in_dtype)


def rope_cos_sin(positions, head_dim, theta, dtype):
    """positions: 1-D int64 tensor. Returns cos, sin of shape [T, head_dim] in `dtype`.

    HF: inv_freq = 1/(theta ** (arange(0, d, 2).float() / d)) in float32,
    freqs = pos.float() * inv_freq, emb = cat(freqs, freqs), cos/sin in float32,
    then cast to the activation dtype. A float64 run does all of it in float64.
    """
    cdt = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(cdt) / head_dim))
    freqs = positions.to(cdt)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    d = x.shape[-1] // 2
    return torch.cat((-x[..., d:], x[..., :d]), dim=-1)


def apply_rope(x, cos, sin):
    # x: [B, heads, T, hd]; cos/sin: [T, hd]
    return x * cos + rotate_half(x) * sin


def linear(x, w, b=None):
    y = torch.matmul(x, w.t())
    if b is not None:
        y = y + b
    return y


def forward_nocache(w, cfg, ids, dtype=torch.float32, last_only=False):
    """ids: [B, T] int64. Returns logits [B, T, V] (or [B, 1, V] when last_only)."""
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg["num_key_value_heads"]
    hd = H // nh
    eps = cfg["rms_norm_eps"]
    B, T = ids.shape
    W = {k: v.to(dtype) for k, v in w.items()}
    x = W["model.embed_tokens.weight"][ids]  # [B, T, H]
    cos, sin = rope_cos_sin(torch.arange(T, dtype=torch.int64), hd, cfg["rope_theta"], dtype)
    causal = torch.full((T, T), float("-inf"), dtype=dtype).triu(1)
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = linear(h, W[p + "self_attn.q_proj.weight"], W[p + "self_attn.q_proj.bias"])
        k = linear(h, W[p + "self_attn.k_proj.weight"], W[p + "self_attn.k_proj.bias"])
        v = linear(h, W[p + "self_attn.v_proj.weight"], W[p + "self_attn.v_proj.bias"])
        q = q.view(B, T, nh, hd).transpose(1, 2)
        k = k.view(B, T, nkv, hd).transpose(1, 2)
        v = v.view(B, T, nkv, hd).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        rep = nh // nkv
        k = k.repeat_interleave(rep, dim=1)  # HF repeat_kv: head j uses kv head j // rep
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * (hd ** -0.5) + causal
        probs = torch.softmax(scores.to(torch.float32) if dtype != torch.float64 else scores, dim=-1).to(dtype)
        a = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, nh * hd)
        x = x + linear(a, W[p + "self_attn.o_proj.weight"])
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        g = linear(h, W[p + "mlp.gate_proj.weight"])
        u = linear(h, W[p + "mlp.up_proj.weight"])
        x = x + linear(torch.nn.functional.silu(g) * u, W[p + "mlp.down_proj.weight"])
    x = rms_norm(x, W["model.norm.weight"], eps)
    if last_only:
        x = x[:, -1:, :]
    head = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    return linear(x, head)


def greedy_nocache(w, cfg, prompt, n_new, dtype=torch.float32):
    """Greedy decode recomputing the full sequence each step.

    Returns (generated ids, per-step float logits rows as tensors [V])."""
    seq = list(prompt)
    out, rows = [], []
    with torch.no_grad():
        for _ in range(n_new):
            logits = forward_nocache(w, cfg, torch.tensor([seq], dtype=torch.int64), dtype, last_only=True)[0, -1]
            nxt = int(torch.argmax(logits))
            rows.append(logits)
            out.append(nxt)
            seq.append(nxt)
    return out, rows


# --------------------------------------------------------------------------
# nn.Module Qwen2 with a concatenating KV cache ("HF eager" stand-in).
# Used by the self-check below and by bench/torch_eager.py.
# --------------------------------------------------------------------------


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        in_dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(in_dtype)


class Attention(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H = cfg["hidden_size"]
        self.nh = cfg["num_attention_heads"]
        self.nkv = cfg["num_key_value_heads"]
        self.hd = H // self.nh
        self.q_proj = torch.nn.Linear(H, self.nh * self.hd, bias=True)
        self.k_proj = torch.nn.Linear(H, self.nkv * self.hd, bias=True)
        self.v_proj = torch.nn.Linear(H, self.nkv * self.hd, bias=True)
        self.o_proj = torch.nn.Linear(self.nh * self.hd, H, bias=False)

    def forward(self, x, cos, sin, mask, past):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        present = (k, v)
        rep = self.nh // self.nkv
        if rep > 1:  # HF repeat_kv
            S = k.shape[2]
            k = k[:, :, None].expand(B, self.nkv, rep, S, self.hd).reshape(B, self.nh, S, self.hd)
            v = v[:, :, None].expand(B, self.nkv, rep, S, self.hd).reshape(B, self.nh, S, self.hd)
        scores = torch.matmul(q, k.transpose(2, 3)) * (self.hd ** -0.5)
        if mask is not None:
            scores = scores + mask
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        a = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(a), present


class MLP(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, I = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = torch.nn.Linear(H, I, bias=False)
        self.up_proj = torch.nn.Linear(H, I, bias=False)
        self.down_proj = torch.nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, past):
        a, present = self.self_attn(self.input_layernorm(x), cos, sin, mask, past)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, present


class Qwen2Inner(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = torch.nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class Qwen2ForCausalLM(torch.nn.Module):
    """Parameter names match the HF checkpoint names exactly."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Qwen2Inner(cfg)
        self.tied = bool(cfg["tie_word_embeddings"])
        if not self.tied:
            self.lm_head = torch.nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        hd = cfg["hidden_size"] // cfg["num_attention_heads"]
        self.register_buffer(
            "inv_freq",
            1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd)),
            persistent=False,
        )

    def head_weight(self):
        return self.model.embed_tokens.weight if self.tied else self.lm_head.weight

    def forward(self, input_ids, past_key_values=None, logits_to_keep=0):
        """input_ids [B, T]. past_key_values: list of (k, v) per layer or None.

        logits_to_keep: 0 = all positions, n>0 = only the last n positions.
        Returns (logits, new_past)."""
        B, T = input_ids.shape
        past_len = 0 if past_key_values is None else past_key_values[0][0].shape[2]
        x = self.model.embed_tokens(input_ids)
        pos = torch.arange(past_len, past_len + T, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        mask = None
        if T > 1:
            S = past_len + T
            mask = torch.full((T, S), float("-inf"), dtype=x.dtype).triu(past_len + 1)
        new_past = []
        for i, layer in enumerate(self.model.layers):
            x, present = layer(x, cos, sin, mask, None if past_key_values is None else past_key_values[i])
            new_past.append(present)
        x = self.model.norm(x)
        if logits_to_keep > 0:
            x = x[:, -logits_to_keep:, :]
        logits = torch.nn.functional.linear(x, self.head_weight())
        return logits, new_past


def module_from_weights(cfg, w):
    m = Qwen2ForCausalLM(cfg)
    sd = dict(w)
    missing = set(k for k in m.state_dict().keys()) - set(sd.keys())
    assert not missing, missing
    m.load_state_dict(sd, strict=True)
    return m.eval()


def greedy_cached(m, prompt, n_new):
    """Greedy decode with the concatenating KV cache. Returns (ids, logits rows)."""
    out, rows = [], []
    with torch.no_grad():
        logits, past = m(torch.tensor([prompt], dtype=torch.int64), None, logits_to_keep=1)
        for step in range(n_new):
            row = logits[0, -1]
            nxt = int(torch.argmax(row))
            out.append(nxt)
            rows.append(row)
            if step + 1 < n_new:
                logits, past = m(torch.tensor([[nxt]], dtype=torch.int64), past, logits_to_keep=1)
    return out, rows


# --------------------------------------------------------------------------
# Fixture generation
# --------------------------------------------------------------------------


def hf_config(vocab, hidden, inter, layers, heads, kv_heads, theta, tied):
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": theta,
        "tie_word_embeddings": tied,
        "max_position_embeddings": 512,
        "use_sliding_window": False,
        "sliding_window": 512,
        "max_window_layers": layers,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }


CASES = [
    # name, first seed to try, config
    ("tied_gqa", 1, hf_config(QWEN25_VOCAB, 64, 160, 2, 4, 2, 10000.0, True)),
    ("untied_mqa", 101, hf_config(QWEN25_VOCAB, 64, 160, 3, 4, 1, 1000000.0, False)),
    ("tied_mha", 201, hf_config(QWEN25_VOCAB, 64, 160, 2, 4, 4, 1000000.0, True)),
]


def top2_margin(row):
    v, _ = torch.topk(row.to(torch.float64), 2)
    return float(v[0] - v[1])


def f32(x):
    """float32 value rendered as a float64 that round-trips exactly (repr)."""
    return float(np.float32(x))


def run_case_seed(cfg, seed, prompts):
    """Returns (result dict, ok, reason)."""
    w = make_weights(cfg, seed)
    res = []
    ok, reason = True, ""
    for pi, p in enumerate(prompts):
        ids32, rows32 = greedy_nocache(w, cfg, p["ids"], MAX_NEW_TOKENS, torch.float32)
        margins = [top2_margin(r) for r in rows32]
        mm = min(margins)
        if mm <= MARGIN_THRESHOLD:
            ok, reason = False, "prompt %d: min top-2 margin %.3g <= %g" % (pi, mm, MARGIN_THRESHOLD)
        # float64 truth must pick the same tokens
        ids64, rows64 = greedy_nocache(w, cfg, p["ids"], MAX_NEW_TOKENS, torch.float64)
        if ids64 != ids32:
            ok, reason = False, "prompt %d: float64 greedy differs from float32" % pi
        if EOS_ID in ids32 or BOS_ID in ids32:
            ok, reason = False, "prompt %d: generated an eos/bos id" % pi
        if len(set(ids32)) < MIN_DISTINCT:
            ok, reason = False, "prompt %d: degenerate generation (<%d distinct ids)" % (pi, MIN_DISTINCT)
        first = rows32[0]
        lse = float(torch.logsumexp(first.to(torch.float64), 0))
        res.append({
            "prompt_index": pi,
            "prompt_ids": list(p["ids"]),
            "generated_ids": ids32,
            "margins": [round(m, 6) for m in margins],
            "min_margin": mm,
            "prefill_logits_first16": [f32(v) for v in first[:16].tolist()],
            "prefill_argmax_id": ids32[0],
            "prefill_argmax_logit": f32(first[ids32[0]]),
            "prefill_logsumexp": lse,
            "prefill_logits_f64_first16": [float(v) for v in rows64[0][:16].tolist()],
            "_rows32": rows32,
        })
        if not ok:
            break
    return w, res, ok, reason


def self_check_cached(cfg, w, prompt_results):
    m = module_from_weights(cfg, w)
    worst = 0.0
    for r in prompt_results:
        ids, rows = greedy_cached(m, r["prompt_ids"], MAX_NEW_TOKENS)
        assert ids == r["generated_ids"], ("KV-cached decode differs from no-cache decode", ids, r["generated_ids"])
        for a, b in zip(rows, r["_rows32"]):
            d = float((a - b).abs().max())
            worst = max(worst, d)
    assert worst < 1e-3, "cached vs no-cache logits differ by %g" % worst
    return worst


def scoring_fixture(cfg, w, seq):
    """Per-token log p(seq[t+1] | seq[:t+1]) and entropies, plus gradients of
    loss = -mean(logprobs) (all computed in float64 from the float32 weights)."""
    T = len(seq)
    ids = torch.tensor([seq], dtype=torch.int64)
    W64 = {k: v.to(torch.float64).requires_grad_(True) for k, v in w.items()}
    logits = forward_nocache(W64, cfg, ids, torch.float64)[0]  # [T, V]
    logp_all = torch.log_softmax(logits, dim=-1)
    tgt = ids[0, 1:]
    lp = logp_all[:-1].gather(1, tgt[:, None])[:, 0]  # [T-1]
    ent = -(logp_all.exp() * logp_all).sum(-1)[:-1]  # [T-1]
    loss = -lp.mean()
    loss.backward()
    with torch.no_grad():
        logits32 = forward_nocache(w, cfg, ids, torch.float32)[0]
        lp32 = torch.log_softmax(logits32, -1)[:-1].gather(1, tgt[:, None])[:, 0]
    grads = {}
    for name, _ in tensor_specs(cfg):
        g = W64[name].grad
        grads[name] = float(g.norm())
    sample = {}
    for name in ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.bias",
                 "model.layers.0.input_layernorm.weight", "model.norm.weight",
                 "model.layers.%d.mlp.down_proj.weight" % (cfg["num_hidden_layers"] - 1)]:
        sample[name] = [float(v) for v in W64[name].grad.reshape(-1)[:8].tolist()]
    emb_g = W64["model.embed_tokens.weight"].grad
    tok = seq[1]
    sample["model.embed_tokens.weight[row %d]" % tok] = [float(v) for v in emb_g[tok, :8].tolist()]
    return {
        "ids": list(seq),
        "logprobs": [float(v) for v in lp.tolist()],
        "entropies": [float(v) for v in ent.tolist()],
        "loss": float(loss),
        "logprobs_f32_maxabsdiff": float((lp32.double() - lp.detach()).abs().max()),
        "grad_norms": grads,
        "grad_first8": sample,
    }


def tensor_checksums(a):
    """Checks for a generated float32 tensor, in flat row-major order:
    first4: the first 4 values; sum_seq_f64: the values summed one by one, left
    to right, in float64 (plain loop, no pairwise summation); hash31: over the
    float32 bit patterns b_i (uint32), h = 0; for each i: h = h*31 + b_i (mod 2^64),
    as a decimal string."""
    flat = a.reshape(-1)
    bits = flat.view(np.uint32).astype(np.uint64)
    n = bits.size
    with np.errstate(over="ignore"):
        pw = np.empty(n, dtype=np.uint64)  # pw[i] = 31^(n-1-i) mod 2^64
        pw[-1] = 1
        if n > 1:
            pw[:-1] = np.cumprod(np.full(n - 1, 31, dtype=np.uint64))[::-1]
        h = int(np.sum(bits * pw, dtype=np.uint64))
    return {
        "first4": [float(v) for v in flat[:4]],
        "sum_seq_f64": float(np.cumsum(flat.astype(np.float64))[-1]),
        "hash31": str(h),
    }


def pinned_prng():
    name = "model.embed_tokens.weight"
    vals = prng_tensor(name, [QWEN25_VOCAB, 64], 1, 1.0)[0, :4]
    for i, v in enumerate(vals):
        s = prng_value_scalar(name, i, 1, 1.0)
        assert s == float(v), (i, s, float(v))
    # also the raw splitmix64 output for element 0, and the fnv hash
    h = fnv1a64(name.encode())
    x0 = splitmix64_int((h ^ 1) & MASK64)
    # one offset tensor, to pin the offset path
    nname = "model.norm.weight"
    nvals = prng_tensor(nname, [64], 1, 0.1, 1.0)[:4]
    for i, v in enumerate(nvals):
        assert prng_value_scalar(nname, i, 1, 0.1, 1.0) == float(v)
    return {
        "seed": 1,
        "name": name,
        "scale": 1.0,
        "offset": 0.0,
        "fnv1a64_hex": "0x%016x" % h,
        "splitmix64_elem0_hex": "0x%016x" % x0,
        "first4": [float(v) for v in vals],
        "first4_float32_bits_hex": ["0x%08x" % int(np.float32(v).view(np.uint32)) for v in vals],
        "norm_example": {
            "seed": 1, "name": nname, "scale": 0.1, "offset": 1.0,
            "first4": [float(v) for v in nvals],
            "first4_float32_bits_hex": ["0x%08x" % int(np.float32(v).view(np.uint32)) for v in nvals],
        },
    }


PLACEHOLDER_PROMPTS = [
    {"text": "PLACEHOLDER: Hello, world!", "ids": [9707, 11, 1879, 0]},
    {"text": "PLACEHOLDER: 12 + 345 = ", "ids": [16, 17, 488, 220, 18, 19, 20, 284, 220]},
    {"text": "PLACEHOLDER: spaces and digits", "ids": [785, 220, 220, 220, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 220, 220, 15]},
    {"text": "PLACEHOLDER: The quick brown fox", "ids": [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13, 576, 5562, 220, 24, 24, 13]},
]


def load_prompts(path):
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump(PLACEHOLDER_PROMPTS, f, indent=1)
            f.write("\n")
        print("wrote placeholder %s" % path)
    with open(path) as f:
        prompts = json.load(f)
    assert isinstance(prompts, list) and prompts, "prompts.json must be a non-empty list"
    for p in prompts:
        assert all(isinstance(i, int) and 0 <= i < QWEN25_VOCAB for i in p["ids"]), p
        assert len(p["ids"]) >= 1
        assert len(p["ids"]) + MAX_NEW_TOKENS <= 512, "prompt too long for max_position_embeddings"
    return prompts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default=PROMPTS_PATH)
    ap.add_argument("--out", default=GOLDEN_PATH)
    args = ap.parse_args()

    torch.set_num_threads(1)
    pin = pinned_prng()
    print("PRNG pin: seed 1 %s first4 = %s" % (pin["name"], pin["first4"]))
    print("          bits %s" % pin["first4_float32_bits_hex"])

    prompts = load_prompts(args.prompts)
    golden = {
        "format_version": 1,
        "generator": "torchbridge/testdata/qwen2_ref.py",
        "torch_version": torch.__version__,
        "prng": {
            "spec": "base = fnv1a64(utf8(name)) ^ uint64(seed); x = splitmix64(base + i); "
                    "u = float64(x >> 40) / 2^24; value = float32(offset + (2u - 1) * scale)",
            "rules": [{"suffix": s, "scale": sc, "offset": off} for s, sc, off in TENSOR_RULES],
            "pinned": pin,
        },
        "max_new_tokens": MAX_NEW_TOKENS,
        "stop_on_eos": False,
        "margin_threshold": MARGIN_THRESHOLD,
        "prompts": prompts,
        "cases": [],
    }

    for cname, seed0, cfg in CASES:
        tried = []
        for seed in range(seed0, seed0 + MAX_SEED_TRIES):
            w, res, ok, reason = run_case_seed(cfg, seed, prompts)
            if ok:
                break
            tried.append({"seed": seed, "rejected": reason})
            print("case %s seed %d rejected: %s" % (cname, seed, reason))
        else:
            raise SystemExit("case %s: no acceptable seed in %d tries" % (cname, MAX_SEED_TRIES))
        worst = self_check_cached(cfg, w, res)
        for r in res:
            del r["_rows32"]
        tensors = []
        for name, shape in tensor_specs(cfg):
            sc, off = rule_for(name)
            tensors.append(dict({"name": name, "shape": shape, "scale": sc, "offset": off},
                                **tensor_checksums(w[name].numpy())))
        case = {
            "name": cname,
            "config": cfg,
            "seed": seed,
            "rejected_seeds": tried,
            "tensors": tensors,
            "kv_cache_selfcheck_max_abs_logit_diff": worst,
            "results": res,
        }
        print("case %-11s seed %d  min margin %.4f  cached-vs-nocache max|dlogit| %.2e  gens: %s" % (
            cname, seed, min(r["min_margin"] for r in res), worst,
            " | ".join(str(r["generated_ids"][:6]) + "..." for r in res)))
        golden["cases"].append(case)

    # scoring / gradient fixture on case (a)
    cname, _, cfg = CASES[0]
    case = golden["cases"][0]
    w = make_weights(cfg, case["seed"])
    r0 = case["results"][0]
    seq = (r0["prompt_ids"] + r0["generated_ids"])[:SCORING_LEN]
    sc = scoring_fixture(cfg, w, seq)
    sc.update({"case": cname, "seed": case["seed"], "prompt_len": min(len(r0["prompt_ids"]), SCORING_LEN),
               "note": "logprobs[t] = log p(ids[t+1] | ids[:t+1]); entropies[t] = entropy (nats) of the full "
                       "next-token distribution at position t; loss = -mean(logprobs); grads of loss w.r.t. "
                       "each tensor (tied: embed grad includes the lm_head path); all computed in float64 "
                       "from the float32 PRNG weights, temperature 1"})
    golden["scoring"] = sc
    print("scoring: %d tokens, loss %.6f, f32-vs-f64 max|dlogp| %.2e" % (len(seq), sc["loss"], sc["logprobs_f32_maxabsdiff"]))

    with open(args.out, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print("wrote %s (%d bytes)" % (args.out, os.path.getsize(args.out)))


if __name__ == "__main__":
    main()
