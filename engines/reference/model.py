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

import threading
from contextlib import contextmanager

import jax
import jax.numpy as jnp

from engines.config import Config
from engines.reference import gdn, kda, mla, residual, rope, rounding
from engines.reference.moe import forced_choice, moe
from engines.reference.moe import forced_gap as moe_forced_gap

f32 = jnp.float32  # the compute dtype: float64 only inside float64_math
_EXACT = threading.Lock()


@contextmanager
def float64_math():
    """The same math in float64 (jax x64 on; every `f32` below reads as float64 while open): the reference's
    own distance from exact arithmetic, for the conditioning witness (evalsuite/compare/rule.py). Functions
    traced inside it are float64 programs; programs jitted before it keep their float32 traces. One at a time
    (the lock): the name is module-wide."""
    global f32
    with _EXACT, jax.enable_x64(True):
        f32 = jnp.float64
        try:
            yield
        finally:
            f32 = jnp.float32


def rms_norm(x: jax.Array, w: jax.Array | None, eps: float, style: str = "plain") -> jax.Array:
    """x / sqrt(mean(x^2) + eps) * w over the last axis, in float32 (style "gemma": * (1 + w); w None: no weight,
    Muse's parameter-free norms)."""
    x32 = x.astype(f32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + f32(eps))
    if w is None:
        return y
    return y * (w.astype(f32) + 1.0 if style == "gemma" else w.astype(f32))


def rope_cos_sin(positions: jax.Array, head_dim: int, theta: float, inv_freq=None,
                 factor: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """positions [B, T] -> cos, sin [B, T, 1, hd/2]; frequency i is theta^(-2i/hd), or inv_freq when
    given (a scaled RoPE: engines.reference.rope), and both multiplied by factor (YaRN's attention factor)."""
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=f32) / head_dim))
    angle = positions.astype(f32)[..., None] * jnp.asarray(inv_freq, f32)  # [B, T, hd/2]
    cos, sin = jnp.cos(angle)[:, :, None, :], jnp.sin(angle)[:, :, None, :]
    return (cos, sin) if factor == 1.0 else (cos * f32(factor), sin * f32(factor))


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, style: str) -> jax.Array:
    """Rotate x [B, T, heads, hd]. "interleaved": pairs (2i, 2i+1); "half": pairs (i, i + hd/2). cos, sin
    [..., r/2] with r < hd (a partial RoPE, Qwen3-Next's): only the first r dims turn, the rest pass through."""
    r = 2 * cos.shape[-1]
    if r < x.shape[-1]:
        return jnp.concatenate([apply_rope(x[..., :r], cos, sin, style), x[..., r:].astype(f32)], axis=-1)
    x32 = x.astype(f32)
    if style == "interleaved":
        a, b = x32[..., 0::2], x32[..., 1::2]
        out = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)
    else:
        half = x.shape[-1] // 2
        a, b = x32[..., :half], x32[..., half:]
        out = jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    return out


