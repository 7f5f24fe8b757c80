"""Pure-JAX decoder math for the dense (Llama/Qwen) and MoE (DeepSeek-V3/Kimi) families.

Written to be read, not to be fast: one Python loop over layers, every step named. Shapes:
B batch rows, T tokens this call, S cache slots, D hidden, H query heads, K kv heads, hd head dim,
V vocab, E experts.

Precision: the residual stream, norms, RoPE, attention, softmax, routing and the KV cache are
float32 in every mode. The weights' dtype is the mode (float32 or bfloat16): a matmul rounds its
input to the weight dtype and accumulates in float32, so "bfloat16" is the TPU recipe (bf16
weights and matmul inputs, f32 accumulation and residual) that engines declare for bf16 mode,
and the reference run in bf16 against itself in f32 measures that recipe's own error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from engines.config import Config

f32 = jnp.float32


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """x / sqrt(mean(x^2) + eps) * w over the last axis, in float32."""
    x32 = x.astype(f32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return y * w.astype(f32)


def rope_cos_sin(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """positions [B, T] -> cos, sin [B, T, 1, hd/2]; frequency i is theta^(-2i/hd)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=f32) / head_dim))
    angle = positions.astype(f32)[..., None] * inv_freq  # [B, T, hd/2]
    return jnp.cos(angle)[:, :, None, :], jnp.sin(angle)[:, :, None, :]


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, style: str) -> jax.Array:
    """Rotate x [B, T, heads, hd]. "interleaved": pairs (2i, 2i+1); "half": pairs (i, i + hd/2)."""
    x32 = x.astype(f32)
    if style == "interleaved":
        a, b = x32[..., 0::2], x32[..., 1::2]
        out = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)
    else:
        half = x.shape[-1] // 2
        a, b = x32[..., :half], x32[..., half:]
        out = jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    return out


def attention(q: jax.Array, k: jax.Array, v: jax.Array, q_pos: jax.Array) -> jax.Array:
    """Grouped-query causal attention over a cache.

    q [B, T, H, hd]; k, v [B, K, S, hd] (slot s holds position s); q_pos [B, T].
    A query at position p sees slots 0..p. Returns [B, T, H*hd].
    The G = H/K query heads of one kv head are stacked as G*T rows of one batched matmul
    (kv-head-major cache: 4x faster on CPU than a [B, S, K, hd] cache, measured at B=32, S=256).
    """
    B, T, H, hd = q.shape
    K, S = k.shape[1], k.shape[2]
    G = H // K  # query head h uses kv head h // G
    qg = q.reshape(B, T, K, G, hd).transpose(0, 2, 3, 1, 4).reshape(B, K, G * T, hd)
    # Attention runs in float32 whatever the activation dtype (XLA on CPU has no bf16 x bf16 -> f32
    # batched dot, and the cache is small next to the weights).
    qg, k, v = qg.astype(f32), k.astype(f32), v.astype(f32)
    scores = jnp.einsum("bkqd,bksd->bkqs", qg, k) / jnp.sqrt(f32(hd))
    visible = jnp.arange(S)[None, None, :] <= q_pos[:, :, None]  # [B, T, S]
    visible = jnp.broadcast_to(visible[:, None, None], (B, 1, G, T, S)).reshape(B, 1, G * T, S)
    scores = jnp.where(visible, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkqs,bksd->bkqd", probs, v)
    out = out.reshape(B, K, G, T, hd).transpose(0, 3, 1, 2, 4)  # [B, T, K, G, hd]
    return out.reshape(B, T, H * hd)


# Query rows per block of a fresh prefill's causal attention: block i attends to keys 0..end of block i
# only, so about half the T x T scores are never formed, and each block's scores stay in cache.
PREFILL_QUERY_BLOCK = 256


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array) -> jax.Array:
    """Causal attention of T fresh tokens at positions 0..T-1 among themselves (nothing cached before).

    q [B, T, H, hd]; k, v [B, T, K, hd]; positions [B, T] (= 0..T-1). Returns [B, T, H*hd], the same
    as attention() over a cache holding exactly these keys; queries run in blocks of
    PREFILL_QUERY_BLOCK, each over the keys up to its own last position (the rest are masked anyway).
    """
    T = q.shape[1]
    kk, vv = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, hd]: the cache layout
    outs = []
    for a in range(0, T, PREFILL_QUERY_BLOCK):
        b = min(a + PREFILL_QUERY_BLOCK, T)
        outs.append(attention(q[:, a:b], kk[:, :, :b], vv[:, :, :b], positions[:, a:b]))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def rounded(x: jax.Array, dtype) -> jax.Array:
    """x rounded to dtype (a matmul input in bf16 mode), held as float32."""
    return x.astype(dtype).astype(f32)


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x (float32) @ w: the input rounded to w's dtype, products accumulated in float32."""
    return jnp.matmul(x.astype(w.dtype), w, preferred_element_type=f32)


