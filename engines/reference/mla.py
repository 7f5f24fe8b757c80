"""Multi-head latent attention: Kimi's form (Kimi Linear, Kimi K3: no RoPE anywhere, the shared k_pe part of the
compressed KV used raw) and DeepSeek-V3's (Config.mla_rope: q's rope part and k_pe rotated by position). The cache
is the expanded per-head form (each head's key [nope | k_pe] and value), the reference form; the absorbed latent
cache is an engine's optimisation to be measured against it.

Per token: q = x Wq (or rms(x Wqa) Wqb) per head [nope + rope]; [c | k_pe] = x Wkva; c = rms(c) * w (with
Config.mla_norm_eps, not rms_eps); per head [k_nope | v] = c Wkvb; k = [k_nope | k_pe]; softmax(q.k * (nope +
rope)^-1/2) over the positions up to the query's; the heads' outputs (K3: times sigmoid(x Wg)) through Wo.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from engines.config import Config


def score_scale(c: Config) -> float:
    """(nope + rope)^-1/2: the key's true width (K3: 192^-1/2, not a kernel's padded 256)."""
    return (c.mla_nope_dim + c.mla_rope_dim) ** -0.5


def _keep(x, point):
    """No rounding: the recipe of a caller that declares none."""
    return x


def _project(h, p: dict, i: int, c: Config, matmul, rms_norm, rnd=_keep):
    """Both forms' projections: q [B, T, H, nope+rope] (one projection or the normed low-rank pair), the normed
    latent [B, T, rank] and the shared k_pe [B, T, rope], unrotated. rnd(x, "mla"): a declared recipe's rounding of
    each projection's output and of the normed latent."""
    B, T, _ = h.shape
    if c.mla_q_rank:
        qa = rnd(matmul(h, p["mla_qa"][i]), "mla")
        q = rnd(matmul(rms_norm(qa, p["mla_q_norm"][i], c.mla_norm_eps), p["mla_qb"][i]), "mla")
    else:
        q = rnd(matmul(h, p["mla_q"][i]), "mla")
    ckv = rnd(matmul(h, p["mla_kva"][i]), "mla")
    rk = c.mla_kv_rank
    return (q.reshape(B, T, c.n_heads, c.mla_nope_dim + c.mla_rope_dim),
            rnd(rms_norm(ckv[..., :rk], p["mla_kv_norm"][i], c.mla_norm_eps), "mla"), ckv[..., rk:])


def _gated(out, h, p: dict, i: int, c: Config, matmul, rnd):
    """The heads' outputs (rounded where the recipe's "mla" point says), times K3's sigmoid(x Wg)."""
    out = rnd(out, "mla")
    return out * rnd(jax.nn.sigmoid(rnd(matmul(h, p["mla_g"][i]), "mla")), "mla") if c.mla_out_gate else out


def mla_layer(h, p: dict, i: int, c: Config, positions, rows, kc, vc, kv_round, attend, matmul, rms_norm, rotate=None,
              rnd=_keep):
    """One MLA layer on the normed input h [B, T, D] (the i-th MLA layer's weights): its output [B, T, D] and the
    caches (kc [B, H, S, nope+rope], vc [B, H, S, v]) with this call's keys and values written at their positions.
    attend(q, k, v, kc, vc, scale): the reference's attention over this call's keys (fresh) or the cache;
    rotate(x [B, T, heads, rope]): RoPE at this call's positions (Config.mla_rope); rnd(x, "mla"): a declared
    recipe's roundings (engines.recipe.ROUND_POINTS)."""
    B, T, _ = h.shape
    H, n, r, dv = c.n_heads, c.mla_nope_dim, c.mla_rope_dim, c.mla_v_dim
    q, latent, k_pe = _project(h, p, i, c, matmul, rms_norm, rnd)
    if c.mla_rope:
        q = jnp.concatenate([q[..., :n], rotate(q[..., n:])], axis=-1)
        k_pe = rotate(k_pe[:, :, None, :])[:, :, 0]
    kv = rnd(matmul(latent, p["mla_kvb"][i]), "mla").reshape(B, T, H, n + dv)
    k = jnp.concatenate([kv[..., :n], jnp.broadcast_to(k_pe[:, :, None, :], (B, T, H, r))], axis=-1)
    k, v = kv_round(k), kv_round(kv[..., n:])
    kc = kc.at[rows, :, positions].set(k.astype(kc.dtype))
    vc = vc.at[rows, :, positions].set(v.astype(vc.dtype))
    out = attend(q, k, v, kc, vc, score_scale(c))
    return matmul(_gated(out, h, p, i, c, matmul, rnd), p["mla_o"][i]), kc, vc


def absorbed_dims(c: Config) -> tuple[int, int, int]:
    """The absorbed form's cache: one "head" every query head reads, keys [latent | k_pe], values the latent."""
    return 1, c.mla_kv_rank + c.mla_rope_dim, c.mla_kv_rank


