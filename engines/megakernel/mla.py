"""Multi-head latent attention in the megakernel (Kimi Linear's and Kimi K3's: no RoPE, the shared k_pe used raw;
DeepSeek-V3's, Config.mla_rope: each head's q_pe and the shared k_pe turned by position): the engine's own
projections for the decode kernel and its XLA prefill, in two forms (spec.MLA_FORMS). engines/reference/mla.py is
the independent one the judge runs.

Per token: q = x Wq (or rms(x Wqa) Wqb); [c | k_pe] = x Wkva; c = rms(c) w (Config.mla_norm_eps); under mla_rope
q_pe and k_pe rotated (the model's RoPE style and base); then
- expanded: per head [k_nope | v] = c Wkvb, each head's key [k_nope | k_pe] and value cached;
- absorbed: the latent and k_pe cached once a token ([c | k_pe], values c), each head's query [q_nope W_uk^T | q_pe]
  (W_uk: the head's key columns of Wkvb), and its output (the softmax's mixture of latents) times W_uv;
attention at scale (n + r)^-1/2 (engines.megakernel.attention); K3: the heads' output times sigmoid(x Wg); then Wo.
The two are equal in exact arithmetic and round differently.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from engines.config import Config
from engines.megakernel import ops


def absorbed_weights(c: Config, kvb, uk_transposed: bool = False):
    """W_uk [.., H, rank, n] and W_uv [.., H, rank, v] from Wkvb [.., rank, H*(n + v)] (each head's [nope | v]
    columns). uk_transposed (the fault mla_uk_transposed): the key columns read dim-major ((n H), not (H n)), so each
    head absorbs a mix of the heads' key columns: a loader's einops order swapped."""
    H, n = c.n_heads, c.mla_nope_dim
    w = kvb.reshape(*kvb.shape[:-1], H, n + c.mla_v_dim)  # [.., rank, H, n + v]
    uk = w[..., :n]
    if uk_transposed:
        uk = uk.reshape(*kvb.shape[:-1], H * n).reshape(*kvb.shape[:-1], n, H).swapaxes(-1, -2)
    return uk.swapaxes(-3, -2), w[..., n:].swapaxes(-3, -2)


def _heads_t(a, w, width: int):
    """Each head's slice a[:, i*width:(i+1)*width] times w[i]^T (w [H, m, width]): [N, H*m], float32."""
    return jnp.concatenate([jax.lax.dot_general(a[:, i * width:(i + 1) * width].astype(w.dtype), w[i],
                                                (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32,
                                                precision=ops.precision(w.dtype)) for i in range(w.shape[0])], -1)


def rotated(x: jax.Array, pos: jax.Array, theta: float, style: str, heads: int = 1, roll=jnp.roll) -> jax.Array:
    """x [N, heads*r]: each head's r dims rotated by position pos [N, 1] (RoPE at base theta; style "half": pairs
    (i, i + r/2), "interleaved": (2i, 2i + 1)). The tables come from an iota (a kernel captures no arrays)."""
    r = x.shape[-1] // heads
    j = jax.lax.rem(jax.lax.broadcasted_iota(jnp.int32, (1, x.shape[-1]), 1), r)  # the dim within its head
    if style == "interleaved":
        pair, first, shift = jax.lax.div(j, 2), jax.lax.rem(j, 2) == 0, 1
    else:
        pair, first, shift = jnp.where(j < r // 2, j, j - r // 2), j < r // 2, r // 2
    freq = jnp.exp(pair.astype(jnp.float32) * jnp.float32(-2.0 * math.log(theta) / r))
    return ops.rope(x, pos, first.astype(jnp.float32), freq, shift, roll)


def project(c: Config, w: dict, h: jax.Array, pos: jax.Array | None = None, roll=jnp.roll,
            pe_switched: bool = False, rounds: tuple[str, ...] = ()) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Normed inputs h [N, D] at positions pos [N, 1] -> q, k, v as the cache holds them: expanded q, k [N, H*(n+r)]
    and v [N, H*v] (head-major); absorbed (w holds mla_uk) q [N, H*(rank + r)], k [N, rank + r] and v [N, rank].
    Under Config.mla_rope q_pe and k_pe turn by pos; else they are used raw, as Kimi does. pe_switched (the fault
    mla_pe_rotated) flips k_pe's switch: Kimi's turned (rotate-half), DeepSeek-V3's left raw. rounds: the recipe's
    points ("mla": each projection's output and the normed latent rounded to bf16)."""
    N, H, n, r, dv, rk = h.shape[0], c.n_heads, c.mla_nope_dim, c.mla_rope_dim, c.mla_v_dim, c.mla_kv_rank
    rd = ops.rounder(rounds)
    if c.mla_q_rank:
        q = rd(ops.mm(ops.rmsnorm(rd(ops.mm(h, w["mla_qa"]), "mla"), w["mla_q_norm"], c.mla_norm_eps), w["mla_qb"]),
               "mla")
    else:
        q = rd(ops.mm(h, w["mla_q"]), "mla")
    ckv = rd(ops.mm(h, w["mla_kva"]), "mla")  # [N, rk + r]: the latent, then the key part every head shares
    if c.mla_rope != pe_switched:
        style = c.rope_style if c.mla_rope else "half"
        ckv = jnp.concatenate([ckv[:, :rk], rotated(ckv[:, rk:], pos, c.rope_theta, style, roll=roll)], -1)
    if c.mla_rope:  # each head's [nope | rope]: the rope parts turned together
        q_pe = rotated(jnp.concatenate([q[:, i * (n + r) + n:(i + 1) * (n + r)] for i in range(H)], -1), pos,
                       c.rope_theta, c.rope_style, H, roll)
        q = jnp.concatenate([x for i in range(H) for x in (q[:, i * (n + r):i * (n + r) + n],
                                                           q_pe[:, i * r:(i + 1) * r])], -1)
    latent = rd(ops.rmsnorm(ckv[:, :rk], w["mla_kv_norm"], c.mla_norm_eps), "mla")
    if "mla_uk" in w:  # absorbed: head i's query [q_nope W_uk[i]^T | q_pe]
        parts = [q[:, i * (n + r):(i + 1) * (n + r)] for i in range(H)]
        q_lat = _heads_t(jnp.concatenate([p[:, :n] for p in parts], -1), w["mla_uk"], n)
        q = jnp.concatenate([x for i in range(H) for x in (q_lat[:, i * rk:(i + 1) * rk], parts[i][:, n:])], -1)
        return q, jnp.concatenate([latent, ckv[:, rk:]], -1), latent
    kv = rd(ops.mm(latent, w["mla_kvb"]), "mla").reshape(N, H, n + dv)
    k = jnp.concatenate([kv[:, :, :n], jnp.broadcast_to(ckv[:, None, rk:], (N, H, r))], axis=-1)
    return q, k.reshape(N, H * (n + r)), kv[:, :, n:].reshape(N, H * dv)


def output(c: Config, w: dict, h: jax.Array, attn: jax.Array, rounds: tuple[str, ...] = ()) -> jax.Array:
    """The heads' outputs attn (expanded [N, H*v]; absorbed [N, H*rank], each head's mixture of latents, times its
    W_uv first) through Wo (K3: gated by sigmoid(h Wg) before it): [N, D]. rounds: the recipe's points ("mla": the
    heads' outputs, the gate's logits and its sigmoid rounded to bf16)."""
    rd = ops.rounder(rounds)
    if "mla_uv" in w:
        rk = c.mla_kv_rank
        attn = jnp.concatenate([ops.mm(attn[:, i * rk:(i + 1) * rk], w["mla_uv"][i]) for i in range(c.n_heads)], -1)
    attn = rd(attn, "mla")
    if c.mla_out_gate:
        attn = attn * rd(jax.nn.sigmoid(rd(ops.mm(h, w["mla_g"]), "mla")), "mla")
    return ops.mm(attn, w["mla_o"])