def swiglu(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
    """down(silu(x @ gate) * (x @ up))."""
    return matmul(jax.nn.silu(matmul(x, gate)) * matmul(x, up), down)


def route(x: jax.Array, router: jax.Array, bias: jax.Array, c: Config) -> jax.Array:
    """Expert weights [..., E], zero outside each token's top-k.

    softmax router: choose and weigh by softmax(logits).
    sigmoid router (DeepSeek-V3): choose by sigmoid(logits) + bias, weigh by sigmoid(logits).
    Then optionally renormalise the k weights to sum 1, and scale by routed_scale.
    """
    logits = jnp.matmul(x.astype(f32), router.astype(f32))
    if c.router == "softmax":
        scores = jax.nn.softmax(logits, axis=-1)
        choice = scores
    else:
        scores = jax.nn.sigmoid(logits)
        choice = scores + bias.astype(f32)
    _, idx = jax.lax.top_k(choice, c.top_k)  # [..., k]
    w = jnp.take_along_axis(scores, idx, axis=-1)
    if c.norm_topk:
        w = w / jnp.sum(w, axis=-1, keepdims=True)
    w = w * c.routed_scale
    one_hot = jax.nn.one_hot(idx, c.n_experts, dtype=f32)  # [..., k, E]
    return jnp.einsum("...k,...ke->...e", w, one_hot)


def moe(x: jax.Array, p: dict, m: int, c: Config) -> jax.Array:
    """Routed experts (every expert evaluated, weighted by route's sparse weights) + shared expert."""
    gates = route(x, p["router"][m], p["router_bias"][m], c)  # [B, T, E]
    # Operands widened to float32 after rounding to the weight dtype: exactly the products of bf16
    # inputs with f32 accumulation (XLA on CPU has no bf16 x bf16 -> f32 batched contraction).
    wd = p["e_gate"][m].dtype
    x32 = rounded(x, wd)
    h = (jax.nn.silu(jnp.einsum("btd,edf->btef", x32, p["e_gate"][m].astype(f32)))
         * jnp.einsum("btd,edf->btef", x32, p["e_up"][m].astype(f32)))
    y = jnp.einsum("btef,efd->bted", rounded(h, wd), p["e_down"][m].astype(f32))
    out = jnp.einsum("bte,bted->btd", gates, y)
    if c.n_shared_experts:
        out = out + swiglu(x, p["s_gate"][m], p["s_up"][m], p["s_down"][m])
    return out


def forward(p: dict, c: Config, tokens: jax.Array, positions: jax.Array,
            k_cache: jax.Array, v_cache: jax.Array, want_taps: bool = False,
            logit_index: jax.Array | None = None, fresh: bool = False):
    """Run T new tokens per row through every layer, writing their K/V into the cache.

    fresh: the tokens sit at positions 0..T-1 of an empty cache (a prefill from the start), so
    attention reads this call's own keys (causal_attention) instead of all S cache slots.

    tokens, positions [B, T] int32; k_cache, v_cache: lists of L arrays [B, K, S, hd] (one buffer
    per layer, so the in-place cache update never copies the other layers).
    Returns logits [B, T, V] float32 (or [B, V] at logit_index [B] when given: prefill needs only
    each row's last prompt position), the updated caches, and taps [L, B, T, D] (the residual
    stream after each layer, float32) when want_taps, else None.
    """
    B, T = tokens.shape
    k_cache, v_cache = list(k_cache), list(v_cache)
    x = p["embed"][tokens].astype(f32)  # [B, T, D], the float32 residual stream
    cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta)
    rows = jnp.arange(B)[:, None]  # [B, 1], broadcast with positions for the cache scatter
    taps = []
    for layer in range(c.n_layers):
        h = rms_norm(x, p["attn_norm"][layer], c.rms_eps)
        q = matmul(h, p["wq"][layer]).reshape(B, T, c.n_heads, c.head_dim)
        k = matmul(h, p["wk"][layer]).reshape(B, T, c.n_kv_heads, c.head_dim)
        v = matmul(h, p["wv"][layer]).reshape(B, T, c.n_kv_heads, c.head_dim)
        if c.qk_norm:
            q = rms_norm(q, p["q_norm"][layer], c.rms_eps)
            k = rms_norm(k, p["k_norm"][layer], c.rms_eps)
        q = apply_rope(q, cos, sin, c.rope_style)
        k = apply_rope(k, cos, sin, c.rope_style)
        # advanced indices (rows, positions) around a slice: the update is shaped [B, T, K, hd]
        k_cache[layer] = k_cache[layer].at[rows, :, positions].set(k.astype(k_cache[layer].dtype))
        v_cache[layer] = v_cache[layer].at[rows, :, positions].set(v.astype(v_cache[layer].dtype))
        attn = (causal_attention(q, k, v, positions) if fresh
                else attention(q, k_cache[layer], v_cache[layer], positions))
        x = x + matmul(attn, p["wo"][layer])
        h = rms_norm(x, p["mlp_norm"][layer], c.rms_eps)
        if layer < c.n_dense_layers:
            x = x + swiglu(h, p["gate"][layer], p["up"][layer], p["down"][layer])
        else:
            x = x + moe(h, p, layer - c.n_dense_layers, c)
        if want_taps:
            taps.append(x.astype(f32))
    if logit_index is not None:
        x = jnp.take_along_axis(x, logit_index[:, None, None], axis=1)[:, 0]  # [B, D]
    x = rms_norm(x, p["final_norm"], c.rms_eps)
    head = p["embed"] if c.tie_embeddings else p["lm_head"]
    logits = jnp.einsum("...d,vd->...v", x.astype(head.dtype), head, preferred_element_type=f32)
    return logits, k_cache, v_cache, (jnp.stack(taps) if want_taps else None)
