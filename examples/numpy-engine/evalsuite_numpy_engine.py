"""A user's own engine in about 50 lines: a pure-numpy float32 decoder for dense Llama/Qwen-style models.

It recomputes the whole sequence for every new token (no KV cache): generation and teacher-forced
scoring run the same forward pass. Fault "no_rope" (a self-test aid) skips the rotary embedding.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from engines.base import Capabilities, Engine, EngineOptions, Forced, Generation, Scored, check_prompts
from engines.errors import ModelError


class NumpyEngine(Engine):
    """Pure-numpy float32 decoder for dense models (the example plugin under examples/numpy-engine)."""

    faults = ("no_rope",)
    capabilities = Capabilities(logits=True, forced_path="decode")  # one forward pass serves both

    @classmethod
    def create(cls, model, options: EngineOptions) -> NumpyEngine:
        if model.config.family != "dense" or options.dtype != "float32":
            raise ModelError("the numpy engine runs dense models in float32 only")
        return cls(model.weights, options.fault)

    def __init__(self, weights, fault=None):
        self.name, self.dtype, self.fault = "numpy", "float32", fault
        self.config, self.weights_sha256, self.w = weights.config, weights.sha256, weights.arrays

    @property
    def fingerprint(self) -> str:
        blob = Path(__file__).read_bytes() + repr((self.fault, self.weights_sha256)).encode()
        return hashlib.sha256(blob).hexdigest()

    def _logits(self, ids) -> np.ndarray:  # [T, V] for one sequence
        c, w, T = self.config, self.w, len(ids)

        def norm(x, g):
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + c.rms_eps) * g

        def rope(x):  # [T, heads, hd]
            ang = np.arange(T)[:, None, None] * c.rope_theta ** (-np.arange(0, c.head_dim, 2) / c.head_dim)
            cos, sin = np.cos(ang), np.sin(ang)
            a, b = (x[..., 0::2], x[..., 1::2]) if c.rope_style == "interleaved" else np.split(x, 2, -1)
            out = (a * cos - b * sin, a * sin + b * cos)
            return np.stack(out, -1).reshape(x.shape) if c.rope_style == "interleaved" else np.concatenate(out, -1)

        x = w["embed"][ids].astype(np.float32)
        for i in range(c.n_layers):
            h = norm(x, w["attn_norm"][i])
            q, k, v = (h @ w[n][i] for n in ("wq", "wk", "wv"))
            q, k, v = (a.reshape(T, -1, c.head_dim) for a in (q, k, v))
            if c.qk_norm:
                q, k = norm(q, w["q_norm"][i]), norm(k, w["k_norm"][i])
            if self.fault != "no_rope":
                q, k = rope(q), rope(k)
            k, v = (np.repeat(a, c.n_heads // c.n_kv_heads, axis=1) for a in (k, v))
            s = np.einsum("thd,shd->hts", q, k) / np.sqrt(c.head_dim) + np.triu(np.full((T, T), -np.inf), 1)
            p = np.exp(s - s.max(-1, keepdims=True))
            x = x + np.einsum("hts,shd->thd", p / p.sum(-1, keepdims=True), v).reshape(T, -1) @ w["wo"][i]
            h = norm(x, w["mlp_norm"][i])
            g = h @ w["gate"][i]
            x = x + (g / (1 + np.exp(-g)) * (h @ w["up"][i])) @ w["down"][i]
        head = w["embed"] if c.tie_embeddings else w["lm_head"]
        return norm(x, w["final_norm"]) @ head.T

    def generate(self, prompts, max_new_tokens, stop_ids=(), top_k=5, want_logits=False, stop_check=None,
                 stop_strings=()):
        check_prompts(prompts, self.config.vocab_size, self.config.max_context, max_new_tokens)
        out = []
        for p in prompts:
            ids, rows = list(map(int, p)), []
            while len(rows) < max_new_tokens:
                rows.append(self._logits(ids)[-1])
                ids.append(int(rows[-1].argmax()))
                if ids[-1] in stop_ids or (stop_check and stop_check(ids[len(p):])):
                    break
            f = Forced.from_logits(np.stack(rows), ids[len(p):], top_k)
            done = len(rows) < max_new_tokens or ids[-1] in stop_ids
            out.append(Generation(list(p), ids[len(p):], f.top_ids, f.top_logprobs, "stop" if done else "length",
                                  f.logits if want_logits else None))
        return out

    def score(self, seqs, want_taps=False):
        return [Scored(self._logits(list(s)).astype(np.float32)) for s in seqs]

    def forced_topk(self, prompts, continuations, k=5, want_logits=False):
        seqs = [list(p) + list(x) for p, x in zip(prompts, continuations)]
        check_prompts(seqs, self.config.vocab_size, self.config.max_context + 1, 1)
        return [Forced.from_logits(self._logits(s)[len(p) - 1:-1], x, k, want_logits)
                for s, p, x in zip(seqs, prompts, continuations)]