def attention(q: jax.Array, k: jax.Array, v: jax.Array, q_pos: jax.Array, window: int = 0,
              scale: float = 0.0, softcap: float = 0.0, sinks: jax.Array | None = None) -> jax.Array:
    """Grouped-query causal attention over a cache.

    q [B, T, H, hd]; k, v [B, K, S, hd] (slot s holds position s); q_pos [B, T].
    A query at position p sees slots 0..p (with window > 0 only p - window + 1..p: a sliding layer).
    Scores are q.k / sqrt(hd), or q.k * scale when given; softcap > 0 maps them to cap * tanh(s / cap)
    before the mask; sinks [H] (one logit per head) join each softmax's denominator only.
    Returns [B, T, H*hd].
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
    if T == 1:  # a decode step: G matrix-vector products; the batched [G, hd] x [hd, S] product transposes
        # the cache first (9.9 -> 4.8 ms a layer at B=32, S=1,024, measured with XLA on this CPU)
        scores = jnp.stack([jnp.einsum("bkd,bksd->bks", qg[:, :, g], k) for g in range(G)], axis=2)
    else:
        scores = jnp.einsum("bkqd,bksd->bkqs", qg, k)
    scores = scores * f32(scale) if scale else scores / jnp.sqrt(f32(hd))
    if softcap:
        scores = f32(softcap) * jnp.tanh(scores / f32(softcap))
    slot = jnp.arange(S)[None, None, :]
    visible = slot <= q_pos[:, :, None]  # [B, T, S]
    if window:
        visible = visible & (slot > q_pos[:, :, None] - window)
    visible = jnp.broadcast_to(visible[:, None, None], (B, 1, G, T, S)).reshape(B, 1, G * T, S)
    scores = jnp.where(visible, scores, -jnp.inf)
    if sinks is None:
        probs = jax.nn.softmax(scores, axis=-1)
    else:  # head h = kv head h // G, group member h % G: the [K, G] layout of the stacked rows
        sink = jnp.broadcast_to(sinks.astype(f32).reshape(1, K, G, 1, 1), (1, K, G, T, 1)).reshape(1, K, G * T, 1)
        top = jnp.maximum(jnp.max(scores, axis=-1, keepdims=True), sink)
        e = jnp.exp(scores - top)
        probs = e / (jnp.sum(e, axis=-1, keepdims=True) + jnp.exp(sink - top))
    out = jnp.einsum("bkqs,bksd->bkqd", probs, v)
    dv = v.shape[-1]  # the values' dim (MLA's differs from the keys')
    out = out.reshape(B, K, G, T, dv).transpose(0, 3, 1, 2, 4)  # [B, T, K, G, dv]
    return out.reshape(B, T, H * dv)


# Query rows per block of a fresh prefill's causal attention: block i attends to keys 0..end of block i
# only, so about half the T x T scores are never formed, and each block's scores stay in cache.
PREFILL_QUERY_BLOCK = 256


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array, **options) -> jax.Array:
    """Causal attention of T fresh tokens at positions 0..T-1 among themselves (nothing cached before).

    q [B, T, H, hd]; k, v [B, T, K, hd]; positions [B, T] (= 0..T-1). Returns [B, T, H*hd], the same
    as attention() over a cache holding exactly these keys; queries run in blocks of
    PREFILL_QUERY_BLOCK, each over the keys up to its own last position (the rest are masked anyway).
    options: attention()'s window, scale, softcap and sinks.
    """
    T = q.shape[1]
    kk, vv = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, hd]: the cache layout
    outs = []
    for a in range(0, T, PREFILL_QUERY_BLOCK):
        b = min(a + PREFILL_QUERY_BLOCK, T)
        outs.append(attention(q[:, a:b], kk[:, :, :b], vv[:, :, :b], positions[:, a:b], **options))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def rounded(x: jax.Array, dtype) -> jax.Array:
    """x rounded to dtype (a matmul input in bf16 mode), held as float32."""
    return x.astype(dtype).astype(f32)


def recipe_round(x: jax.Array, dtype: str) -> jax.Array:
    """x rounded to dtype's precision where a declared recipe (engines.base.Recipe) rounds it, kept float32:
    lax.reduce_precision, which XLA cannot fold away as excess precision (an astype pair it may). float32: x."""
    if dtype == "float32":
        return x
    fi = jnp.finfo(jnp.dtype(dtype))
    return jax.lax.reduce_precision(x, exponent_bits=fi.nexp, mantissa_bits=fi.nmant)


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x (float32) @ w: the input rounded to w's dtype, products accumulated in float32."""
    return jnp.matmul(x.astype(w.dtype), w, preferred_element_type=f32)


