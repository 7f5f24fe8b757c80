"""Multi-head latent attention in the megakernel (Kimi Linear's and Kimi K3's: no RoPE, the shared k_pe used raw): the
engine's own projections for the decode kernel and its XLA prefill, in the expanded per-head form (each head's key
[k_nope | k_pe] and value cached). engines/reference/mla.py is the independent one the judge runs.

Per token: q = x Wq (or rms(x Wqa) Wqb); [c | k_pe] = x Wkva; c = rms(c) w (Config.mla_norm_eps); per head
[k_nope | v] = c Wkvb; attention at scale (n + r)^-1/2 (engines.megakernel.attention); K3: the heads' output times
sigmoid(x Wg); then Wo.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from engines.config import Config
from engines.megakernel import ops


def project(c: Config, w: dict, h: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Normed inputs h [N, D] -> q, k [N, H*(n+r)] and v [N, H*v] (head-major, as the cache holds them)."""
    N, H, n, r, dv, rk = h.shape[0], c.n_heads, c.mla_nope_dim, c.mla_rope_dim, c.mla_v_dim, c.mla_kv_rank
    if c.mla_q_rank:
        q = ops.mm(ops.rmsnorm(ops.mm(h, w["mla_qa"]), w["mla_q_norm"], c.mla_norm_eps), w["mla_qb"])
    else:
        q = ops.mm(h, w["mla_q"])
    ckv = ops.mm(h, w["mla_kva"])  # [N, rk + r]: the latent, then the key part every head shares
    latent = ops.rmsnorm(ckv[:, :rk], w["mla_kv_norm"], c.mla_norm_eps)
    kv = ops.mm(latent, w["mla_kvb"]).reshape(N, H, n + dv)
    k = jnp.concatenate([kv[:, :, :n], jnp.broadcast_to(ckv[:, None, rk:], (N, H, r))], axis=-1)
    return q, k.reshape(N, H * (n + r)), kv[:, :, n:].reshape(N, H * dv)


def output(c: Config, w: dict, h: jax.Array, attn: jax.Array) -> jax.Array:
    """The heads' outputs attn [N, H*v] (K3: gated by sigmoid(h Wg)) through Wo: [N, D]."""
    if c.mla_out_gate:
        attn = attn * jax.nn.sigmoid(ops.mm(h, w["mla_g"]))
    return ops.mm(attn, w["mla_o"])
