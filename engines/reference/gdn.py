"""Gated DeltaNet (Qwen3-Next / Qwen3.8's linear-attention layer), written to be read: one token at a time.

Shapes: B rows, T tokens this call, D hidden, Hk key/query heads of dk, Hv value heads of dv (each key head
serves Hv/Hk consecutive value heads), C = 2*Hk*dk + Hv*dv conv channels (q, k, v in that order), taps the
conv's width. The layer's state replaces a KV cache:

    conv  [B, C, taps-1]   the last taps-1 raw (pre-conv) q|k|v projections, oldest first
    S     [B, Hv, dk, dv]  the delta-rule memory, float32

Per token: qkv = x Wq|Wk|Wv; a depthwise causal conv over the last `taps` of them, then SiLU; q and k
L2-normalised per head (eps inside the sum), q scaled by dk^-1/2; beta = sigmoid(x Wb), one decay per value head
g = -exp(A_log) * softplus(x Wa + dt_bias); then S <- exp(g) S; S <- S + k (x) beta (v - k^T S); o = q^T S; the
output is RMSNorm(o) * w (a plain weight) * silu(x Wz), then Wout. A row's state advances only over its first
`lengths` tokens (a right-padded prefill leaves it where the prompt ends). The state einsums run at HIGHEST
precision: a TPU's default float32 matmul is reduced, and the state is carried across the whole answer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from engines.config import Config

HIGHEST = jax.lax.Precision.HIGHEST
L2_EPS = 1e-6  # inside the sum of squares, as Qwen3-Next's and flash-linear-attention's l2norm put it


def l2norm(x: jax.Array, f32) -> jax.Array:
    """x / sqrt(sum(x^2) + L2_EPS) over the last axis."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + f32(L2_EPS))