def situ(g: jax.Array, u: jax.Array) -> jax.Array:
    """Kimi K3's gated activation: 4 tanh(g / 4) * sigmoid(g) * 25 tanh(u / 25) (the sigmoid takes the raw g)."""
    return f32(4.0) * jnp.tanh(g / f32(4.0)) * jax.nn.sigmoid(g) * f32(25.0) * jnp.tanh(u / f32(25.0))


def swiglu(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array, act: str = "silu") -> jax.Array:
    """down(act(x @ gate) * (x @ up)); act "silu" (SwiGLU), "gelu_tanh" (GeGLU, tanh-approximated GELU) or
    "situ" (down(situ(x @ gate, x @ up)))."""
    g, u = matmul(x, gate), matmul(x, up)
    if act == "situ":
        return matmul(situ(g, u), down)
    g = jax.nn.silu(g) if act == "silu" else jax.nn.gelu(g, approximate=True)
    return matmul(g * u, down)


def gptoss_glu(gate: jax.Array, up: jax.Array, alpha: float, limit: float) -> jax.Array:
    """gpt-oss's expert activation: gate clamped above at limit, up to [-limit, limit], then
    gate * sigmoid(alpha * gate) * (up + 1)."""
    gate = jnp.minimum(gate, f32(limit))
    up = jnp.clip(up, -f32(limit), f32(limit))
    return gate * jax.nn.sigmoid(gate * f32(alpha)) * (up + 1.0)


def router_scores(x: jax.Array, router: jax.Array, bias: jax.Array, c: Config) -> tuple[jax.Array, jax.Array]:
    """(weights' scores, choice scores) [..., E]: the top-k of the choice scores are the token's experts."""
    logits = jnp.matmul(x.astype(f32), router.astype(f32))
    if c.router_logit_scale != 1.0:  # Muse: sigmoid(logits * 2^-2.5)
        logits = logits * f32(c.router_logit_scale)
    if c.router == "softmax":
        scores = jax.nn.softmax(logits + bias.astype(f32), axis=-1)
        return scores, scores
    scores = jax.nn.sigmoid(logits)
    return scores, scores + bias.astype(f32)


def routing_margin(x: jax.Array, router: jax.Array, bias: jax.Array, c: Config) -> tuple[jax.Array, jax.Array]:
    """(margin [...], experts [..., k]): the k-th choice score minus the (k+1)-th, how far the token's expert
    set is from changing (a near-tie here lets a few ulps of rounding pick another expert), and the chosen
    experts' ids in ascending order (two runs compare sets by them)."""
    if c.top_k >= c.n_experts:
        return (jnp.full(x.shape[:-1], jnp.inf, f32),
                jnp.broadcast_to(jnp.arange(c.n_experts, dtype=jnp.int32), (*x.shape[:-1], c.n_experts)))
    top, idx = jax.lax.top_k(router_scores(x, router, bias, c)[1], c.top_k + 1)
    return top[..., c.top_k - 1] - top[..., c.top_k], jnp.sort(idx[..., :c.top_k], axis=-1)


def route(x: jax.Array, router: jax.Array, bias: jax.Array, c: Config, idx: jax.Array | None = None) -> jax.Array:
    """Expert weights [..., E], zero outside each token's top-k.

    softmax router: choose and weigh by softmax(logits + bias) (gpt-oss's router has a bias; Qwen's none).
    sigmoid router (DeepSeek-V3): choose by sigmoid(logits) + bias, weigh by sigmoid(logits).
    Then optionally renormalise the k weights to sum 1, and scale by routed_scale.
    idx [..., k]: the experts, forced (a routing replay: another engine's choice), weighed as if chosen.
    """
    scores, choice = router_scores(x, router, bias, c)
    # [..., k]; a forced row of moe.FREE or moe.OTHER: the router's own choice or the other side of its near-tie
    _, idx = jax.lax.top_k(choice, c.top_k) if idx is None else (None, forced_choice(choice, idx, c))
    w = jnp.take_along_axis(scores, idx, axis=-1)
    if c.norm_topk:  # router_eps: Muse's w / (sum + 1e-15)
        w = w / (jnp.sum(w, axis=-1, keepdims=True) + f32(c.router_eps))
    w = w * c.routed_scale
    one_hot = jax.nn.one_hot(idx, c.n_experts, dtype=f32)  # [..., k, E]
    return jnp.einsum("...k,...ke->...e", w, one_hot)


