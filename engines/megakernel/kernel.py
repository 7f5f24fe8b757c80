"""One decode step of every layer as ONE pallas_call.

Weights stay in HBM (memory_space=ANY) as per-layer stacks and are copied into VMEM scratch with
async copies and DMA semaphores, double-buffered: layer l+1's weights load while layer l computes.
Per layer, inside the kernel: RMSNorm, QKV projection, RoPE, KV-cache append (only the new slot
is written back to HBM), attention over the cache in tiles under an online softmax, output
projection, residual, then the dense SwiGLU MLP or the MoE (router, top-k, routed experts, shared
expert), residual. The embedding gather runs before the kernel and the final norm + LM head after
it, in XLA, as the Kimi K3 TPU megakernel does: the LM head ([V, D], 113 MB in f32 for SmolLM2)
does not fit VMEM next to a layer, and it is one memory-bound matmul XLA already does well.

Routed experts: every expert of a layer is streamed and evaluated, weighted by the (sparse) gate;
right for the small expert counts tested here, wasteful for a 384-expert model, where a real
kernel streams only the chosen experts.

On a TPU this kernel is meant to be a Mosaic candidate (no grid, ANY/VMEM/SMEM refs, DMAs on
leading-axis slices); it is untested on TPU hardware. Here it runs in Pallas interpret mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from engines.config import Config
from engines.megakernel import ops

F32 = jnp.float32
FAULTS = ("rope_off_by_one", "kv_stale", "drop_layer", "bf16_residual", "router_second_choice")


def attn_keys(c: Config) -> tuple[str, ...]:
    return ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm") + (("q_norm", "k_norm") if c.qk_norm else ())


def dense_keys(c: Config) -> tuple[str, ...]:
    return ("gate", "up", "down") if c.n_dense_layers else ()


def moe_keys(c: Config) -> tuple[str, ...]:
    if not c.n_moe_layers:
        return ()
    shared = ("s_gate", "s_up", "s_down") if c.n_shared_experts else ()
    return ("router", "router_bias", "e_gate", "e_up", "e_down") + shared


@dataclass(frozen=True)
class KernelSpec:
    """Static facts of one compiled decode step."""

    config: Config
    batch: int
    slots: int  # KV cache positions per row
    tile: int  # attention tile (cache positions per online-softmax step); divides slots
    fault: str | None = None
    fault_layer: int = 0  # the layer drop_layer skips
    n_buffers: int = 2  # weight buffers; 1 exists only as the race detector's negative control
    want_taps: bool = False
    interpret: Any = True  # True: generic interpreter; pltpu.InterpretParams: TPU interpret mode


def decode_layers(spec: KernelSpec, hbm: dict, x: jax.Array, pos: jax.Array, k_cache: jax.Array,
                  v_cache: jax.Array, rope: dict):
    """x [B, D] float32 (embedded tokens), pos [B] int32 (the slot each row writes).
    k_cache, v_cache [L, B, K, S, hd] float32, updated in place (aliased).
    rope: perm_q, freq_q, perm_k, freq_k from ops.rope_tables.
    Returns x [B, D] after the last layer, k_cache, v_cache, taps [L, B, D] (zeros if not wanted).
    """
    c = spec.config
    B, D, L, K, hd = spec.batch, c.hidden, c.n_layers, c.n_kv_heads, c.head_dim
    H, G, S, TS, nb = c.n_heads, c.n_heads // c.n_kv_heads, spec.slots, spec.tile, spec.n_buffers
    Ld, Lm = c.n_dense_layers, c.n_moe_layers
    ak, dk, mk = attn_keys(c), dense_keys(c), moe_keys(c)
    streamed = ak + dk + mk
    assert S % TS == 0 and 1 <= nb <= 2

    def kernel(*refs):
        pos_s, x_in, pos_v, perm_q, freq_q, perm_k, freq_k = refs[:7]
        i = 7
        w = dict(zip(streamed, refs[i:i + len(streamed)]))
        i += len(streamed)
        kc_in, vc_in = refs[i:i + 2]
        x_out, kc_out, vc_out, taps_out = refs[i + 2:i + 6]
        i += 6
        buf = dict(zip(streamed, refs[i:i + len(streamed)]))
        i += len(streamed)
        sem_w, kbuf, vbuf, sem_kv, sem_wb, attn_buf = refs[i:i + 6]
        del kc_in, vc_in  # aliased to kc_out/vc_out: all reads and writes go through the outputs

        def copies(keys, idx, slot):
            return [pltpu.make_async_copy(w[k].at[idx], buf[k].at[slot], sem_w.at[slot, streamed.index(k)])
                    for k in keys]

        def start(keys, idx, slot):
            for cp in copies(keys, idx, slot):
                cp.start()

        def wait(keys, idx, slot):
            for cp in copies(keys, idx, slot):
                cp.wait()

        start(ak, 0, 0)
        start(dk if Ld else mk, 0, 0)
        x_out[...] = x_in[...]
        scale = 1.0 / (hd ** 0.5)

        def layer(l, carry):
            s = l % nb
            k_load = pltpu.make_async_copy(kc_out.at[l], kbuf, sem_kv.at[0])
            v_load = pltpu.make_async_copy(vc_out.at[l], vbuf, sem_kv.at[1])
            k_load.start()
            v_load.start()
            wait(ak, l, s)

            @pl.when(l + 1 < L)
            def _():
                start(ak, l + 1, (l + 1) % nb)

            x = x_out[...]
            h = ops.rmsnorm(x, buf["attn_norm"][s], c.rms_eps)
            q = ops.mm(h, buf["wq"][s])  # [B, H*hd]
            k = ops.mm(h, buf["wk"][s])  # [B, K*hd]
            v = ops.mm(h, buf["wv"][s])
            if c.qk_norm:
                q = ops.rmsnorm(q.reshape(B * H, hd), buf["q_norm"][s], c.rms_eps).reshape(B, H * hd)
                k = ops.rmsnorm(k.reshape(B * K, hd), buf["k_norm"][s], c.rms_eps).reshape(B, K * hd)
            rpos = pos_v[...] + (1 if spec.fault == "rope_off_by_one" else 0)  # [B, 1]
            q = ops.rope(q, rpos, perm_q[...], freq_q[...])
            k = ops.rope(k, rpos, perm_k[...], freq_k[...])
            k_load.wait()
            v_load.wait()

            def append_new_kv():
                for b in range(B):
                    for kh in range(K):
                        kbuf[b, kh, pl.ds(pos_s[b], 1), :] = k[b:b + 1, kh * hd:(kh + 1) * hd]
                        vbuf[b, kh, pl.ds(pos_s[b], 1), :] = v[b:b + 1, kh * hd:(kh + 1) * hd]

            if spec.fault != "kv_stale":  # the fault: attention reads the cache before the append
                append_new_kv()
            for b in range(B):
                p = pos_s[b]
                for kh in range(K):
                    qg = jnp.concatenate([q[b:b + 1, (kh * G + g) * hd:(kh * G + g + 1) * hd]
                                          for g in range(G)], axis=0) * scale  # [G, hd]

                    def tile(t, mla, b=b, kh=kh, qg=qg, p=p):
                        m, lsum, acc = mla
                        kt = kbuf[b, kh, pl.ds(t * TS, TS), :]  # [TS, hd]
                        vt = vbuf[b, kh, pl.ds(t * TS, TS), :]
                        sc = jax.lax.dot_general(qg, kt, (((1,), (1,)), ((), ())),
                                                 preferred_element_type=F32)  # [G, TS]
                        col = t * TS + jax.lax.broadcasted_iota(jnp.int32, (G, TS), 1)
                        sc = jnp.where(col <= p, sc, -jnp.inf)
                        m_new = jnp.maximum(m, jnp.max(sc, axis=-1, keepdims=True))
                        alpha = jnp.exp(m - m_new)
                        pr = jnp.exp(sc - m_new)
                        lsum = lsum * alpha + jnp.sum(pr, axis=-1, keepdims=True)
                        acc = acc * alpha + jnp.dot(pr, vt, preferred_element_type=F32)
                        return m_new, lsum, acc

                    init = (jnp.full((G, 1), -jnp.inf, F32), jnp.zeros((G, 1), F32), jnp.zeros((G, hd), F32))
                    _, lsum, acc = jax.lax.fori_loop(0, p // TS + 1, tile, init)
                    out = acc / lsum
                    for g in range(G):
                        attn_buf[b:b + 1, pl.ds((kh * G + g) * hd, hd)] = out[g:g + 1]
            if spec.fault == "kv_stale":
                append_new_kv()
            write_back = []
            for b in range(B):
                for j, (src, dst) in enumerate(((kbuf, kc_out), (vbuf, vc_out))):
                    cp = pltpu.make_async_copy(src.at[b, :, pl.ds(pos_s[b], 1), :],
                                               dst.at[l, b, :, pl.ds(pos_s[b], 1), :], sem_wb.at[j, b])
                    cp.start()
                    write_back.append(cp)
            x = x + ops.mm(attn_buf[...], buf["wo"][s])
            h = ops.rmsnorm(x, buf["mlp_norm"][s], c.rms_eps)
            keep = (l != spec.fault_layer) if spec.fault == "drop_layer" else True

            if Ld:
                @pl.when(l < Ld)
                def _():
                    ds_ = l % nb
                    wait(dk, l, ds_)

                    @pl.when(l + 1 < Ld)
                    def _():
                        start(dk, l + 1, (l + 1) % nb)

                    if Lm:
                        @pl.when(l + 1 == Ld)
                        def _():
                            start(mk, 0, 0)

                    y = ops.swiglu(h, buf["gate"][ds_], buf["up"][ds_], buf["down"][ds_])
                    x_out[...] = x + jnp.where(keep, y, 0.0)

            if Lm:
                @pl.when(l >= Ld)
                def _():
                    m = l - Ld
                    ms = m % nb
                    wait(mk, m, ms)

                    @pl.when(m + 1 < Lm)
                    def _():
                        start(mk, m + 1, (m + 1) % nb)

                    logits = jnp.dot(h, buf["router"][ms], preferred_element_type=F32)  # [B, E]
                    gates = ops.pick_experts(logits, buf["router_bias"][ms], router=c.router,
                                             top_k=c.top_k, norm_topk=c.norm_topk, scale=c.routed_scale,
                                             skip_first=spec.fault == "router_second_choice")
                    y = jnp.zeros((B, D), F32)
                    for e in range(c.n_experts):
                        y = y + gates[:, e:e + 1] * ops.swiglu(h, buf["e_gate"][ms, e], buf["e_up"][ms, e],
                                                               buf["e_down"][ms, e])
                    if c.n_shared_experts:
                        y = y + ops.swiglu(h, buf["s_gate"][ms], buf["s_up"][ms], buf["s_down"][ms])
                    x_out[...] = x + jnp.where(keep, y, 0.0)

            if spec.fault == "bf16_residual":
                x_out[...] = x_out[...].astype(jnp.bfloat16).astype(F32)
            if spec.want_taps:
                taps_out[pl.ds(l, 1), :, :] = x_out[...][None]
            for cp in write_back:
                cp.wait()
            return carry

        jax.lax.fori_loop(0, L, layer, 0)

    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    in_specs = [smem] + [vmem] * 6 + [any_spec] * len(streamed) + [any_spec, any_spec]
    out_specs = (vmem, any_spec, any_spec, vmem)
    n_in = len(in_specs)
    scratch = [pltpu.VMEM((nb,) + hbm[k].shape[1:], hbm[k].dtype) for k in streamed]
    scratch += [pltpu.SemaphoreType.DMA((nb, len(streamed))),
                pltpu.VMEM((B, K, S, hd), F32), pltpu.VMEM((B, K, S, hd), F32),
                pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA((2, B)),
                pltpu.VMEM((B, H * hd), F32)]
    out_shape = (jax.ShapeDtypeStruct((B, D), F32), jax.ShapeDtypeStruct(k_cache.shape, F32),
                 jax.ShapeDtypeStruct(v_cache.shape, F32),
                 jax.ShapeDtypeStruct((L if spec.want_taps else 1, B, D), F32))
    call = pl.pallas_call(kernel, out_shape=out_shape, in_specs=in_specs, out_specs=out_specs,
                          scratch_shapes=scratch, input_output_aliases={n_in - 2: 1, n_in - 1: 2},
                          interpret=spec.interpret, name="decode_megakernel")
    return call(pos, x, pos[:, None], rope["perm_q"], rope["freq_q"], rope["perm_k"], rope["freq_k"],
                *[hbm[k] for k in streamed], k_cache, v_cache)
