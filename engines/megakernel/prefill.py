"""The megakernel engine's prefill, in XLA (as on TPU: the fused kernel is for decode).

It writes the KV cache in the kernel's layout [L, B, K, S, hd] (float32, or bfloat16 in that KV mode, K/V rounded
to it before they are attended) so decode continues from
any prompt. Its math is engines.megakernel.ops, not the reference's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from engines.config import Config
from engines.megakernel import mxfp4, ops
from engines.megakernel.spec import expert_keys, unchunked

F32 = jnp.float32


def _attend(c: Config, q, k, v, visible, scale: float, sink):
    """Softmax attention of q [B, T, H, hd] over k, v [B, S, K, hd] where visible [T, S]; scores scaled, then
    soft-capped (Gemma 2) before the mask; sink [1, H, 1, 1]: gpt-oss's per-head logit in the denominator only."""
    G = c.n_heads // c.n_kv_heads
    kr, vr = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)  # head h reads kv head h // G
    sc = ops.softcap(jnp.einsum("bqhd,bkhd->bhqk", q, kr, preferred_element_type=F32) * scale, c.attn_softcap)
    sc = jnp.where(visible, sc, -jnp.inf)
    top = jnp.max(sc, axis=-1, keepdims=True)
    if sink is not None:
        top = jnp.maximum(top, sink)
    pr = jnp.exp(sc - top)
    pr = pr / (jnp.sum(pr, axis=-1, keepdims=True) + (jnp.exp(sink - top) if sink is not None else 0.0))
    return jnp.einsum("bhqk,bkhd->bqhd", pr, vr, preferred_element_type=F32)