def empty_cache(c: Config, batch: int, slots: int, dtype=None, mla_form: str = "expanded") -> tuple[list, list]:
    """Per layer: zero K and V [batch, K, slots, hd] for an attention layer; for a Gated DeltaNet layer its
    recurrent state instead (the conv's inputs in the K list, the delta-rule memory in the V list: gdn.py); an MLA
    layer in the absorbed form (a declared recipe's) holds one latent "head" (mla.absorbed_dims)."""
    dtype = dtype or f32
    ks, vs = [], []
    for i in range(c.n_layers):
        if c.kind(i) == "gdn":
            conv, S = gdn.empty_state(c, batch, dtype)
        elif c.kind(i) == "kda":
            conv, S = kda.empty_state(c, batch, dtype)
        else:
            H, dk, dv = mla.absorbed_dims(c) if c.kind(i) == "mla" and mla_form == "absorbed" else c.cache_dims(i)
            conv, S = jnp.zeros((batch, H, slots, dk), dtype), jnp.zeros((batch, H, slots, dv), dtype)
        ks.append(conv)
        vs.append(S)
    return ks, vs


def cache_slots_of(c: Config, k_cache: list) -> int:
    """The slots an attention or MLA layer's cache holds (a recurrent layer's state has none)."""
    return k_cache[c.kv_layers[0]].shape[2]


def _attention_layer(h, p: dict, i: int, c: Config, cos_sin, positions, rows, kc, vc, kv_dt, fresh):
    """One attention layer on the normed input h [B, T, D] with the i-th attention layer's weights: its output
    [B, T, D] and the layer's caches with this call's K/V written at their positions."""
    B, T, _ = h.shape
    eps, style = c.rms_eps, c.norm_style
    cos, sin = cos_sin
    q, k, v = matmul(h, p["wq"][i]), matmul(h, p["wk"][i]), matmul(h, p["wv"][i])
    if c.attn_bias:
        q, k, v = q + p["bq"][i], k + p["bk"][i], v + p["bv"][i]
    q = q.reshape(B, T, c.n_heads, c.head_dim)
    k = k.reshape(B, T, c.n_kv_heads, c.head_dim)
    v = v.reshape(B, T, c.n_kv_heads, c.head_dim)
    if c.qk_norm:  # Muse's is parameter-free (qk_norm_weight False)
        q = rms_norm(q, p["q_norm"][i] if c.qk_norm_weight else None, eps, style)
        k = rms_norm(k, p["k_norm"][i] if c.qk_norm_weight else None, eps, style)
    kind = c.kind(c.attn_layers[i])
    if not (c.nope_full and kind == "full"):  # Muse's full layers are NoPE
        q, k = apply_rope(q, cos, sin, c.rope_style), apply_rope(k, cos, sin, c.rope_style)
    k = recipe_round(k, kv_dt)  # what the cache holds is what is attended
    v = recipe_round(v, kv_dt)
    # advanced indices (rows, positions) around a slice: the update is shaped [B, T, K, hd]
    kc = kc.at[rows, :, positions].set(k.astype(kc.dtype))
    vc = vc.at[rows, :, positions].set(v.astype(vc.dtype))
    options = dict(window=c.sliding_window if kind == "sliding" else 0,
                   scale=c.query_scale ** -0.5 if c.query_scale else 0.0, softcap=c.attn_softcap,
                   sinks=p["sinks"][i] if c.attn_sinks else None)
    attn = causal_attention(q, k, v, positions, **options) if fresh else attention(q, kc, vc, positions, **options)
    if c.attn_out_norm:  # Muse: each head's output RMS-normed, no weight
        attn = rms_norm(attn.reshape(B, T, c.n_heads, c.head_dim), None, eps).reshape(B, T, c.q_size)
    if c.attn_out_gate:  # Qwen3-Next, Muse: the output scaled by sigmoid of a per-head gate from the same input
        attn = attn * jax.nn.sigmoid(matmul(h, p["wg"][i]))
    out = matmul(attn, p["wo"][i])
    if c.o_bias:
        out = out + p["bo"][i]
    return out, kc, vc


