"""Gated DeltaNet (Qwen3-Next / Qwen3.8's linear attention) in the megakernel: the engine's own math for one token a
row, used by the decode kernel on a layer's VMEM buffers and by the XLA prefill's scan (engines/reference/gdn.py is
the independent one the judge runs).

A GDN layer's arrays as the engine places them (spec.gdn_arrays): qkv [D, C] (q | k | v columns fused), z [D, Hv*dv],
ba [D, 2*Hv] (b | a), conv [taps, C] (tap taps-1 the current token), A_log, dt_bias [1, Hv], norm [1, dv] (a plain
weight), out [Hv*dv, D]. Its state, float32: hist [B, taps-1, C] (the last raw projections, oldest first; channels
in lanes) and S [B, Hv, dk, dv].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from engines.config import Config
from engines.megakernel import ops

F32 = jnp.float32
# Inside the sum of squares, as Qwen3-Next's and flash-linear-attention's l2norm put it: the model's constant, not
# a tolerance (the l2_eps_outside fault moves it).
L2_EPS = 1e-6
GDN_KEYS = ("gdn_qkv", "gdn_z", "gdn_ba", "gdn_conv", "gdn_A_log", "gdn_dt_bias", "gdn_norm", "gdn_out")


def l2norm(x: jax.Array, eps_outside: bool = False) -> jax.Array:
    """x / sqrt(sum(x^2) + eps) over the last axis (eps_outside: the fault's x / (sqrt(sum(x^2)) + eps))."""
    ss = jnp.sum(x * x, axis=-1, keepdims=True)
    return x / (jnp.sqrt(ss) + L2_EPS) if eps_outside else x * jax.lax.rsqrt(ss + L2_EPS)


def project(h: jax.Array, w: dict) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The layer's projections of normed inputs h [N, D]: raw q|k|v [N, C], z [N, Hv*dv], b|a [N, 2*Hv]."""
    return ops.mm(h, w["gdn_qkv"]), ops.mm(h, w["gdn_z"]), ops.mm(h, w["gdn_ba"])


def step(c: Config, w: dict, mixed, ba, hist, S, kn):
    """One token a row: mixed [B, C] raw projections, ba [B, 2*Hv], hist [B, taps-1, C], S [B, Hv, dk, dv]
    (float32). Returns o [B, Hv, dv] (before the gated norm), the new hist and the new S. kn: the fault's knobs."""
    B = mixed.shape[0]
    Hk, Hv, dk, dv = c.gdn_k_heads, c.gdn_v_heads, c.gdn_k_dim, c.gdn_v_dim
    win = jnp.concatenate([hist, mixed[:, None, :]], axis=1)  # [B, taps, C]: oldest first, this token last
    act = jax.nn.silu(jnp.sum(win * w["gdn_conv"].astype(F32)[None], axis=1))  # the depthwise causal conv
    new_hist = hist if kn.conv_unshifted else win[:, 1:]
    r = Hv // Hk  # key head j serves value heads j*r .. j*r+r-1

    def heads(x):  # [B, Hk*dk] -> normed, each key head repeated onto its r value heads: [B*Hv, dk]
        x = l2norm(x.reshape(B, Hk, dk), kn.l2_eps_outside)
        return jnp.broadcast_to(x[:, :, None, :], (B, Hk, r, dk)).reshape(B * Hv, dk)

    q = heads(act[:, :Hk * dk]) * F32(dk ** -0.5)
    k = heads(act[:, Hk * dk:2 * Hk * dk])
    v = act[:, 2 * Hk * dk:].reshape(B * Hv, dv)
    beta = jax.nn.sigmoid(ba[:, :Hv]).reshape(B * Hv, 1)
    g = -jnp.exp(w["gdn_A_log"]) * jax.nn.softplus(ba[:, Hv:] + w["gdn_dt_bias"])  # [B, Hv] log decay
    decay = jnp.exp(g).reshape(B * Hv, 1, 1)
    S = S.reshape(B * Hv, dk, dv)
    if kn.decay_after_delta:  # the delta rule reads the undecayed memory, and the decay lands on the update too
        mem = jnp.sum(S * k[:, :, None], axis=1)  # [B*Hv, dv]
        S = (S + k[:, :, None] * (beta * (v - mem))[:, None, :]) * decay
    else:
        S = S * decay
        mem = jnp.sum(S * k[:, :, None], axis=1)
        S = S + k[:, :, None] * (beta * (v - mem))[:, None, :]
    o = jnp.sum(S * q[:, :, None], axis=1)  # [B*Hv, dv]
    return o.reshape(B, Hv, dv), new_hist, S.reshape(B, Hv, dk, dv)


def finish(c: Config, w: dict, o, z, eps: float) -> jax.Array:
    """o [N, Hv, dv], z [N, Hv*dv] -> the layer's output [N, D]: RMSNorm over each head's dv with the plain
    weight, times silu(z), through out."""
    N = o.shape[0]
    o = ops.rmsnorm(o.reshape(N * c.gdn_v_heads, c.gdn_v_dim), w["gdn_norm"], eps).reshape(N, -1)
    return ops.mm(o * jax.nn.silu(z), w["gdn_out"])


def layer(c: Config, w: dict, h, hist, S, kn, eps: float):
    """A decode step's GDN layer on h [B, D]: (out [B, D], hist, S)."""
    mixed, z, ba = project(h, w)
    o, hist, S = step(c, w, mixed, ba, hist, S, kn)
    return finish(c, w, o, z, eps), hist, S


def prefill(c: Config, w: dict, h, hist, S, valid, eps: float):
    """A prefill's GDN layer on h [B, T, D] from state (hist, S) [B, ...]; valid [B, T]: a row's state moves only
    over its real tokens. Returns (out [B, T, D], hist, S). Never faulted (the prefill is XLA, as on a TPU)."""
    from engines.megakernel.faults import Knobs

    B, T, D = h.shape
    mixed, z, ba = project(h.reshape(B * T, D), w)

    def tok(carry, xs):
        hist, S = carry
        m, b, ok = xs
        o, h1, S1 = step(c, w, m, b, hist, S, Knobs())
        return (jnp.where(ok[:, None, None], h1, hist), jnp.where(ok[:, None, None, None], S1, S)), o

    xs = (mixed.reshape(B, T, -1).transpose(1, 0, 2), ba.reshape(B, T, -1).transpose(1, 0, 2), valid.T)
    (hist, S), o = jax.lax.scan(tok, (hist, S), xs)
    out = finish(c, w, o.transpose(1, 0, 2, 3).reshape(B * T, c.gdn_v_heads, c.gdn_v_dim), z, eps)
    return out.reshape(B, T, D), hist, S


def state_shapes(c: Config, batch: int, layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The GDN state stacks the engine keeps in HBM: hist [Lg, B, taps-1, C] and S [Lg, B, Hv, dk, dv]."""
    return ((layers, batch, c.gdn_conv - 1, c.gdn_conv_dim),
            (layers, batch, c.gdn_v_heads, c.gdn_k_dim, c.gdn_v_dim))
