"""Kimi Delta Attention (Kimi Linear's and Kimi K3's linear-attention layer): Gated DeltaNet's recurrence with one
decay per key channel, from a low-rank forget gate. Shares gdn.py's conv, L2 norm and delta rule.

Shapes: H heads of d (keys and values alike), C = 3*H*d conv channels (q, k, v, each its own depthwise filters).
The layer's state: conv [B, C, taps-1] (the last raw projections) and S [B, H, d, d] float32.

Per token: q, k, v = x Wq, x Wk, x Wv through the causal conv and SiLU; q and k L2-normalised per head, q scaled by
d^-1/2; beta = sigmoid(x Wb) per head; the log decay per head and channel, from f = x Wfa Wfb + dt_bias:
g = -exp(A_log[h]) * softplus(f) (Kimi Linear) or g = -bound * sigmoid(exp(A_log[h]) * f) (Kimi K3, bound 5); the
delta rule; the output RMSNorm(o) * w (one weight over d, shared by the heads) * sigmoid(x Wga Wgb) (K3: one
full projection, sigmoid(x Wg)), then Wout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from engines.config import Config
from engines.reference import gdn


def kda_layer(h, p: dict, i: int, c: Config, conv, S, lengths, matmul, rms_norm, f32, rnd=gdn.no_rounding):
    """One KDA layer on the normed input h [B, T, D] (the i-th KDA layer's weights), from state (conv, S);
    lengths [B] the real tokens of this call. Returns (out [B, T, D], conv, S). rnd(x, point): a declared
    recipe's rounding at its ROUND_POINTS (engines.recipe), the identity elsewhere."""
    B, T, _ = h.shape
    H, d = c.kda_heads, c.kda_dim
    proj = lambda x, name: rnd(matmul(x, p[name][i]), "projections")  # noqa: E731
    mixed = jnp.concatenate([proj(h, "kda_q"), proj(h, "kda_k"), proj(h, "kda_v")], -1)
    mixed, conv = gdn.causal_conv(mixed, conv.astype(f32), p["kda_conv"][i].astype(f32), lengths)
    mixed = rnd(mixed, "conv")
    q, k, v = (x.reshape(B, T, H, d) for x in jnp.split(mixed, 3, axis=-1))
    q = gdn.l2norm(q, f32) * f32(d ** -0.5)
    k = gdn.l2norm(k, f32)
    beta = rnd(jax.nn.sigmoid(proj(h, "kda_b")), "beta")
    f = proj(matmul(h, p["kda_fa"][i]), "kda_fb") + p["kda_dt_bias"][i]
    rate = jnp.exp(p["kda_A_log"][i].astype(f32))[:, None]  # [H, 1]: one per head, over its channels
    f = f.reshape(B, T, H, d)
    if c.kda_gate_bound:  # Kimi K3: bounded below by -kda_gate_bound
        g = -f32(c.kda_gate_bound) * jax.nn.sigmoid(rate * f)
    else:
        g = -rate * jax.nn.softplus(f)
    valid = jnp.arange(T)[None, :] < lengths[:, None]
    o, S = gdn.delta_rule(q, k, v, beta, g, S.astype(f32), valid)
    gate = proj(matmul(h, p["kda_ga"][i]), "kda_gb") if c.kda_out_rank else proj(h, "kda_g")
    gate = gate.reshape(B, T, H, d)
    o = rnd(rnd(rms_norm(o, p["kda_norm"][i], c.rms_eps), "out_gate") * rnd(jax.nn.sigmoid(gate), "out_gate"),
            "out_gate")
    return matmul(o.reshape(B, T, H * d), p["kda_out"][i]), conv, S


def empty_state(c: Config, batch: int, dtype) -> tuple[jax.Array, jax.Array]:
    """A KDA layer's zero state: conv [batch, 3*H*d, taps-1], S [batch, H, d, d]."""
    return (jnp.zeros((batch, 3 * c.kda_heads * c.kda_dim, c.kda_conv - 1), dtype),
            jnp.zeros((batch, c.kda_heads, c.kda_dim, c.kda_dim), dtype))
