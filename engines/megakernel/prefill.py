"""The megakernel engine's prefill, in XLA (as on TPU: the fused kernel is for decode).

It writes the KV cache in the kernel's layout [La, B, K, S, hd] (float32, or bfloat16 in that KV mode, K/V rounded
to it before they are attended) so decode continues from
any prompt. Its math is engines.megakernel.ops, not the reference's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from engines.config import Config
from engines.megakernel import mla, moe, mxfp4, ops, recurrent
from engines.megakernel.spec import cache_dims, cache_shapes, expert_keys, mla_keys, mode_dtype, unchunked
from engines.recipe import FLOAT32, Recipe

F32 = jnp.float32


def _attend(c: Config, q, k, v, visible, scale: float, sink):
    """Softmax attention of q [B, T, H, hd] over k, v [B, S, K, hd] where visible [T, S]; scores scaled, then
    soft-capped (Gemma 2) before the mask; sink [1, H, 1, 1]: gpt-oss's per-head logit in the denominator only."""
    G = q.shape[2] // k.shape[2]
    kr, vr = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)  # head h reads kv head h // G
    sc = jnp.einsum("bqhd,bkhd->bhqk", q, kr, preferred_element_type=F32, precision=ops.precision(F32))
    sc = ops.softcap(sc * scale, c.attn_softcap)
    sc = jnp.where(visible, sc, -jnp.inf)
    top = jnp.max(sc, axis=-1, keepdims=True)
    if sink is not None:
        top = jnp.maximum(top, sink)
    pr = jnp.exp(sc - top)
    pr = pr / (jnp.sum(pr, axis=-1, keepdims=True) + (jnp.exp(sink - top) if sink is not None else 0.0))
    return jnp.einsum("bhqk,bkhd->bqhd", pr, vr, preferred_element_type=F32, precision=ops.precision(F32))