def _mixer(h, p: dict, c: Config, layer: int, kc, vc, ctx: dict):
    """The layer's token mixer on its normed input h: (output [B, T, D], its K/V cache or recurrent state)."""
    kind, positions, fresh = c.kind(layer), ctx["positions"], ctx["fresh"]
    if kind in ("gdn", "kda"):
        layer_fn, index = (gdn.gdn_layer, c.gdn_layers) if kind == "gdn" else (kda.kda_layer, c.kda_layers)
        return layer_fn(h, p, index.index(layer), c, kc, vc, ctx["lengths"], matmul, rms_norm, f32, ctx["rnd"])
    if kind == "mla":
        def attend(q, k, v, kc, vc, scale):
            return (causal_attention(q, k, v, positions, scale=scale) if fresh
                    else attention(q, kc, vc, positions, scale=scale))

        def rotate(x):
            return apply_rope(x, *ctx["mla_rope"], c.rope_style)

        form = mla.mla_layer_absorbed if ctx["mla_form"] == "absorbed" else mla.mla_layer  # a declared recipe's
        return form(h, p, c.mla_layers.index(layer), c, positions, ctx["rows"], kc, vc,
                    lambda x: recipe_round(x, ctx["kv_dt"]), attend, matmul, rms_norm, rotate, ctx["rnd"])
    return _attention_layer(h, p, c.attn_layers.index(layer), c, ctx["ropes"][kind], positions, ctx["rows"], kc, vc,
                            ctx["kv_dt"], fresh)


