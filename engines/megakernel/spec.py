"""The megakernel's static facts: which weight stacks it streams and in what dtype, and the spec of one compiled
decode step (shapes, tiles, buffers, the fault's knobs). Shared by the kernel, its VMEM budget and the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp

from engines.config import Config
from engines.megakernel.faults import Knobs


def attn_keys(c: Config) -> tuple[str, ...]:
    return ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm") + (("q_norm", "k_norm") if c.qk_norm else ())


def dense_keys(c: Config) -> tuple[str, ...]:
    return ("gate", "up", "down") if c.n_dense_layers else ()


def moe_keys(c: Config) -> tuple[str, ...]:
    """A MoE layer's arrays streamed whole per layer (the routed experts stream one by one: expert_keys)."""
    if not c.n_moe_layers:
        return ()
    shared = ("s_gate", "s_up", "s_down") if c.n_shared_experts else ()
    return ("router", "router_bias") + shared


def expert_keys(c: Config) -> tuple[str, ...]:
    return ("e_gate", "e_up", "e_down") if c.n_moe_layers else ()


def streamed_keys(c: Config) -> tuple[str, ...]:
    """The per-layer weight stacks the kernel streams from HBM whole, in its order."""
    return attn_keys(c) + dense_keys(c) + moe_keys(c)


def expert_slots(spec) -> int:
    """Routed-expert copies a MoE layer can need at most: every row's top-k distinct, or all experts."""
    c = spec.config
    return min(c.n_experts, spec.batch * c.top_k)


KEEP_F32 = ("attn_norm", "mlp_norm", "q_norm", "k_norm", "router", "router_bias")  # tiny, precision-critical


def hbm_dtype(key: str, dtype: str) -> str:
    """A streamed array's dtype in the mode `dtype` (bf16 mode: bf16 matrices; norms and the router float32)."""
    return "float32" if key in KEEP_F32 else dtype


def hbm_arrays(w, dtype: str) -> dict:
    """The kernel's HBM-resident per-layer stacks (w: engines.weights.Weights): vectors become [n, 1, X] rows."""
    out = {}
    for k in streamed_keys(w.config) + expert_keys(w.config):
        a = w.arrays[k]
        if k.endswith("norm") or k == "router_bias":
            a = a[:, None, :]
        out[k] = jnp.asarray(a, jnp.dtype(hbm_dtype(k, dtype)))
    return out


@dataclass(frozen=True)
class KernelSpec:
    """Static facts of one compiled decode step."""

    config: Config
    batch: int
    slots: int  # KV cache positions per row
    tile: int  # attention tile (cache positions per online-softmax step); divides window
    window: int = 0  # cache positions each layer reads (every row's position is below it); 0: all slots
    knobs: Knobs = Knobs()  # a fault's decode-step knobs (a self-test aid; the defaults: faithful)
    fault_layer: int = 0  # the layer drop_layer skips
    n_buffers: int = 2  # weight buffers; 1 exists only as the race detector's negative control
    want_taps: bool = False
    interpret: Any = True  # True: generic interpreter; pltpu.InterpretParams: TPU interpret mode
    kv_buffers: int = 2  # KV tile buffers; 1 (the next tile copied over the one being read) is the same control
    vmem_limit: int | None = None  # bytes, passed to Mosaic (engines.megakernel.budget); None: Mosaic's default