def causal_conv(mixed: jax.Array, conv: jax.Array, w: jax.Array, lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
    """mixed [B, T, C] this call's raw projections, conv [B, C, taps-1] the ones before, w [C, taps] -> SiLU of
    the depthwise causal conv [B, T, C] (tap taps-1 multiplies the current token) and the new conv state: the
    taps-1 raw inputs ending at each row's lengths-th token."""
    taps = w.shape[1]
    T = mixed.shape[1]
    hist = jnp.concatenate([conv.transpose(0, 2, 1), mixed], axis=1)  # [B, taps-1+T, C]
    out = sum(hist[:, j:j + T] * w[:, j] for j in range(taps))
    idx = lengths[:, None] + jnp.arange(taps - 1)[None, :]  # [B, taps-1]: the window ending at the last valid token
    new = jnp.take_along_axis(hist, idx[:, :, None], axis=1).transpose(0, 2, 1)
    return jax.nn.silu(out), new


def expand_heads(x: jax.Array, r: int) -> jax.Array:
    """[B, T, Hk, d] -> [B, T, Hk*r, d]: key head j serves value heads j*r .. j*r+r-1 (consecutive, not tiled)."""
    return jnp.repeat(x, r, axis=2)


def no_rounding(x: jax.Array, point: str) -> jax.Array:
    """A recipe's rounding at a linear-attention point (engines.recipe.ROUND_POINTS) where it rounds none."""
    return x


def gated_norm(o: jax.Array, w: jax.Array, z: jax.Array, eps: float, rms_norm, rnd=no_rounding) -> jax.Array:
    """RMSNorm of o over each value head's dims with a plain weight w (not 1 + w, whatever the model's other
    norms do), times silu(z); rnd(x, "out_gate") where a declared recipe rounds the normed value, the gate and
    their product."""
    return rnd(rnd(rms_norm(o, w, eps), "out_gate") * rnd(jax.nn.silu(z), "out_gate"), "out_gate")


def delta_rule(q, k, v, beta, g, S, valid):
    """The recurrence over T tokens. q, k [B, T, Hv, dk]; v [B, T, Hv, dv]; beta [B, T, Hv]; g, the log decay,
    [B, T, Hv] (one per head: GDN) or [B, T, Hv, dk] (one per key channel: KDA); S [B, Hv, dk, dv]; valid [B, T]
    (False: the row's state does not move). Returns o [B, T, Hv, dv] and the final S."""
    def step(S, xs):
        q_t, k_t, v_t, b_t, g_t, ok = xs
        decay = jnp.exp(g_t)
        S1 = S * (decay[:, :, None, None] if decay.ndim == 2 else decay[..., None])
        mem = jnp.einsum("bhkv,bhk->bhv", S1, k_t, precision=HIGHEST)
        S1 = S1 + jnp.einsum("bhk,bhv->bhkv", k_t, (v_t - mem) * b_t[:, :, None], precision=HIGHEST)
        o_t = jnp.einsum("bhkv,bhk->bhv", S1, q_t, precision=HIGHEST)
        return jnp.where(ok[:, None, None, None], S1, S), o_t

    xs = tuple(jnp.moveaxis(a, 1, 0) for a in (q, k, v, beta, g, valid))
    S, o = jax.lax.scan(step, S, xs)
    return jnp.moveaxis(o, 0, 1), S


def gdn_layer(h, p: dict, i: int, c: Config, conv, S, lengths, matmul, rms_norm, f32, rnd=no_rounding):
    """One GDN layer on the normed input h [B, T, D] (the i-th GDN layer's weights), from state (conv, S).
    lengths [B]: the tokens of this call that are real (the rest is padding). Returns (out [B, T, D], conv, S).
    matmul, rms_norm and f32 are the reference's own (engines.reference.model), so bf16 mode rounds the same
    matmul inputs and float64_math reaches this layer too. rnd(x, point): a declared recipe's rounding at its
    ROUND_POINTS (engines.recipe), the identity elsewhere."""
    B, T, _ = h.shape
    Hk, Hv, dk, dv = c.gdn_k_heads, c.gdn_v_heads, c.gdn_k_dim, c.gdn_v_dim
    proj = lambda name: rnd(matmul(h, p[name][i]), "projections")  # noqa: E731
    mixed = jnp.concatenate([proj("gdn_q"), proj("gdn_k"), proj("gdn_v")], -1)
    mixed, conv = causal_conv(mixed, conv.astype(f32), p["gdn_conv"][i].astype(f32), lengths)
    mixed = rnd(mixed, "conv")
    q, k, v = jnp.split(mixed, [Hk * dk, 2 * Hk * dk], axis=-1)
    r = Hv // Hk  # value heads per key head: key head j serves value heads j*r .. j*r+r-1
    q = expand_heads(l2norm(q.reshape(B, T, Hk, dk), f32) * f32(dk ** -0.5), r)
    k = expand_heads(l2norm(k.reshape(B, T, Hk, dk), f32), r)
    v = v.reshape(B, T, Hv, dv)
    beta = rnd(jax.nn.sigmoid(proj("gdn_b")), "beta")
    g = -jnp.exp(p["gdn_A_log"][i].astype(f32)) * jax.nn.softplus(proj("gdn_a") + p["gdn_dt_bias"][i])
    valid = jnp.arange(T)[None, :] < lengths[:, None]
    o, S = delta_rule(q, k, v, beta, g, S.astype(f32), valid)
    o = gated_norm(o, p["gdn_norm"][i], proj("gdn_z").reshape(B, T, Hv, dv), c.rms_eps, rms_norm, rnd)
    return matmul(o.reshape(B, T, Hv * dv), p["gdn_out"][i]), conv, S


def empty_state(c: Config, batch: int, dtype) -> tuple[jax.Array, jax.Array]:
    """A GDN layer's zero state: conv [batch, C, taps-1], S [batch, Hv, dk, dv]."""
    return (jnp.zeros((batch, c.gdn_conv_dim, c.gdn_conv - 1), dtype),
            jnp.zeros((batch, c.gdn_v_heads, c.gdn_k_dim, c.gdn_v_dim), dtype))
