"""One decode step of every layer as ONE pallas_call.

Weights stay in HBM (memory_space=ANY) and are copied into VMEM scratch with async copies and DMA
semaphores, each stream double-buffered: a layer's attention (and MoE router and shared expert)
weights load while the previous layer computes; the dense MLP streams in column chunks (chunk j+1
loads while chunk j computes, the first under the attention); the KV cache streams in tiles under
the online softmax, and a tile no row attends is skipped; a MoE layer's router runs in the kernel
and only the distinct experts the rows chose are copied, one by one, so the bytes a step moves
scale with top-k. Per layer: RMSNorm, QKV projection (and biases), RoPE by lane rolls, attention
with the new K/V slot attended last (staged in VMEM and written back to HBM for all layers after
the last one), output projection, residual, then the MLP or the MoE, residual. The embedding
gather runs before the kernel and the final norm + LM head after it, in XLA, as the Kimi K3 TPU
megakernel does: the LM head ([V, D], 113 MB in f32 for SmolLM2) does not fit VMEM next to a
layer, and it is one memory-bound matmul XLA already does well.

Every DMA is on a leading-axis slice (the weights are laid out chunk- and expert-major); no grid;
ANY, VMEM and SMEM refs. It lowers for TPU (tests/engines/megakernel/test_tpu.py) but has never
been compiled by Mosaic or run on TPU hardware (docs/tpu.md). Here it runs in Pallas interpret mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from engines.megakernel import mxfp4, ops
from engines.megakernel.faults import NORM_EPS_FAULT
from engines.megakernel.spec import (  # noqa: F401 (KernelSpec and hbm_arrays are this module's API too)
    KernelSpec,
    attn_keys,
    dense_keys,
    expert_keys,
    expert_slots,
    hbm_arrays,
    moe_keys,
    streamed_keys,
)

F32 = jnp.float32
ROPE_KEYS = ("first_q", "freq_q", "first_k", "freq_k")


def decode_layers(spec: KernelSpec, hbm: dict, x: jax.Array, pos: jax.Array, k_cache: jax.Array,
                  v_cache: jax.Array, rope: dict):
    """x [B, D] float32 (embedded tokens), pos [B] int32 (the slot each row writes).
    k_cache, v_cache [L, B, K, S, hd] in spec.kv_dtype, updated in place (aliased).
    rope: first_q, freq_q, first_k, freq_k from ops.rope_tables, each freq [2, heads*hd]: the full layers' row, then
    the sliding layers'.
    Returns x [B, D] after the last layer, k_cache, v_cache, taps [L, B, D] (zeros if not wanted).
    """
    c = spec.config
    B, D, L, K, hd = spec.batch, c.hidden, c.n_layers, c.n_kv_heads, c.head_dim
    H, G, TS, nb = c.n_heads, c.n_heads // c.n_kv_heads, spec.tile, spec.n_buffers
    S = spec.window or spec.slots  # the cache positions read per layer (streamed through VMEM tile by tile)
    Ld, Lm = c.n_dense_layers, c.n_moe_layers
    ak, dk, mk = attn_keys(c), dense_keys(c), moe_keys(c)
    streamed, ek = streamed_keys(c), expert_keys(c, spec.experts)
    n_slots = expert_slots(spec) if Lm else 0
    n_chunks = hbm["gate"].shape[1] if dk else 0
    assert S % TS == 0 and S <= spec.slots and 1 <= nb <= 2 and 1 <= spec.kv_buffers <= 2
    kn = spec.knobs  # the faults' knobs (engines/megakernel/faults.py): each one expression below
    eps = (NORM_EPS_FAULT if c.rms_eps != NORM_EPS_FAULT else 1e-5) if kn.hardcoded_norm_eps else c.rms_eps
    n_tiles = S // TS - (1 if kn.skip_last_tile and S // TS > 1 else 0)
    gqa_t = kn.gqa_transposed  # query head h reads kv head h % K instead of h // G
    gelu = (c.mlp_act == "gelu_tanh") != kn.gelu_mlp  # GeGLU (Gemma); the gelu_mlp fault swaps the activation
    shift = ops.rope_shift(c)
    kinds = [1 if c.kind(i) == "sliding" else 0 for i in range(L)]  # a layer's kind, read from SMEM
    windowed = any(kinds)
    win = c.sliding_window + kn.window_offset  # a sliding layer's query at p sees p - win + 1 .. p
    # the scores' scale: 1/sqrt(hd) or Gemma's query_pre_attn_scalar**-0.5, times a scaled RoPE's factor (YaRN)
    base_scale = ((c.query_scale or hd) + kn.scale_dim_offset) ** -0.5
    scales = [base_scale * ops.rope_freqs(c, kind)[1] for kind in ("full", "sliding")]
    kvd = jnp.dtype(spec.kv_dtype)
    assert k_cache.dtype == kvd and v_cache.dtype == kvd, (k_cache.dtype, spec.kv_dtype)

    def kernel(*refs):
        pos_s, kinds_s, x_in, pos_v, first_q, freq_q, first_k, freq_k = refs[:8]
        i = 8
        w = dict(zip(streamed + ek + dk, refs[i:i + len(streamed) + len(ek) + len(dk)]))
        i += len(streamed) + len(ek) + len(dk)
        kc_in, vc_in = refs[i:i + 2]
        x_out, kc_out, vc_out, taps_out = refs[i + 2:i + 6]
        i += 6
        # One scratch buffer per (slot, array): a layer reads whole refs, never a slice of a
        # stacked [2, ...] buffer (in the generic interpreter that slice is an extra copy).
        buf = []
        for _ in range(nb):
            buf.append(dict(zip(streamed, refs[i:i + len(streamed)])))
            i += len(streamed)
        sem_w, kbuf0, kbuf1, vbuf0, vbuf1, sem_kv, sem_wb, attn_buf, newk, newv = refs[i:i + 10]
        kbufs, vbufs = (kbuf0, kbuf1), (vbuf0, vbuf1)
        i += 10
        ne = len(ek)
        ebuf = [dict(zip(ek, refs[i + ne * j:i + ne * j + ne])) for j in range(2 if ek else 0)]  # two expert slots
        eids, sem_e = (refs[i + 2 * ne], refs[i + 2 * ne + 1]) if ek else (None, None)
        i += 2 * ne + 2 if ek else 0
        cbuf = [dict(zip(dk, refs[i + 3 * j:i + 3 * j + 3])) for j in range(2 if dk else 0)]  # two MLP chunk slots
        sem_c = refs[i + 6] if dk else None
        # kc_in/vc_in alias kc_out/vc_out (one HBM buffer on a TPU): the layers read the cache
        # through the input refs; the new slots are written through the output refs at the end.

        def copies(keys, idx, slot):
            return [pltpu.make_async_copy(w[k].at[idx], buf[slot][k], sem_w.at[slot, streamed.index(k)])
                    for k in keys]

        def start(keys, idx, slot):
            for cp in copies(keys, idx, slot):
                cp.start()

        def wait(keys, idx, slot):
            for cp in copies(keys, idx, slot):
                cp.wait()

        start(ak, 0, 0)
        if not Ld and Lm:
            start(mk, 0, 0)

        def chunk_copies(l, j):
            """Chunk j of dense layer l's MLP into chunk buffer j % 2."""
            return [pltpu.make_async_copy(w[k].at[l, j], cbuf[j % 2][k], sem_c.at[j % 2, q]) for q, k in enumerate(dk)]
        # the cache tiles any row attends: those holding a position below the highest row's (its own slot too
        # under the mask_own_slot fault, which reads it)
        reach = pos_s[0]
        for b in range(1, B):
            reach = jnp.maximum(reach, pos_s[b])
        live = jax.lax.div(reach + (TS if kn.mask_own_slot else TS - 1), TS)  # reach >= 0: floor division
        low = pos_s[0]  # the lowest row's position: a sliding layer's tiles before its window are never read
        for b in range(1, B):
            low = jnp.minimum(low, pos_s[b])
        x_out[...] = x_in[...]

        def layer(l, s):
            """Layer l (traced) whose weights sit in buffer slot s (static: l % nb)."""
            nxt = (s + 1) % nb
            b_ = buf[s]
            sliding = kinds_s[l] == 1
            # the first tile any row attends: 0, or on a sliding layer the lowest row's window start's
            first = jnp.where(sliding, jax.lax.div(jnp.maximum(low - win + 1, 0), TS), 0) if windowed else 0

            def kv_tile(t):
                """Tile t of this layer's window (cache positions t*TS..) into KV buffer slot t % kv_buffers."""
                j = t % spec.kv_buffers
                return [pltpu.make_async_copy(src.at[l, :, :, pl.ds(t * TS, TS), :], dst[j], sem_kv.at[j, i])
                        for i, (src, dst) in enumerate(((kc_in, kbufs), (vc_in, vbufs)))]

            if Ld:
                @pl.when(l < Ld)
                def _():
                    for cp in chunk_copies(l, 0):  # the MLP's first chunk loads under the attention
                        cp.start()

            for t in range(n_tiles if windowed else 1):
                @pl.when((first == t) & (t < live))
                def _(t=t):
                    for cp in kv_tile(t):  # the first tile loads under the QKV projection
                        cp.start()

            wait(ak, l, s)

            @pl.when(l + 1 < L)
            def _():
                start(ak, l + 1, nxt)

            x = x_out[...]
            h = ops.rmsnorm(x, b_["attn_norm"][...], eps)
            q = ops.mm(h, b_["wq"][...])  # [B, H*hd]
            k = ops.mm(h, b_["wk"][...])  # [B, K*hd]
            v = ops.mm(h, b_["wv"][...])
            if c.attn_bias:  # Qwen2, gpt-oss: float32 biases on the projections, before RoPE
                q, k, v = q + b_["bq"][...], k + b_["bk"][...], v + b_["bv"][...]
            if c.qk_norm:
                q = ops.rmsnorm(q.reshape(B * H, hd), b_["q_norm"][...], eps).reshape(B, H * hd)
                k = ops.rmsnorm(k.reshape(B * K, hd), b_["k_norm"][...], eps).reshape(B, K * hd)
            rpos = pos_v[...] + kn.rope_pos_offset  # [B, 1]
            if kn.pos_in_weights_dtype:  # the position cast with the activations (exact in f32; bf16 to 256)
                rpos = ops.round_to(rpos.astype(F32), b_["wq"].dtype).astype(jnp.int32)
            if kn.rows_pos_swapped and B > 1:
                rpos = jnp.concatenate([rpos[1:2], rpos[0:1]] + ([rpos[2:]] if B > 2 else []), axis=0)  # no 0-row piece
            fq, fk = freq_q[0:1, :], freq_k[0:1, :]
            if windowed:  # a sliding layer's own RoPE (Gemma 3: another base, unscaled)
                fq, fk = jnp.where(sliding, freq_q[1:2, :], fq), jnp.where(sliding, freq_k[1:2, :], fk)
            q = ops.rope(q, rpos, first_q[...], fq, shift, roll=pltpu.roll)
            k = ops.rope(k, rpos, first_k[...], fk, shift, roll=pltpu.roll)

            # The new token's K/V: staged in VMEM for the write-back DMA, and attended to as the
            # last term of the online softmax (the cache tiles cover positions < p only), so no
            # VMEM copy of the cache is ever written.
            # what the cache holds is what is attended: the new K/V rounded to its storage (a no-op for float32)
            k, v = ops.round_to(k, kvd), ops.round_to(v, kvd)
            wdt = b_["wk"].dtype  # kv_bf16_slot: the written slot rounded to the weights' dtype (a no-op in f32)
            rounded = (lambda a: ops.round_to(a, wdt)) if kn.new_kv_in_weights_dtype else (lambda a: a)
            newk[pl.ds(l, 1)] = rounded(k).reshape(1, B, K, 1, hd).astype(kvd)
            newv[pl.ds(l, 1)] = rounded(v).reshape(1, B, K, 1, hd).astype(kvd)
            # Attention for all rows and kv heads at once, n = B*K groups of G query heads,
            # streaming the cache from HBM in tiles of TS positions under an online softmax, double-
            # buffered: tile t+1's copy runs while tile t is read. The tile loop is static: a traced
            # loop here made the generic interpreter carry (and copy) every scratch buffer per
            # iteration, 5x slower at batch 8.
            # head kh*G + g of row b -> group b*K + kh, row g
            scale = jnp.where(sliding, scales[1], scales[0]) if scales[0] != scales[1] else scales[0]
            qg = (q.reshape(B, G, K, hd).transpose(0, 2, 1, 3) if gqa_t else q).reshape(B * K, G, hd) * scale
            row_pos = jnp.repeat(pos_v[...], K, axis=0)[:, :, None]  # [n, 1, 1]

            def seen(col):
                """Which cache positions `col` (any shape broadcasting against [n, 1, 1]) a row attends."""
                ok = (col <= row_pos) if kn.mask_own_slot else (col < row_pos)
                ok = (ok & (col > 0)) if kn.mask_first_slot else ok
                return (ok & ((col > row_pos - win) | jnp.logical_not(sliding))) if windowed else ok

            def capped(sc, ok):
                """Soft-capped scores (Gemma 2), -inf where not attended; the cap goes before the mask."""
                if kn.softcap_after_mask:  # -inf capped to -cap: masked slots join the denominator
                    return ops.softcap(jnp.where(ok, sc, -jnp.inf), c.attn_softcap)
                return jnp.where(ok, ops.softcap(sc, c.attn_softcap), -jnp.inf)
            mla = (jnp.full((B * K, G, 1), -jnp.inf, F32), jnp.zeros((B * K, G, 1), F32),
                   jnp.zeros((B * K, G, hd), F32))
            if c.attn_sinks and not kn.sink_dropped:  # gpt-oss: a learned logit per head joins the denominator
                sk = b_["sinks"][...]  # [1, H]: head kh*G + g (gqa_transposed: g*K + kh)
                sk = sk.reshape(1, G, K).transpose(0, 2, 1) if gqa_t else sk.reshape(1, K, G)
                mla = (jnp.broadcast_to(sk, (B, K, G)).reshape(B * K, G, 1), jnp.ones((B * K, G, 1), F32), mla[2])
            for t in range(n_tiles):  # a tile no row attends is neither copied nor read (bitwise the same:
                # a fully masked tile adds exactly nothing to the online softmax)
                def tile_step(mla, t=t):
                    for cp in kv_tile(t):
                        cp.wait()
                    if t + 1 < n_tiles:
                        @pl.when(t + 1 < live)
                        def _():
                            for cp in kv_tile(t + 1):
                                cp.start()

                    j = t % spec.kv_buffers
                    kt = kbufs[j][...].reshape(B * K, TS, hd).astype(F32)
                    vt = vbufs[j][...].reshape(B * K, TS, hd).astype(F32)
                    sc = jnp.einsum("nqd,nkd->nqk", qg, kt, preferred_element_type=F32)  # [n, G, TS]
                    col = t * TS + jax.lax.broadcasted_iota(jnp.int32, (B * K, 1, TS), 2)
                    # V is masked as well as the scores: an unwritten slot may hold anything (NaN included), and
                    # a zero probability times NaN is NaN
                    vt = jnp.where(seen(col.reshape(B * K, TS, 1)), vt, 0.0)
                    return ops.online_softmax_step(mla, capped(sc, seen(col)), vt)

                mla = jax.lax.cond((t >= first) & (t < live), tile_step, lambda m: m, mla)
            if not kn.skip_new_kv:  # the fault: the newest entry is never attended to
                k_new = k.reshape(B * K, 1, hd)
                sc = jnp.einsum("nqd,nkd->nqk", qg, k_new, preferred_element_type=F32)  # [n, G, 1]
                mla = ops.online_softmax_step(mla, ops.softcap(sc, c.attn_softcap), v.reshape(B * K, 1, hd))
            _, lsum, acc = mla
            out = jnp.where(lsum > 0, acc / jnp.maximum(lsum, 1e-30), 0.0)  # [n, G, hd]
            attn_buf[...] = (out.reshape(B, K, G, hd).transpose(0, 2, 1, 3) if gqa_t else out).reshape(B, H * hd)
            if kn.wo_output_in_weights_dtype:  # no f32 output type: the product is rounded to the weights' dtype
                o = ops.round_to(ops.mm(attn_buf[...], b_["wo"][...]), b_["wo"].dtype)
            else:
                o = ops.mm(attn_buf[...], b_["wo"][...])
            if kn.split_k_when_batched:  # split-K when more than one row is live (a free row sits at position 0)
                half, wo = H * hd // 2, b_["wo"][...]
                split = ops.mm(attn_buf[:, :half], wo[:half]) + ops.mm(attn_buf[:, half:], wo[half:])
                o = jnp.where(jnp.sum(pos_v[...] > 0) > 1, split, o)
            if c.o_bias:
                o = o + b_["bo"][...]
            post = (lambda y, key: ops.rmsnorm(y, b_[key][...], eps)) if c.post_norms else (lambda y, key: y)
            x = x + post(o, "post_attn_norm")  # Gemma: each branch normed before its residual add
            h = ops.rmsnorm(x, b_["mlp_norm"][...], eps)
            keep = (l != spec.fault_layer) if kn.drop_layer else True

            if Lm:
                @pl.when((l + 1 >= Ld) & (l + 1 < L))
                def _():
                    start(mk, l + 1 - Ld, nxt)

            if Ld:
                @pl.when(l < Ld)
                def _():
                    y = None
                    for j in range(n_chunks):  # chunk j+1 copies while chunk j computes
                        for cp in chunk_copies(l, j):
                            cp.wait()
                        if j + 1 < n_chunks:
                            for cp in chunk_copies(l, j + 1):
                                cp.start()
                        cb = cbuf[j % 2]
                        part = ops.swiglu(h, cb["gate"][...], cb["up"][...], cb["down"][...], gelu=gelu)
                        y = part if y is None else y + part
                    x_out[...] = x + jnp.where(keep, post(y, "post_mlp_norm"), 0.0)

            if Lm:
                @pl.when(l >= Ld)
                def _():
                    wait(mk, l - Ld, s)
                    logits = jnp.dot(h, b_["router"][...], preferred_element_type=F32)  # [B, E]
                    gates = ops.pick_experts(logits, b_["router_bias"][...], router=c.router,
                                             top_k=c.top_k, norm_topk=c.norm_topk and not kn.moe_unnormalized,
                                             scale=c.routed_scale, skip_first=kn.router_skip_first)
                    x_out[...] = x + jnp.where(keep, post(routed_experts(l - Ld, h, gates, b_), "post_mlp_norm"), 0.0)

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

            def copies(j):
                we = (eids[0, j] + kn.expert_offset) % E  # the weight slice (expert_offset: the fault's)
                return [pltpu.make_async_copy(w[k].at[m, we], ebuf[j % 2][k], sem_e.at[j % 2, q])
                        for q, k in enumerate(ek)]

            def guarded(j, start: bool):
                @pl.when(eids[0, j] < E)
                def _():
                    for cp in copies(j):
                        if start:
                            cp.start()
                        else:
                            cp.wait()

            guarded(0, True)
            shared = ops.swiglu(h, b_["s_gate"][...], b_["s_up"][...], b_["s_down"][...]) if c.n_shared_experts \
                else None
            y = jnp.zeros((B, D), F32)
            for j in range(n_slots):
                guarded(j, False)
                if j + 1 < n_slots:
                    guarded(j + 1, True)
                e = eids[0, j]
                g = jnp.sum(jnp.where(iota == e, gates, 0.0), axis=-1, keepdims=True)  # [B, 1]: gates[:, e]
                e_ = mxfp4.dense_expert({k: r[...] for k, r in ebuf[j % 2].items()}, b_["wq"].dtype,
                                        kn.mxfp4_nibbles_swapped)  # MXFP4 experts dequantised here, in VMEM
                out = ops.expert(h, e_, c.expert_act, c.swiglu_alpha, c.swiglu_limit)
                y = jnp.where(e < E, y + g * out, y)  # an unused slot's buffer is never read into y
            return y + shared if shared is not None else y

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

        # Every layer's new K/V slot goes back to HBM after the last layer: no layer reads another
        # layer's cache, so the writes can wait, and the layer loop only ever reads the cache.
        # (Writes inside the loop made the generic interpreter copy the whole cache per write.)
        write_back = []
        for b in range(B):
            for j, (src, dst) in enumerate(((newk, kc_out), (newv, vc_out))):
                slot = pos_s[b] - (1 if kn.odd_rows_write_early and b % 2 else 0)  # odd rows: one slot early
                cp = pltpu.make_async_copy(src.at[:, b], dst.at[:, b, :, pl.ds(slot, 1), :], sem_wb.at[j, b])
                cp.start()
                write_back.append(cp)
        for cp in write_back:
            cp.wait()

    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    in_specs = [smem, smem] + [vmem] * 6 + [any_spec] * (len(streamed) + len(ek) + len(dk)) + [any_spec, any_spec]
    out_specs = (vmem, any_spec, any_spec, vmem)
    n_in = len(in_specs)
    scratch = [pltpu.VMEM(hbm[k].shape[1:], hbm[k].dtype) for _ in range(nb) for k in streamed]
    scratch += [pltpu.SemaphoreType.DMA((nb, len(streamed))),
                *[pltpu.VMEM((B, K, TS, hd), kvd) for _ in range(4)],  # K and V tiles, 2 slots each
                pltpu.SemaphoreType.DMA((2, 2)), pltpu.SemaphoreType.DMA((2, B)),
                pltpu.VMEM((B, H * hd), F32),
                pltpu.VMEM((L, B, K, 1, hd), kvd), pltpu.VMEM((L, B, K, 1, hd), kvd)]
    if ek:  # two routed-expert slots, the chosen ids (lanes), their semaphores
        scratch += [pltpu.VMEM(hbm[k].shape[2:], hbm[k].dtype) for _ in range(2) for k in ek]
        scratch += [pltpu.VMEM((1, max(128, n_slots)), jnp.int32), pltpu.SemaphoreType.DMA((2, len(ek)))]
    if dk:  # two MLP chunk slots and their semaphores
        scratch += [pltpu.VMEM(hbm[k].shape[2:], hbm[k].dtype) for _ in range(2) for k in dk]
        scratch += [pltpu.SemaphoreType.DMA((2, 3))]
    out_shape = (jax.ShapeDtypeStruct((B, D), F32), jax.ShapeDtypeStruct(k_cache.shape, kvd),
                 jax.ShapeDtypeStruct(v_cache.shape, kvd),
                 jax.ShapeDtypeStruct((L if spec.want_taps else 1, B, D), F32))
    call = pl.pallas_call(kernel, out_shape=out_shape, in_specs=in_specs, out_specs=out_specs,
                          scratch_shapes=scratch, input_output_aliases={n_in - 2: 1, n_in - 1: 2},
                          interpret=spec.interpret, name="decode_megakernel",
                          compiler_params=pltpu.CompilerParams(vmem_limit_bytes=spec.vmem_limit))
    return call(pos, jnp.asarray(kinds, jnp.int32), x, pos[:, None], *[rope[k] for k in ROPE_KEYS],
                *[hbm[k] for k in streamed + ek + dk], k_cache, v_cache)
