"""One decode step of every layer as ONE pallas_call (or a speculative verify step: T tokens a row, spec.block).

Weights stay in HBM (memory_space=ANY) and are copied into VMEM scratch by async copies with DMA semaphores, each
stream double-buffered: a layer's norms and mixer weights (and a recurrent layer's state) load while the previous layer
computes; the dense MLP streams in column chunks; the KV cache streams in tiles under the online softmax
(engines.megakernel.attention), a tile no row attends skipped; a MoE layer's router runs in the kernel and only the
experts the rows chose are copied (bytes scale with top-k). A layer's kind and stack index come from an SMEM table. New
K/V slots are staged in VMEM and written back after the last layer. The embedding gather runs before the kernel and the
final norm + LM head after it, in XLA, as the Kimi K3 TPU megakernel does (the LM head does not fit VMEM next to a
layer). Every DMA is on a leading-axis slice; no grid. CI runs it in Pallas interpret mode and lowers it for TPU;
docs/tpu.md says what Mosaic compiled and ran on a chip.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from engines.megakernel import attention, mla, moe, mxfp4, ops, recurrent
from engines.megakernel.call import pallas_call
from engines.megakernel.faults import NORM_EPS_FAULT
from engines.megakernel.spec import (  # noqa: F401 (KernelSpec and hbm_arrays are this module's API too)
    ATTENTION_CODES,
    CACHE_CODES,
    KIND_CODES,
    KernelSpec,
    attn_keys,
    cache_dims,
    dense_keys,
    expert_keys,
    expert_slots,
    hbm_arrays,
    layer_keys,
    mla_keys,
    mode_dtype,
    moe_keys,
    stack,
    streamed_keys,
)

F32 = jnp.float32


def decode_layers(spec: KernelSpec, hbm: dict, x: jax.Array, pos: jax.Array, k_cache: jax.Array,
                  v_cache: jax.Array, rope: dict, state: tuple = ()):
    """x [R, D] float32 (embedded tokens), pos [R] int32 (the slot each row writes): R = B * T query rows, row
    b*T + t the t-th of cache row b's block (T = spec.block: 1 to decode; the anchor and T-1 drafts to verify them,
    attending the cache below the block's first position and, causally, the block's own new K/V).
    k_cache, v_cache [La, B, K, S, hd] in spec.kv_dtype (the attention layers'), updated in place (aliased);
    state: () or the GDN layers' (hist [Lg, B, taps-1, C], S [Lg, B, Hv, dk, dv]) float32, updated in place; with
    T > 1 every state stack's snapshot after each block token ([Lg, T, B, ...]) is returned last.
    rope: first_q, freq_q, first_k, freq_k from ops.rope_tables, each freq [2, heads*hd]: the full layers' row, then
    the sliding layers'.
    Returns x [R, D] after the last layer, k_cache, v_cache, taps [L, R, D] (zeros if not wanted), *state,
    *snapshots, and with taps on an MoE model each MoE layer's gates [Lm, R, E] (nonzero: the experts chosen)."""
    c = spec.config
    B, D, L, K, hd = spec.batch, c.hidden, c.n_layers, c.n_kv_heads, c.head_dim  # B: cache rows
    R, T = spec.rows, spec.block  # query rows: each cache row's T block tokens
    Kc, dkc, dvc = cache_dims(c, spec.mla)  # the KV cache's heads and widths (attention's, or MLA's form's)
    H, TS, nb = c.n_heads, spec.tile, spec.n_buffers
    S = spec.window or spec.slots  # the cache positions read per layer (streamed through VMEM tile by tile)
    Ld, Lm = c.n_dense_layers, c.n_moe_layers
    lk, ak, xk, dk, mk = layer_keys(c), attn_keys(c), mla_keys(c, spec.mla), dense_keys(c), moe_keys(c)
    streamed, ek = streamed_keys(c, spec.mla), expert_keys(c, spec.experts)
    rk = recurrent.kinds(c)  # the linear-attention kinds, each with its own weight and state stacks
    hybrid = len({stack(c, i) for i in range(L)}) > 1  # mixers of two kinds: each layer's chosen at run time
    n_slots = expert_slots(spec) if Lm else 0
    n_chunks = hbm["gate"].shape[1] if dk else 0
    assert S % TS == 0 and S <= spec.slots and 1 <= nb <= 2 and 1 <= spec.kv_buffers <= 2
    kn = spec.knobs  # the faults' knobs (engines/megakernel/faults.py): each one expression below
    eps = (NORM_EPS_FAULT if c.rms_eps != NORM_EPS_FAULT else 1e-5) if kn.hardcoded_norm_eps else c.rms_eps
    gelu = (c.mlp_act == "gelu_tanh") != kn.gelu_mlp  # GeGLU (Gemma); the gelu_mlp fault swaps the activation
    shift = ops.rope_shift(c)
    table = [[KIND_CODES[c.kind(i)] for i in range(L)],  # row 0: a layer's kind; row 1: its index in its stacks
             [sum(stack(c, j) == stack(c, i) for j in range(i)) for i in range(L)]]
    windowed, win = attention.window(spec)
    ares = c.attn_res_block  # K3's attention residuals: the stream is a depth mixture over blocks of ares layers
    NB = -(-L // ares) if ares else 0
    kvd, res_dt = jnp.dtype(spec.kv_dtype), jnp.dtype(spec.residual)
    assert k_cache.dtype == kvd and v_cache.dtype == kvd, (k_cache.dtype, spec.kv_dtype)

    def kernel(*refs):
        it = iter(refs)  # the refs in the pallas_call's order (engines.megakernel.call): inputs, outputs, scratch

        def take(n: int) -> list:
            return [next(it) for _ in range(n)]

        pos_s, table_s, x_in, pos_v, blk_v, first_q, freq_q, first_k, freq_k = take(9)
        w = dict(zip(streamed + ek + dk, take(len(streamed) + len(ek) + len(dk))))
        kc_in, vc_in = take(2)
        ns = 2 * len(rk)
        st_in = take(ns)  # each recurrent kind's (hist, S) stacks
        x_out, kc_out, vc_out, taps_out = take(4)
        st_out = take(ns)
        blocks = take(1)[0] if ares else None  # K3: this token's finished blocks [NB, R, D] (the depth mixture's)
        snaps = take(ns) if T > 1 else ()  # each state stack after each block token
        routes_out = take(1)[0] if spec.want_taps and Lm else None  # each MoE layer's gates [Lm, R, E]
        # One scratch buffer per (slot, array): a layer reads whole refs, never a slice of a
        # stacked [2, ...] buffer (in the generic interpreter that slice is an extra copy).
        buf = [dict(zip(streamed, take(len(streamed)))) for _ in range(nb)]
        sem_w, kbuf0, kbuf1, vbuf0, vbuf1, sem_kv, sem_wb, attn_buf, newk, newv = take(10)
        kbufs, vbufs = (kbuf0, kbuf1), (vbuf0, vbuf1)
        ebuf = [dict(zip(ek, take(len(ek)))) for _ in range(2 if ek else 0)]  # two expert slots
        eids, sem_e = take(2) if ek else (None, None)
        cbuf = [dict(zip(dk, take(3))) for _ in range(2 if dk else 0)]  # two MLP chunk slots
        sem_c = take(1)[0] if dk else None
        # recurrent state buffers, one (hist, S) pair per kind and weight slot, read with the layer's weights and
        # written back from the same slot (pending[slot]: 1 + the kind of a write-back not yet waited for)
        sbuf = [take(ns) for _ in range(nb)]
        sem_st, pending = take(2) if ns else (None, None)
        snap_buf, sem_sn = (take(ns), take(1)[0]) if snaps else ((), None)
        # kc_in/vc_in alias kc_out/vc_out (one HBM buffer on a TPU): layers read the cache through the input refs

        def copies(keys, idx, slot):
            return [pltpu.make_async_copy(w[k].at[idx], buf[slot][k], sem_w.at[slot, streamed.index(k)])
                    for k in keys]

        def state_copy(r, g, slot, out: bool):
            """Layer g of recurrent kind r: its state into (or, out, from) buffer slot `slot`."""
            return [pltpu.make_async_copy(sbuf[slot][j], st_out[j].at[g], sem_st.at[slot, ns + j]) if out else
                    pltpu.make_async_copy(st_in[j].at[g], sbuf[slot][j], sem_st.at[slot, j])
                    for j in (2 * r, 2 * r + 1)]

        def run(cps, start: bool):
            for cp in cps:
                cp.start() if start else cp.wait()

        def fetch(l, slot, start: bool):
            """Layer l's norms and its mixer's arrays (a recurrent layer's state too) into buffer slot `slot`."""
            run(copies(lk, l, slot), start)
            g = table_s[1, l]
            mixers = ([("attention", lambda: run(copies(ak, g, slot), start))] if ak else []) + \
                ([("mla", lambda: run(copies(xk, g, slot), start))] if xk else []) + \
                [(kind, lambda r=r, kind=kind: run(copies(recurrent.keys(c, kind), g, slot)
                                                   + state_copy(r, g, slot, False), start))
                 for r, kind in enumerate(rk)]
            branch(table_s[0, l], mixers)

        def branch(kind, mixers):
            """The one mixer (name, fn) of this layer's kind ("attention": full or sliding), run; with mixers of
            one kind only, unconditionally."""
            if not hybrid:
                return mixers[0][1]()
            for name, fn in mixers:
                pl.when((kind < ATTENTION_CODES) if name == "attention" else (kind == KIND_CODES[name]))(fn)

        def settle(slot):
            """Wait for slot's state write-back, if one is out, before anything lands in that slot."""
            for r in range(len(rk)):
                @pl.when(pending[slot] == r + 1)
                def _(r=r):
                    run(state_copy(r, 0, slot, True), False)
                    pending[slot] = 0

        for j in range(nb if hybrid else 0):
            pending[j] = 0
        fetch(0, 0, True)
        if not Ld and Lm:
            run(copies(mk, 0, 0), True)

        def chunk_copies(l, j):
            """Chunk j of dense layer l's MLP into chunk buffer j % 2."""
            return [pltpu.make_async_copy(w[k].at[l, j], cbuf[j % 2][k], sem_c.at[j % 2, q]) for q, k in enumerate(dk)]
        # the tiles any row attends: below the highest block start (its own slot too under mask_own_slot)
        starts = [pos_s[b * T] for b in range(B)]
        reach = functools.reduce(jnp.maximum, starts)
        n_pos = reach + (1 if kn.mask_own_slot else 0)  # the cache positions any row attends: 0 .. n_pos-1
        live = jax.lax.div(n_pos + TS - 1, TS)  # n_pos >= 0: floor division
        # the lowest row's position: a sliding layer's tiles before its window are never read
        low = functools.reduce(jnp.minimum, starts)
        x_out[...] = x_in[...]
        if ares:
            blocks[...] = jnp.zeros((NB, R, D), F32)

        def stream(b_, key, n):
            """A layer's input: the stream itself, or (K3) its depth mixture over n blocks and the prefix."""
            x = x_out[...]
            n = n - kn.res_blocks_short  # the fault: a block too few
            return ops.depth_mix(b_[key][...], [blocks[j] for j in range(NB)], n, x, c.rms_eps,
                                 "attn_res" in spec.rounds) if ares else x

        def layer(l, s):
            """Layer l (traced) whose weights sit in buffer slot s (static: l % nb)."""
            nxt = (s + 1) % nb
            b_ = buf[s]
            kind, a = table_s[0, l], table_s[1, l]  # a: the layer's index in its kind's stacks (KV cache included)
            sliding = kind == 1
            # the first tile any row attends: 0, or on a sliding layer the lowest row's window start's
            first = jnp.where(sliding, jax.lax.div(jnp.maximum(low - win + 1, 0), TS), 0) if windowed else 0

            def kv_tile(t):  # tile t of this layer's window: whole, or in pieces up to the last attended position
                return attention.tile_copies(spec, ((kc_in, kbufs), (vc_in, vbufs)), sem_kv, a, t, n_pos)

            if Ld:
                @pl.when(l < Ld)
                def _():
                    run(chunk_copies(l, 0), True)  # the MLP's first chunk loads under the attention

            for t in range(attention.n_tiles(spec) if windowed else 1):
                @pl.when((first == t) & (t < live) & ((kind < CACHE_CODES) if hybrid else True))
                def _(t=t):
                    run(kv_tile(t), True)  # the first tile loads under the QKV projection

            fetch(l, s, False)

            @pl.when(l + 1 < L)
            def _():
                settle(nxt)
                fetch(l + 1, nxt, True)

            a_ = max(ares, 1)  # blocks before the attention: ceil(l / ares); before the MLP: l // ares + 1
            h = ops.rmsnorm(stream(b_, "res_attn", jax.lax.div(l + a_ - 1, a_)), b_["attn_norm"][...], eps)
            if ares:  # a group starts: the prefix so far becomes a block, and restarts at zero
                @pl.when(jax.lax.rem(l, ares) == 0)
                def _():
                    blocks[pl.ds(jax.lax.div(l, ares), 1)] = x_out[...][None]
                    x_out[...] = jnp.zeros((R, D), F32)
            x = x_out[...]

            def add(x, y, branch):  # the residual update by branch "attn" or "mlp"'s output y, rounded as declared
                return ops.round_to(ops.residual(c, x, y, branch, lambda key: b_[key][...], eps), res_dt)

            def attention_layer():
                q = ops.mm(h, b_["wq"][...])  # [R, H*hd]
                k = ops.mm(h, b_["wk"][...])  # [R, K*hd]
                v = ops.mm(h, b_["wv"][...])
                if c.attn_bias:  # Qwen2, gpt-oss: float32 biases on the projections, before RoPE
                    q, k, v = q + b_["bq"][...], k + b_["bk"][...], v + b_["bv"][...]
                if c.qk_norm:  # Muse's without a weight
                    wq_, wk_ = (b_["q_norm"][...], b_["k_norm"][...]) if c.qk_norm_weight else (None, None)
                    q = ops.reshape(ops.rmsnorm(ops.reshape(q, R * H, hd), wq_, eps), R, H * hd)
                    k = ops.reshape(ops.rmsnorm(ops.reshape(k, R * K, hd), wk_, eps), R, K * hd)
                rpos = pos_v[...] + kn.rope_pos_offset  # [R, 1]
                if kn.pos_in_weights_dtype:  # the position cast with the activations (exact in f32; bf16 to 256)
                    rpos = ops.round_to(rpos.astype(F32), b_["wq"].dtype).astype(jnp.int32)
                if kn.rows_pos_swapped and R > 1:  # no 0-row piece
                    rpos = jnp.concatenate([rpos[1:2], rpos[0:1]] + ([rpos[2:]] if R > 2 else []), axis=0)
                fq, fk = freq_q[0:1, :], freq_k[0:1, :]
                if windowed:  # a sliding layer's own RoPE (Gemma 3: another base, unscaled)
                    fq, fk = jnp.where(sliding, freq_q[1:2, :], fq), jnp.where(sliding, freq_k[1:2, :], fk)
                q = ops.rope(q, rpos, first_q[...], fq, shift, roll=pltpu.roll)
                k = ops.rope(k, rpos, first_k[...], fk, shift, roll=pltpu.roll)
                # what the cache holds is what is attended: the new K/V rounded to its storage (a no-op for float32)
                k, v = ops.round_to(k, kvd), ops.round_to(v, kvd)
                wdt = b_["wk"].dtype  # kv_bf16_slot: the written slot rounded to the weights' dtype (no-op in f32)
                rounded = (lambda y: ops.round_to(y, wdt)) if kn.new_kv_in_weights_dtype else (lambda y: y)
                # staged in VMEM for the write-back DMA after the last layer
                newk[pl.ds(a, 1)] = ops.reshape(rounded(k), 1, R, Kc, 1, dkc).astype(kvd)
                newv[pl.ds(a, 1)] = ops.reshape(rounded(v), 1, R, Kc, 1, dvc).astype(kvd)
                attn_buf[...] = attention.attend(spec, q, k, v, blk_v[...], sliding, first, live, kv_tile, kbufs,
                                                 vbufs, b_["sinks"][...] if c.attn_sinks else None)
                out = attn_buf[...]
                if c.attn_out_norm:  # Muse: each head's output RMS-normed (no weight) before its gate
                    out = ops.reshape(ops.rmsnorm(ops.reshape(out, R * H, hd), None, eps), R, H * hd)
                if c.attn_out_gate:  # Qwen3-Next, Muse: each head's output times sigmoid of its gate
                    out = out * jax.nn.sigmoid(ops.mm(h, b_["wg"][...]))
                if kn.wo_output_in_weights_dtype:  # no f32 output type: the product rounded to the weights' dtype
                    o = ops.round_to(ops.mm(out, b_["wo"][...]), b_["wo"].dtype)
                else:
                    o = ops.mm(out, b_["wo"][...])
                if kn.split_k_when_batched:  # split-K when more than one row is live (a free row sits at position 0)
                    half, wo = H * hd // 2, b_["wo"][...]
                    split = ops.mm(out[:, :half], wo[:half]) + ops.mm(out[:, half:], wo[half:])
                    o = jnp.where(jnp.sum(pos_v[...] > 0) > 1, split, o)
                if c.o_bias:
                    o = o + b_["bo"][...]
                x_out[...] = add(x, o, "attn")

            def mla_layer():
                q, k, v = mla.project(c, {key: b_[key][...] for key in xk}, h, pos_v[...] + kn.rope_pos_offset,
                                      pltpu.roll, kn.mla_pe_rotated, spec.rounds)
                k, v = ops.round_to(k, kvd), ops.round_to(v, kvd)
                newk[pl.ds(a, 1)] = ops.reshape(k, 1, R, Kc, 1, dkc).astype(kvd)
                newv[pl.ds(a, 1)] = ops.reshape(v, 1, R, Kc, 1, dvc).astype(kvd)
                out = attention.attend(spec, q, k, v, blk_v[...], False, 0, live, kv_tile, kbufs, vbufs, None, True)
                x_out[...] = ops.round_to(x + mla.output(c, {key: b_[key][...] for key in xk}, h, out, spec.rounds),
                                          res_dt)

            def recurrent_layer(r, name):
                hist, st = sbuf[s][2 * r], sbuf[s][2 * r + 1]
                wr = {k: b_[k][...] for k in recurrent.keys(c, name)}
                if T == 1:
                    out, hist[...], st[...] = recurrent.layer(c, name, wr, h, hist[...], st[...], kn, eps, spec.rounds)
                else:  # the block's tokens in order; the state after each is a snapshot (the rollback's)
                    out, hs, ss = recurrent.block(c, name, wr, h, hist[...], st[...], kn, eps, T, spec.rounds)
                    hist[...], st[...] = hs[T - 1], ss[T - 1]
                    snap_buf[2 * r][...], snap_buf[2 * r + 1][...] = hs, ss
                    cps = [pltpu.make_async_copy(snap_buf[j], snaps[j].at[a], sem_sn.at[j]) for j in (2 * r, 2 * r + 1)]
                    run(cps, True)
                    run(cps, False)  # waited here: the next layer of this kind reuses the snapshot buffer
                run(state_copy(r, a, s, True), True)  # waited for before the slot is reused (settle)
                pending[s] = r + 1
                x_out[...] = add(x, out, "attn")

            branch(kind, ([("attention", attention_layer)] if ak else []) + ([("mla", mla_layer)] if xk else [])
                   + [(n, functools.partial(recurrent_layer, r, n)) for r, n in enumerate(rk)])
            x = x_out[...]
            h = ops.rmsnorm(stream(b_, "res_mlp", jax.lax.div(l, a_) + 1), b_["mlp_norm"][...], eps)
            keep = (l != spec.fault_layer) if kn.drop_layer else True

            if Lm:
                @pl.when((l + 1 >= Ld) & (l + 1 < L))
                def _():
                    run(copies(mk, l + 1 - Ld, nxt), True)

            if Ld:
                @pl.when(l < Ld)
                def _():
                    y = None
                    for j in range(n_chunks):  # chunk j+1 copies while chunk j computes
                        run(chunk_copies(l, j), False)
                        if j + 1 < n_chunks:
                            run(chunk_copies(l, j + 1), True)
                        cb = cbuf[j % 2]
                        part = ops.swiglu(h, cb["gate"][...], cb["up"][...], cb["down"][...], gelu=gelu,
                                          k3=c.mlp_act == "situ")
                        y = part if y is None else y + part
                    x_out[...] = jnp.where(keep, add(x, y, "mlp"), x)

            if Lm:
                @pl.when(l >= Ld)
                def _():
                    run(copies(mk, l - Ld, s), False)
                    gates = moe.route(c, h, lambda key: b_[key][...], kn)
                    if routes_out is not None:  # with taps: the choice, for a routing replay
                        routes_out[pl.ds(l - Ld, 1), :, :] = gates[None]
                    x_out[...] = jnp.where(keep, add(x, routed_experts(l - Ld, h, gates, b_), "mlp"), x)

            if kn.bf16_residual:
                x_out[...] = ops.round_to(x_out[...], jnp.bfloat16)
            if spec.want_taps:
                taps_out[pl.ds(l, 1), :, :] = x_out[...][None]

        def routed_experts(m, h, gates, b_):
            """The chosen experts of MoE layer m, each copied alone from HBM (bytes a step scale with top-k, not with
            the expert count), double-buffered: expert j+1 loads while expert j computes, and the first loads under
            the shared expert. Experts are taken in ascending id, the order a sum over all experts would add them."""
            E = c.n_experts
            iota = jax.lax.broadcasted_iota(jnp.int32, (1, E), 1)
            eids[...] = ops.chosen_ids(gates, eids.shape, n_slots)  # the distinct chosen ids, ascending; E: unused

            def guarded(j, start: bool):
                @pl.when(eids[0, j] < E)
                def _():
                    we = (eids[0, j] + kn.expert_offset) % E  # the weight slice (expert_offset: the fault's)
                    run([pltpu.make_async_copy(w[k].at[m, we], ebuf[j % 2][k], sem_e.at[j % 2, q])
                         for q, k in enumerate(ek)], start)

            guarded(0, True)
            shared = ops.swiglu(h, b_["s_gate"][...], b_["s_up"][...], b_["s_down"][...], k3=c.expert_act == "situ",
                                rounded="latent_moe" in spec.rounds) if c.n_shared_experts else None
            get = lambda key: b_[key][...]  # noqa: E731 (one of the layer's arrays, read)
            xe = moe.down(c, h, get, eps)  # K3, Muse: the experts work in a latent
            if c.shared_expert_gate:  # Qwen3-Next: the shared expert times sigmoid(h . gate), one scalar a row
                shared = shared * jax.nn.sigmoid(jnp.sum(h * b_["shared_gate"][...], axis=-1, keepdims=True))
            y, lat = jnp.zeros(xe.shape, F32), "latent_moe" in spec.rounds
            for j in range(n_slots):
                guarded(j, False)
                if j + 1 < n_slots:
                    guarded(j + 1, True)
                e = eids[0, j]
                g = jnp.sum(jnp.where(iota == e, gates, 0.0), axis=-1, keepdims=True)  # [B, 1]: gates[:, e]
                e_ = mxfp4.dense_expert({k: r[...] for k, r in ebuf[j % 2].items()}, mode_dtype(b_),
                                        kn.mxfp4_nibbles_swapped)  # MXFP4 experts dequantised here, in VMEM
                out = moe.expert_out(c, ops.expert(xe, e_, c.expert_act, c.swiglu_alpha, c.swiglu_limit, lat), get)
                y = jnp.where(e < E, y + g * out, y)  # an unused slot's buffer is never read into y
            y = moe.up(c, y, get, eps, kn.latent_norm_width, lat)
            return ops.rounder(spec.rounds)(y + shared if shared is not None else y, "latent_moe")

        if nb == 2:  # layers in pairs so that each one's buffer slot is static
            def pair(j, carry):
                layer(2 * j, 0)
                layer(2 * j + 1, 1)
                return carry

            jax.lax.fori_loop(0, L // 2, pair, 0)
            if L % 2:
                layer(L - 1, 0)
        else:
            def single(l, carry):
                layer(l, 0)
                return carry

            jax.lax.fori_loop(0, L, single, 0)
        for j in range(nb if hybrid else 0):
            settle(j)

        run(attention.write_back(spec, ((newk, kc_out), (newv, vc_out)), sem_wb, pos_s), False)

    out = pallas_call(spec, kernel, hbm, streamed + ek + dk, table, x, pos, k_cache, v_cache, rope, state)
    if not ares:
        return out
    n = 4 + len(state)  # K3: the final norm reads the depth mixture over every block and the prefix
    blocks = out[n]
    return (ops.depth_mix(hbm["res_out"], [blocks[j] for j in range(NB)], NB, out[0], c.rms_eps,
                          "attn_res" in spec.rounds), *out[1:n], *out[n + 1:])
