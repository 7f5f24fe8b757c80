"""The megakernel's own math on arrays (used inside the kernel body and by its XLA prefill).

Written separately from engines/reference on purpose: the judge and the judged share the Config
and the weights, never the math. Formulations differ where it is natural: RoPE takes each dimension's
partner by lane rolls and a select (Mosaic's native lane rotate, no strided slices), routing picks
experts by repeated masked max instead of top_k, attention is an online softmax over tiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32


def mm(a: jax.Array, w: jax.Array) -> jax.Array:
    """a @ w with a cast to the weight dtype (bf16 mode feeds bf16 to the MXU), f32 accumulation."""
    return jnp.dot(a.astype(w.dtype), w, preferred_element_type=F32)


def round_to(x: jax.Array, dtype) -> jax.Array:
    """x (float32) rounded to dtype's precision, kept in float32 (a no-op for float32). bfloat16 by integer ops on
    the bits (round to nearest even: add 0x7FFF plus the kept lowest bit, clear the low 16): XLA may fold an astype
    pair away as excess precision, and Mosaic has no lowering for lax.reduce_precision. Finite values only."""
    fi = jnp.finfo(dtype)
    if fi.bits >= 32:
        return x
    if jnp.dtype(dtype) != jnp.bfloat16:
        return jax.lax.reduce_precision(x, exponent_bits=fi.nexp, mantissa_bits=fi.nmant)
    u = jax.lax.bitcast_convert_type(x, jnp.uint32)
    u = (u + jnp.uint32(0x7FFF) + ((u >> 16) & jnp.uint32(1))) & jnp.uint32(0xFFFF0000)
    return jax.lax.bitcast_convert_type(u, jnp.float32)


def rmsnorm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """x [N, D] float32, w [1, D] float32."""
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_tables(style: str, head_dim: int, n_heads: int, theta: float,
                rotary_dim: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """For rotating a row of n_heads heads at once: rot(x) = x*cos(p*f) + partner(x)*sin(p*f), where
    partner(x)[a] = -x[a + shift] on the first dimension of each pair and x[b - shift] on the second.

    Returns first [1, n_heads*hd] (1.0 on each pair's first dimension), f [1, n_heads*hd] (each dimension's
    frequency; 0 on dimensions past rotary_dim, which the rotation then leaves as they are) and shift:
    interleaved: pairs (2i, 2i+1), shift 1; half: pairs (i, i+r/2), shift r/2 (r = rotary_dim or hd);
    frequency theta^(-2i/r). No pair crosses a head, so rolling the whole row never mixes heads.
    """
    r = rotary_dim or head_dim
    half = r // 2
    first = np.zeros(head_dim, np.float32)
    freq = np.zeros(head_dim, np.float64)
    for i in range(half):
        a, b = (2 * i, 2 * i + 1) if style == "interleaved" else (i, i + half)
        first[a] = 1.0
        freq[a] = freq[b] = theta ** (-2.0 * i / r)
    shift = 1 if style == "interleaved" else half
    return np.tile(first, n_heads)[None, :], np.tile(freq, n_heads).astype(np.float32)[None, :], shift


def rope_shift(c) -> int:
    """The distance between a dimension and its rotation partner (static; rope_tables' third value)."""
    return 1 if c.rope_style == "interleaved" else c.rope_dim // 2


def rope(x: jax.Array, pos: jax.Array, first: jax.Array, freq: jax.Array, shift: int, roll=jnp.roll) -> jax.Array:
    """x [N, heads*hd] float32, pos [N, 1] int32. The rotation partner comes from two lane rolls and a select
    (no [H*hd, H*hd] permutation matmul); roll(x, s, axis) is jnp.roll's direction (pltpu.roll in the kernel)."""
    n = x.shape[-1]
    ang = pos.astype(F32) * freq  # [N, heads*hd]
    partner = jnp.where(first > 0, -roll(x, n - shift, 1), roll(x, shift, 1))
    return x * jnp.cos(ang) + partner * jnp.sin(ang)


def swiglu(h: jax.Array, g: jax.Array, u: jax.Array, d: jax.Array, gelu: bool = False) -> jax.Array:
    """gelu: tanh-GELU in place of SiLU (the gelu_mlp fault)."""
    a = mm(h, g)
    act = jax.nn.gelu(a, approximate=True) if gelu else a * jax.nn.sigmoid(a)
    return mm(act * mm(h, u), d)


def pick_experts(logits: jax.Array, bias: jax.Array, *, router: str, top_k: int, norm_topk: bool,
                 scale: float, skip_first: bool = False) -> jax.Array:
    """Dense gate weights [N, E] from router logits [N, E] (zero outside the chosen experts).

    Chosen by repeated masked max (ties: lowest expert index). skip_first drops the best-ranked
    expert and takes ranks 2..k+1 (the router_second_choice fault).
    """
    n, e = logits.shape
    if router == "softmax":
        z = logits - jnp.max(logits, axis=-1, keepdims=True)
        scores = jnp.exp(z) / jnp.sum(jnp.exp(z), axis=-1, keepdims=True)
        choice = scores
    else:
        scores = 1.0 / (1.0 + jnp.exp(-logits))
        choice = scores + bias
    iota = jax.lax.broadcasted_iota(jnp.int32, (n, e), 1)
    chosen = jnp.zeros((n, e), F32)
    remaining = choice
    for rank in range(top_k + int(skip_first)):
        best = jnp.max(remaining, axis=-1, keepdims=True)
        first = jnp.min(jnp.where(remaining == best, iota, e), axis=-1, keepdims=True)
        hit = iota == first
        if not (skip_first and rank == 0):
            chosen = jnp.where(hit, 1.0, chosen)
        remaining = jnp.where(hit, -jnp.inf, remaining)
    w = chosen * scores
    if norm_topk:
        w = w / jnp.sum(w, axis=-1, keepdims=True)
    return w * scale
