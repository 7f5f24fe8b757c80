"""The pallas_call around the decode kernel's body (engines.megakernel.kernel): its inputs in the body's order, and
the scratch it declares, which the VMEM budget (engines.megakernel.budget) counts buffer by buffer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from engines.megakernel.spec import (
    KernelSpec,
    cache_dims,
    dense_keys,
    expert_keys,
    expert_slots,
    kv_layers,
    streamed_keys,
)

F32 = jnp.float32
ROPE_KEYS = ("first_q", "freq_q", "first_k", "freq_k")


def pallas_call(spec: KernelSpec, kernel, hbm: dict, keys: tuple, table, x, pos, k_cache, v_cache, rope, state):
    """The pallas_call: its inputs in the kernel's order, the scratch it declares (what the VMEM budget counts)."""
    c = spec.config
    B, D, L, hd, H, nb = spec.batch, c.hidden, c.n_layers, c.head_dim, c.n_heads, spec.n_buffers
    R, T = spec.rows, spec.block  # query rows; each cache row's block tokens
    Lkv, kvd, (Kc, dkc, dvc) = kv_layers(c), jnp.dtype(spec.kv_dtype), cache_dims(c, spec.mla)
    streamed, ek, dk = streamed_keys(c, spec.mla), expert_keys(c, spec.experts), dense_keys(c)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    n_state = len(state)
    in_specs = [smem, smem] + [vmem] * 7 + [any_spec] * (len(keys) + 2 + n_state)
    NB = -(-L // c.attn_res_block) if c.attn_res_block else 0  # K3: the depth mixture's blocks, an output
    n_snap = n_state if T > 1 else 0  # a verify step's state snapshots after each block token
    routes = spec.want_taps and c.n_moe_layers > 0  # with taps: each MoE layer's gates, the routing it chose
    out_specs = (vmem, any_spec, any_spec, vmem) + (any_spec,) * n_state + ((vmem,) if NB else ()) \
        + (any_spec,) * n_snap + ((vmem,) if routes else ())
    n_in = len(in_specs)
    scratch = [pltpu.VMEM(hbm[k].shape[1:], hbm[k].dtype) for _ in range(nb) for k in streamed]
    scratch += [pltpu.SemaphoreType.DMA((nb, len(streamed))),
                *[pltpu.VMEM((B, Kc, spec.tile, d), kvd) for d in (dkc, dkc, dvc, dvc)],  # K and V tiles, 2 slots each
                pltpu.SemaphoreType.DMA((2, 2)), pltpu.SemaphoreType.DMA((2, R)),
                pltpu.VMEM((R, H * hd), F32),
                pltpu.VMEM((Lkv, R, Kc, 1, dkc), kvd), pltpu.VMEM((Lkv, R, Kc, 1, dvc), kvd)]
    if ek:  # two routed-expert slots, the chosen ids (lanes), their semaphores
        n_slots = expert_slots(spec)
        scratch += [pltpu.VMEM(hbm[k].shape[2:], hbm[k].dtype) for _ in range(2) for k in ek]
        scratch += [pltpu.VMEM((1, max(128, n_slots)), jnp.int32), pltpu.SemaphoreType.DMA((2, len(ek)))]
    if dk:  # two MLP chunk slots and their semaphores
        scratch += [pltpu.VMEM(hbm[k].shape[2:], hbm[k].dtype) for _ in range(2) for k in dk]
        scratch += [pltpu.SemaphoreType.DMA((2, 3))]
    if state:  # each recurrent kind's state pair per weight slot, their read and write semaphores, writes out
        scratch += [pltpu.VMEM(a.shape[1:], a.dtype) for _ in range(nb) for a in state]
        scratch += [pltpu.SemaphoreType.DMA((nb, 2 * n_state)), pltpu.SMEM((nb,), jnp.int32)]
    if n_snap:  # each state array's T snapshots, staged for one copy out a layer
        scratch += [pltpu.VMEM((T, *a.shape[1:]), a.dtype) for a in state] + [pltpu.SemaphoreType.DMA((n_state,))]
    out_shape = (jax.ShapeDtypeStruct((R, D), F32), jax.ShapeDtypeStruct(k_cache.shape, kvd),
                 jax.ShapeDtypeStruct(v_cache.shape, kvd),
                 jax.ShapeDtypeStruct((L if spec.want_taps else 1, R, D), F32),
                 *[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in state],
                 *([jax.ShapeDtypeStruct((NB, R, D), F32)] if NB else []),
                 *[jax.ShapeDtypeStruct((a.shape[0], T, *a.shape[1:]), a.dtype) for a in state[:n_snap]],
                 *([jax.ShapeDtypeStruct((c.n_moe_layers, R, c.n_experts), F32)] if routes else []))
    aliases = {n_in - 2 - n_state + j: 1 + j for j in range(2)} | {n_in - n_state + j: 4 + j for j in range(n_state)}
    call = pl.pallas_call(kernel, out_shape=out_shape, in_specs=in_specs, out_specs=out_specs,
                          scratch_shapes=scratch, input_output_aliases=aliases,
                          interpret=spec.interpret, name="decode_megakernel",
                          compiler_params=pltpu.CompilerParams(vmem_limit_bytes=spec.vmem_limit))
    blk = pos.reshape(B, T)  # each cache row's block's positions
    return call(pos, jnp.asarray(table, jnp.int32), x, pos[:, None], blk, *[rope[k] for k in ROPE_KEYS],
                *[hbm[k] for k in keys], k_cache, v_cache, *state)