def forward(p: dict, c: Config, tokens: jax.Array, positions: jax.Array,
            k_cache: jax.Array, v_cache: jax.Array, want_taps: bool = False,
            logit_index: jax.Array | None = None, fresh: bool = False, recipe=None, lengths=None, experts=None):
    """Run T new tokens per row through every layer, writing their K/V into the cache.

    fresh: the tokens sit at positions 0..T-1 of an empty cache (a prefill from the start), so
    attention reads this call's own keys (causal_attention) instead of all S cache slots.

    tokens, positions [B, T] int32; k_cache, v_cache: lists of L arrays [B, K, S, hd] (one buffer
    per layer, so the in-place cache update never copies the other layers).
    Returns logits [B, T, V] float32 (or [B, V] at logit_index [B] when given: prefill needs only
    each row's last prompt position; [B, S, V] at logit_index [B, S]: the positions that score an
    answer), the updated caches, and taps [L, B, T, D] (the residual stream after each layer, float32)
    when want_taps, else None. With want_taps the last value is the pair
    (taps, routing): routing = (margins [M, B, T], experts [M, B, T, k]), routing_margin at each of the M MoE
    layers (None without MoE). recipe (engines.base.Recipe, bf16 mode): the K/V and residual roundings an engine
    declared (the weights' own dtypes are set where they are placed). lengths [B]: how many of the T tokens are
    real in each row (None: all), where a recurrent (GDN) layer's state must stop; a GDN layer's entries in
    k_cache / v_cache are its state (empty_cache). experts [M, B, T, k]: each MoE layer's experts forced (a
    routing replay), and then routing's margins are forced_gap's gaps.
    """
    B, T = tokens.shape
    k_cache, v_cache = list(k_cache), list(v_cache)
    if recipe is not None and recipe.rounds_at("norm_weights"):
        p = rounding.norm_scales_rounded(p, c)
    x = p["embed"][tokens].astype(f32)  # [B, T, D], the float32 residual stream
    if c.embed_norm:  # Muse: rms(embed[token]), no weight
        x = rms_norm(x, None, c.rms_eps)
    if c.embed_scale:
        x = x * f32(c.hidden ** 0.5)
    ctx = dict(positions=positions, fresh=fresh, rows=jnp.arange(B)[:, None],  # rows: [B, 1] for the cache scatter
               lengths=jnp.full((B,), T, jnp.int32) if lengths is None else lengths,
               kv_dt=recipe.kv_cache if recipe is not None else "float32",
               mla_form=recipe.mla if recipe is not None else "expanded",
               rnd=lambda x, at: recipe_round(x, "bfloat16" if recipe and recipe.rounds_at(at) else "float32"),
               ropes={kind: rope_cos_sin(positions, c.rope_dim, *rope.inv_freq(c, kind))
                      for kind in {c.kind(i) for i in c.attn_layers}},
               mla_rope=rope_cos_sin(positions, c.mla_rope_dim, c.rope_theta) if c.mla_rope else None)
    eps, style = c.rms_eps, c.norm_style
    res_dt = recipe.residual if recipe is not None else "float32"
    if c.attn_res_block:
        stream = residual.AttnRes(x, p, c, lambda r: recipe_round(r, res_dt), f32, ctx["rnd"])
    elif c.residual_gates:
        stream = residual.Gated(x, p, c, rms_norm, lambda r: recipe_round(r, res_dt), f32)
    else:
        stream = residual.Plain(x, p, c, lambda out, w: rms_norm(out, w, eps, style), lambda r: recipe_round(r, res_dt))
    taps, routing = [], []
    for layer in range(c.n_layers):
        h = rms_norm(stream.attn_input(layer), p["attn_norm"][layer], eps, style)
        out, k_cache[layer], v_cache[layer] = _mixer(h, p, c, layer, k_cache[layer], v_cache[layer], ctx)
        stream.add_attn(layer, out)
        h = rms_norm(stream.mlp_input(layer), p["mlp_norm"][layer], eps, style)
        if layer < c.n_dense_layers:
            out = swiglu(h, p["gate"][layer], p["up"][layer], p["down"][layer], c.mlp_act)
        else:
            m = layer - c.n_dense_layers
            forced = None if experts is None else experts[m]
            out = moe(h, p, m, c, forced, ctx["rnd"])
            if want_taps:
                routing.append(routing_margin(h, p["router"][m], p["router_bias"][m], c) if forced is None
                               else moe_forced_gap(h, p["router"][m], p["router_bias"][m], c, forced))
        stream.add_mlp(layer, out)
        if want_taps:
            taps.append(stream.tap().astype(f32))
    x = stream.final()
    if logit_index is not None:  # [B]: one position a row ([B, D]); [B, S]: S positions a row ([B, S, D])
        at = logit_index if logit_index.ndim == 2 else logit_index[:, None]
        x = jnp.take_along_axis(x, at[:, :, None], axis=1)
        x = x if logit_index.ndim == 2 else x[:, 0]
    x = rms_norm(x, p["final_norm"], eps, c.final_norm_style or style)
    head = p["embed"] if c.tie_embeddings else p["lm_head"]
    logits = jnp.einsum("...d,vd->...v", x.astype(head.dtype), head, preferred_element_type=f32)
    if c.logit_scale != 1.0:  # Muse: 20 tanh(raw * 2^-2.5 / 20)
        logits = logits * f32(c.logit_scale)
    if c.final_softcap:
        logits = f32(c.final_softcap) * jnp.tanh(logits / f32(c.final_softcap))
    if not want_taps:
        return logits, k_cache, v_cache, None
    return logits, k_cache, v_cache, (jnp.stack(taps), tuple(jnp.stack(v) for v in zip(*routing)) if routing else None)