def prefill_hidden(c: Config, hbm: dict, embed: jax.Array, rope: dict, tokens: jax.Array, slots: int,
                   want_taps: bool = False, prefix: tuple | None = None, lengths: jax.Array | None = None,
                   routes: list | None = None, numerics: Recipe = FLOAT32):
    """tokens [B, T] (right-padded; padding never reaches a real position, nor a GDN layer's state: lengths [B],
    the real tokens, None = all). Returns the residual stream after the last layer [B, T, D] float32, the state
    (k_cache, v_cache [Lkv, B, heads, slots, width]: spec.cache_shapes; with linear-attention layers their hist and S
    stacks: engines.megakernel.recurrent)
    and taps [L, B, T, D] (or None).

    prefix: a state of batch 1 (P slots), a prompt prefix every row shares, already prefilled: tokens are then
    the rows' own suffixes at positions P.., attending to the prefix's keys and their own (causally), the
    GDN layers continuing from its state, and the cache holds prefix then suffix. routes: a list each MoE layer's
    gates [B*T, E] are appended to (nonzero: the experts chosen), for a routing replay. numerics: where it rounds
    (the KV cache's storage, the stream after each add, the rounding points: the engine's declared recipe)."""
    B, T = tokens.shape
    D, H, hd, L = c.hidden, c.n_heads, c.head_dim, c.n_layers
    Kc, dkc, dvc = cache_dims(c, form := "absorbed" if "mla_uk" in hbm else "expanded")  # an MLA model's form
    P = 0 if prefix is None else prefix[0].shape[3]
    valid = jnp.arange(T)[None, :] < (jnp.full((B,), T) if lengths is None else lengths)[:, None]
    # each recurrent layer's (hist, S) stacks by kind: zeros, or the prefix's
    rec = [jnp.zeros(s, F32) if prefix is None else jnp.broadcast_to(prefix[2 + j], s)
           for j, s in enumerate(recurrent.state(c, B))]
    x = ops.embedded(c, embed, tokens.reshape(-1))
    pos = P + jnp.tile(jnp.arange(T, dtype=jnp.int32), B)[:, None]  # [B*T, 1]
    kv, rounds = jnp.dtype(numerics.kv_cache), numerics.rounds  # K/V are rounded to the cache's storage, then attended
    kc, vc = (jnp.zeros(s, kv) for s in cache_shapes(c, B, slots, form))
    if prefix is not None:
        kc = kc.at[:, :, :, :P].set(jnp.broadcast_to(prefix[0], (*kc.shape[:3], P, dkc)))
        vc = vc.at[:, :, :, :P].set(jnp.broadcast_to(prefix[1], (*vc.shape[:3], P, dvc)))
    qpos, kpos = P + jnp.arange(T)[:, None], jnp.arange(P + T)[None, :]
    causal = qpos >= kpos  # [Tq, P + Tk]: every prefix key, own causally
    local = causal & (kpos > qpos - c.sliding_window)  # a sliding layer's window
    gelu = c.mlp_act == "gelu_tanh"
    experts = "mxfp4" if "e_gate_q" in hbm else "dense"  # the routed experts' storage (engines.megakernel.mxfp4)
    def add(x, y, branch, l):  # the residual update (Gemma's post-norms, Muse's gates: ops.residual), as declared
        return ops.round_to(ops.residual(c, x, y, branch, lambda key: hbm[key][l], c.rms_eps),
                           jnp.dtype(numerics.residual))
    taps, blocks, ares = [], [], c.attn_res_block  # K3: the depth mixture's finished blocks
    for l in range(L):
        xin = ops.depth_mix(hbm["res_attn"][l], blocks, (l - 1) // ares + 1, x, c.rms_eps,
                            "attn_res" in rounds) if ares else x
        h = ops.rmsnorm(xin, hbm["attn_norm"][l], c.rms_eps)
        if ares and l % ares == 0:  # a group starts: the prefix so far becomes a block, and restarts at zero
            blocks, x = blocks + [x], jnp.zeros_like(x)
        if c.kind(l) in recurrent.RECURRENT_KINDS:
            kind, r = c.kind(l), 2 * recurrent.kinds(c).index(c.kind(l))
            g = sum(c.kind(j) == kind for j in range(l))  # the layer's index in its kind's stacks
            out, hg, sg = recurrent.prefill(c, kind, {k: hbm[k][g] for k in recurrent.keys(c, kind)},
                                            h.reshape(B, T, D), rec[r][g], rec[r + 1][g], valid, c.rms_eps,
                                            rounds)
            rec[r], rec[r + 1] = rec[r].at[g].set(hg), rec[r + 1].at[g].set(sg)
            x = _mlp(c, hbm, add(x, out.reshape(B * T, D), "attn", l), l, experts, add, gelu, blocks, routes, rounds)
            taps.append(x.reshape(B, T, D))
            continue
        sliding, a = c.kind(l) == "sliding", c.kv_layers.index(l)  # a: the layer's index in the KV cache
        if c.kind(l) == "mla":  # the cache's form; absorbed: W_uk, W_uv from W_kvb here (the kernel's are its own)
            xw = {key: hbm[key][a] for key in mla_keys(c)}
            xw |= dict(zip(("mla_uk", "mla_uv"), mla.absorbed_weights(c, xw["mla_kvb"]))) if form == "absorbed" else {}
            q, k, v = mla.project(c, xw, h, pos, rounds=rounds)
            q, k, v = q.reshape(B, T, H, dkc), k.reshape(B, T, Kc, dkc), v.reshape(B, T, Kc, dvc)
            scale, sink = (c.mla_nope_dim + c.mla_rope_dim) ** -0.5, None
        else:
            q, k, v = _qkv(c, hbm, rope, h, pos, a, sliding, B, T)
            scale = ((c.query_scale or hd) ** -0.5) * ops.rope_freqs(c, c.kind(l))[1]
            sink = hbm["sinks"][a].reshape(1, H, 1, 1) if c.attn_sinks else None
        k, v = ops.round_to(k, kv), ops.round_to(v, kv)
        kc = kc.at[a, :, :, P:P + T].set(k.transpose(0, 2, 1, 3).astype(kv))
        vc = vc.at[a, :, :, P:P + T].set(v.transpose(0, 2, 1, 3).astype(kv))
        if prefix is not None:  # keys and values of the prefix, then the rows' own: [B, P + T, heads, width]
            pk, pv = (prefix[j][a].transpose(0, 2, 1, 3).astype(F32) for j in (0, 1))
            k = jnp.concatenate([jnp.broadcast_to(pk, (B, P, *pk.shape[2:])), k], axis=1)
            v = jnp.concatenate([jnp.broadcast_to(pv, (B, P, *pv.shape[2:])), v], axis=1)
        o = _attend(c, q, k, v, local if sliding else causal, scale, sink).reshape(B * T, -1)
        o = mla.output(c, xw, h, o, rounds) if c.kind(l) == "mla" else _attn_output(c, hbm, h, o, a)
        x = _mlp(c, hbm, add(x, o, "attn", l), l, experts, add, gelu, blocks, routes, rounds)
        taps.append(x.reshape(B, T, D))
    state = (kc, vc, *rec)
    if ares:  # the final norm reads the depth mixture over every block and the prefix
        x = ops.depth_mix(hbm["res_out"], blocks, len(blocks), x, c.rms_eps, "attn_res" in rounds)
    return x.reshape(B, T, D), state, (jnp.stack(taps) if want_taps else None)