def prefill_hidden(c: Config, hbm: dict, embed: jax.Array, rope: dict, tokens: jax.Array, slots: int,
                   want_taps: bool = False, prefix: tuple[jax.Array, jax.Array] | None = None,
                   kv_dtype: str = "float32"):
    """tokens [B, T] (right-padded; padding never reaches a real position). Returns the residual
    stream after the last layer [B, T, D] float32, k_cache, v_cache [L, B, K, slots, hd] and taps
    [L, B, T, D] (or None).

    prefix: (k, v) [L, 1, K, P, hd], a prompt prefix every row shares, already prefilled: tokens are then
    the rows' own suffixes at positions P.., attending to the prefix's keys and their own (causally),
    and the cache holds prefix then suffix."""
    B, T = tokens.shape
    D, H, K, hd, L = c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.n_layers
    Ld = c.n_dense_layers
    shift = ops.rope_shift(c)
    P = 0 if prefix is None else prefix[0].shape[3]
    x = embed[tokens].astype(F32).reshape(B * T, D) * ops.embed_scale(c)
    pos = P + jnp.tile(jnp.arange(T, dtype=jnp.int32), B)[:, None]  # [B*T, 1]
    kv = jnp.dtype(kv_dtype)  # the cache's storage; K/V are rounded to it before they are attended
    kc = jnp.zeros((L, B, K, slots, hd), kv)
    vc = jnp.zeros((L, B, K, slots, hd), kv)
    if prefix is not None:
        kc = kc.at[:, :, :, :P].set(jnp.broadcast_to(prefix[0], (L, B, K, P, hd)))
        vc = vc.at[:, :, :, :P].set(jnp.broadcast_to(prefix[1], (L, B, K, P, hd)))
    qpos, kpos = P + jnp.arange(T)[:, None], jnp.arange(P + T)[None, :]
    causal = qpos >= kpos  # [Tq, P + Tk]: every prefix key, own causally
    local = causal & (kpos > qpos - c.sliding_window)  # a sliding layer's window
    gelu = c.mlp_act == "gelu_tanh"
    experts = "mxfp4" if "e_gate_q" in hbm else "dense"  # the routed experts' storage (engines.megakernel.mxfp4)
    post = (lambda y, key, l: ops.rmsnorm(y, hbm[key][l], c.rms_eps)) if c.post_norms else (lambda y, key, l: y)
    taps = []
    for l in range(L):
        sliding = c.kind(l) == "sliding"
        row = 1 if sliding else 0  # the layer kind's RoPE frequencies and score factor
        scale = ((c.query_scale or hd) ** -0.5) * ops.rope_freqs(c, c.kind(l))[1]
        h = ops.rmsnorm(x, hbm["attn_norm"][l], c.rms_eps)
        q, k, v = ops.mm(h, hbm["wq"][l]), ops.mm(h, hbm["wk"][l]), ops.mm(h, hbm["wv"][l])
        if c.attn_bias:
            q, k, v = q + hbm["bq"][l], k + hbm["bk"][l], v + hbm["bv"][l]
        if c.qk_norm:
            q = ops.rmsnorm(q.reshape(-1, hd), hbm["q_norm"][l], c.rms_eps).reshape(B * T, H * hd)
            k = ops.rmsnorm(k.reshape(-1, hd), hbm["k_norm"][l], c.rms_eps).reshape(B * T, K * hd)
        q = ops.rope(q, pos, rope["first_q"], rope["freq_q"][row:row + 1], shift).reshape(B, T, H, hd)
        k = ops.rope(k, pos, rope["first_k"], rope["freq_k"][row:row + 1], shift).reshape(B, T, K, hd)
        k, v = ops.round_to(k, kv), ops.round_to(v.reshape(B, T, K, hd), kv)
        kc = kc.at[l, :, :, P:P + T].set(k.transpose(0, 2, 1, 3).astype(kv))
        vc = vc.at[l, :, :, P:P + T].set(v.transpose(0, 2, 1, 3).astype(kv))
        if prefix is not None:  # keys and values of the prefix, then the rows' own: [B, P + T, K, hd]
            pk, pv = (prefix[j][l].transpose(0, 2, 1, 3).astype(F32) for j in (0, 1))
            k = jnp.concatenate([jnp.broadcast_to(pk, (B, P, K, hd)), k], axis=1)
            v = jnp.concatenate([jnp.broadcast_to(pv, (B, P, K, hd)), v], axis=1)
        sink = hbm["sinks"][l].reshape(1, H, 1, 1) if c.attn_sinks else None
        o = _attend(c, q, k, v, local if sliding else causal, scale, sink).reshape(B * T, H * hd)
        o = ops.mm(o, hbm["wo"][l])
        x = x + post(o + hbm["bo"][l] if c.o_bias else o, "post_attn_norm", l)
        h = ops.rmsnorm(x, hbm["mlp_norm"][l], c.rms_eps)
        if l < Ld:
            x = x + post(ops.swiglu(h, *[unchunked(hbm[k][l], k) for k in ("gate", "up", "down")], gelu=gelu),
                         "post_mlp_norm", l)
        else:
            m = l - Ld
            gates = ops.pick_experts(jnp.dot(h, hbm["router"][m], preferred_element_type=F32),
                                     hbm["router_bias"][m], router=c.router, top_k=c.top_k,
                                     norm_topk=c.norm_topk, scale=c.routed_scale)
            y = jnp.zeros_like(x)
            for e in range(c.n_experts):
                ex = mxfp4.dense_expert({k: hbm[k][m, e] for k in expert_keys(c, experts)}, hbm["wq"].dtype)
                y = y + gates[:, e:e + 1] * ops.expert(h, ex, c.expert_act, c.swiglu_alpha, c.swiglu_limit)
            if c.n_shared_experts:
                y = y + ops.swiglu(h, hbm["s_gate"][m], hbm["s_up"][m], hbm["s_down"][m])
            x = x + post(y, "post_mlp_norm", l)
        if want_taps:
            taps.append(x.reshape(B, T, D))
    return x.reshape(B, T, D), kc, vc, (jnp.stack(taps) if want_taps else None)