def _absorbed_query(h, p: dict, i: int, c: Config, matmul, rms_norm, rotate, rounded, precision, rnd=_keep):
    """Both absorbed forms' start: each head's q_nope W_uk^T [B, T, H, rank] (q_nope through `rounded` first, W_uk in
    its result's dtype), q_pe, the normed latent, k_pe (both rotated under Config.mla_rope) and W_kvb per head
    [rank, H, nope + v]."""
    n, rk = c.mla_nope_dim, c.mla_kv_rank
    q, latent, k_pe = _project(h, p, i, c, matmul, rms_norm, rnd)
    q_nope, q_pe = q[..., :n], q[..., n:]
    if c.mla_rope:
        q_pe, k_pe = rotate(q_pe), rotate(k_pe[:, :, None, :])[:, :, 0]
    w = p["mla_kvb"][i].reshape(rk, c.n_heads, n + c.mla_v_dim)
    rq = rounded(q_nope, w)
    q_lat = jnp.einsum("bthn,rhn->bthr", rq, w[..., :n].astype(rq.dtype), precision=precision)
    return q_lat, q_pe, latent, k_pe, w


def _absorbed_out(ctx, w, h, p: dict, i: int, c: Config, matmul, rounded, precision, rnd=_keep):
    """Both absorbed forms' end: each head's mixture of latents [B, T, H, rank] (through `rounded`) through W_uv (in
    its dtype), the K3 gate, Wo: [B, T, D]."""
    B, T = ctx.shape[:2]
    rc = rounded(ctx, w)
    out = jnp.einsum("bthr,rhv->bthv", rc, w[..., c.mla_nope_dim:].astype(rc.dtype),
                     precision=precision).reshape(B, T, c.n_heads * c.mla_v_dim)
    return matmul(_gated(out, h, p, i, c, matmul, rnd), p["mla_o"][i])


def _for_weights(x, w):
    """x rounded to the weights' dtype, then float32: what an absorbed bf16 decode kernel feeds its matmuls."""
    return x.astype(w.dtype).astype(jnp.float32)


def mla_layer_absorbed(h, p: dict, i: int, c: Config, positions, rows, kc, vc, kv_round, attend, matmul, rms_norm,
                       rotate=None, rnd=_keep):
    """mla_layer over the absorbed form's cache (absorbed_dims), rounding where that form's decode kernels do: the
    bf16 recipe of an engine that declares it (engines.base.Recipe.mla). Each head's query is [q_nope W_uk^T |
    q_pe] (q_nope rounded for W_uk), attention is grouped over the one latent head, and each head's mixture of
    latents is rounded for its W_uv; in float32 it is mla_layer in another order. Same returns as mla_layer."""
    B, T, _ = h.shape
    hi = jax.lax.Precision.HIGHEST
    q_lat, q_pe, latent, k_pe, w = _absorbed_query(h, p, i, c, matmul, rms_norm, rotate, _for_weights, hi, rnd)
    k = kv_round(jnp.concatenate([latent, k_pe], axis=-1))[:, :, None, :]  # [B, T, 1, rank + rope]
    v = kv_round(latent)[:, :, None, :]
    kc = kc.at[rows, :, positions].set(k.astype(kc.dtype))
    vc = vc.at[rows, :, positions].set(v.astype(vc.dtype))
    ctx = attend(jnp.concatenate([q_lat, q_pe], axis=-1), k, v, kc, vc, score_scale(c))
    return _absorbed_out(ctx.reshape(B, T, c.n_heads, c.mla_kv_rank), w, h, p, i, c, matmul, _for_weights, hi,
                         rnd), kc, vc


def mla_absorbed(h, p: dict, i: int, c: Config, positions, matmul, rms_norm, rotate=None):
    """The same layer in the absorbed form, over this call's T tokens from position 0 (a fresh prefill): what an
    engine caches is the normed latent and k_pe ([B, T, rank + rope], one per token, not per head), the key's
    up-projection folded into the query (q_nope W_uk^T) and the value's applied after the softmax (W_uv). Equal to
    mla_layer in exact arithmetic; its rounding differs (no expanded K/V is ever formed), which
    tests/engines/reference/test_kimi.py measures. Returns [B, T, D]."""
    def same(x, w):  # nothing rounded: the weights go to the activations' dtype
        return x

    q_lat, q_pe, latent, k_pe, w = _absorbed_query(h, p, i, c, matmul, rms_norm, rotate, same, None)
    scores = (jnp.einsum("bthr,bsr->bhts", q_lat, latent) + jnp.einsum("bthp,bsp->bhts", q_pe, k_pe)) * score_scale(c)
    visible = positions[:, None, None, :] <= positions[:, None, :, None]  # [B, 1, T, S]: s <= t
    probs = jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1)
    ctx = jnp.einsum("bhts,bsr->bthr", probs, latent)
    return _absorbed_out(ctx, w, h, p, i, c, matmul, same, None)
