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


def kda_layer(h, p: dict, i: int, c: Config, conv, S, lengths, matmul, rms_norm, f32):
    """One KDA layer on the normed input h [B, T, D] (the i-th KDA layer's weights), from state (conv, S);
    lengths [B] the real tokens of this call. Returns (out [B, T, D], conv, S)."""
    B, T, _ = h.shape
    H, d = c.kda_heads, c.kda_dim
    mixed = jnp.concatenate([matmul(h, p["kda_q"][i]), matmul(h, p["kda_k"][i]), matmul(h, p["kda_v"][i])], -1)
    mixed, conv = gdn.causal_conv(mixed, conv.astype(f32), p["kda_conv"][i].astype(f32), lengths)
    q, k, v = (x.reshape(B, T, H, d) for x in jnp.split(mixed, 3, axis=-1))
    q = gdn.l2norm(q, f32) * f32(d ** -0.5)
    k = gdn.l2norm(k, f32)
    beta = jax.nn.sigmoid(matmul(h, p["kda_b"][i]))
    f = matmul(matmul(h, p["kda_fa"][i]), p["kda_fb"][i]) + p["kda_dt_bias"][i]
    rate = jnp.exp(p["kda_A_log"][i].astype(f32))[:, None]  # [H, 1]: one per head, over its channels
    f = f.reshape(B, T, H, d)
    if c.kda_gate_bound:  # Kimi K3: bounded below by -kda_gate_bound
        g = -f32(c.kda_gate_bound) * jax.nn.sigmoid(rate * f)
    else:
        g = -rate * jax.nn.softplus(f)
    valid = jnp.arange(T)[None, :] < lengths[:, None]
    o, S = gdn.delta_rule(q, k, v, beta, g, S.astype(f32), valid)
    gate = (matmul(matmul(h, p["kda_ga"][i]), p["kda_gb"][i]) if c.kda_out_rank else matmul(h, p["kda_g"][i]))
    gate = gate.reshape(B, T, H, d)
    o = rms_norm(o, p["kda_norm"][i], c.rms_eps) * jax.nn.sigmoid(gate)
    return matmul(o.reshape(B, T, H * d), p["kda_out"][i]), conv, S


def empty_state(c: Config, batch: int, dtype) -> tuple[jax.Array, jax.Array]:
    """A KDA layer's zero state: conv [batch, 3*H*d, taps-1], S [batch, H, d, d]."""
    return (jnp.zeros((batch, 3 * c.kda_heads * c.kda_dim, c.kda_conv - 1), dtype),
            jnp.zeros((batch, c.kda_heads, c.kda_dim, c.kda_dim), dtype))