def _qkv(c: Config, hbm: dict, rope: dict, h, pos, a: int, sliding: bool, B: int, T: int):
    """Attention layer a's q [B, T, H, hd] and k, v [B, T, K, hd] of normed inputs h [B*T, D] at positions pos."""
    H, K, hd, row = c.n_heads, c.n_kv_heads, c.head_dim, 1 if sliding else 0  # row: the kind's RoPE frequencies
    q, k, v = ops.mm(h, hbm["wq"][a]), ops.mm(h, hbm["wk"][a]), ops.mm(h, hbm["wv"][a])
    if c.attn_bias:
        q, k, v = q + hbm["bq"][a], k + hbm["bk"][a], v + hbm["bv"][a]
    if c.qk_norm:  # Muse's without a weight
        wq, wk = (hbm["q_norm"][a], hbm["k_norm"][a]) if c.qk_norm_weight else (None, None)
        q = ops.rmsnorm(q.reshape(-1, hd), wq, c.rms_eps).reshape(B * T, H * hd)
        k = ops.rmsnorm(k.reshape(-1, hd), wk, c.rms_eps).reshape(B * T, K * hd)
    shift = ops.rope_shift(c)
    q = ops.rope(q, pos, rope["first_q"], rope["freq_q"][row:row + 1], shift).reshape(B, T, H, hd)
    k = ops.rope(k, pos, rope["first_k"], rope["freq_k"][row:row + 1], shift).reshape(B, T, K, hd)
    return q, k, v.reshape(B, T, K, hd)


def _attn_output(c: Config, hbm: dict, h, o, a: int):
    """Attention layer a's heads' outputs o [N, H*hd] through W_o (h [N, D]: the layer's normed input)."""
    if c.attn_out_norm:  # Muse: each head's output RMS-normed (no weight) before its gate
        o = ops.rmsnorm(o.reshape(-1, c.head_dim), None, c.rms_eps).reshape(o.shape)
    if c.attn_out_gate:  # Qwen3-Next, Muse: each head's output times sigmoid of its gate
        o = o * jax.nn.sigmoid(ops.mm(h, hbm["wg"][a]))
    o = ops.mm(o, hbm["wo"][a])
    return o + hbm["bo"][a] if c.o_bias else o


def _mlp(c: Config, hbm: dict, x, l: int, experts: str, add, gelu: bool, blocks: list, routes: list | None = None,
         rounds: tuple[str, ...] = ()):
    """Layer l's MLP (dense or MoE) and its residual update add (prefill_hidden's) on x [N, D] (K3: its input the
    depth mixture over blocks); a MoE layer's gates appended to routes where given; rounds: the recipe's points."""
    ares = c.attn_res_block
    xin = ops.depth_mix(hbm["res_mlp"][l], blocks, l // ares + 1, x, c.rms_eps, "attn_res" in rounds) if ares else x
    h = ops.rmsnorm(xin, hbm["mlp_norm"][l], c.rms_eps)
    if l < c.n_dense_layers:
        return add(x, ops.swiglu(h, *[unchunked(hbm[k][l], k) for k in ("gate", "up", "down")], gelu=gelu,
                                 k3=c.mlp_act == "situ"), "mlp", l)
    m = l - c.n_dense_layers

    def get(key):
        return hbm[key][m]

    gates = moe.route(c, h, get)
    if routes is not None:
        routes.append(gates)
    xe = moe.down(c, h, get, c.rms_eps)  # K3, Muse: the experts work in a latent
    y, lat = jnp.zeros(xe.shape, F32), "latent_moe" in rounds
    for e in range(c.n_experts):
        ex = mxfp4.dense_expert({k: hbm[k][m, e] for k in expert_keys(c, experts)}, mode_dtype(hbm))
        y = y + gates[:, e:e + 1] * moe.expert_out(c, ops.expert(xe, ex, c.expert_act, c.swiglu_alpha,
                                                                 c.swiglu_limit, lat), get)
    y = moe.up(c, y, get, c.rms_eps, rounded=lat)
    if c.n_shared_experts:
        shared = ops.swiglu(h, hbm["s_gate"][m], hbm["s_up"][m], hbm["s_down"][m], k3=c.expert_act == "situ",
                            rounded=lat)
        if c.shared_expert_gate:  # Qwen3-Next: times sigmoid(h . gate), one scalar a token
            shared = shared * jax.nn.sigmoid(jnp.sum(h * hbm["shared_gate"][m], axis=-1, keepdims=True))
        y = y + shared
    return add(x, ops.rounder(rounds)(y, "latent_moe"), "mlp", l)
