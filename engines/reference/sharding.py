"""The reference on a JAX mesh: named axes dp (batch rows), tp (heads and MLP columns), ep (experts).

The math is untouched (engines.reference.model): the weights are placed on the mesh with NamedSharding and XLA's
SPMD partitioner splits every computation that reads them (GSPMD), inserting the collectives. What each weight's
PartitionSpec is:

    wq, wk, wv, wg, bq, bk, bv  columns (heads) over tp  wo               rows (heads) over tp
    gate, up                 columns over tp             down             rows over tp
    e_gate, e_up, e_*_b      experts over ep, columns over tp; e_down experts over ep, rows over tp
    sinks                    heads over tp               everything else  replicated

A mesh that does not divide the model (heads, KV heads, MLP width, experts) or needs more devices than exist
is a one-line ModelError. Lazy weights (an HF safetensors directory loaded while a mesh is set: engines.lazy)
go straight into their shards (place_lazy): a process reads only its devices' slices. GGUF files are
dequantised whole on load (a quantised block does not split along a shard boundary in general), so every
process reads them whole. The KV cache is sharded too: KV heads over tp, batch rows over dp where the row
count divides (engines.reference.engine constrains every step's caches with cache_spec); a Gated DeltaNet layer's
state likewise, its channels or value heads over tp where tp divides them (its weights are replicated). What the
host reads back (the head's next ids, top-k and logits) is constrained to be replicated, so every process of a
multi-process run (jax.distributed) holds all of it.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from engines.config import Config
from engines.errors import ModelError

AXES = ("dp", "ep", "tp")
_P = PartitionSpec
SPECS = {  # per-layer array name -> PartitionSpec of one layer's array
    "wq": _P(None, "tp"), "wk": _P(None, "tp"), "wv": _P(None, "tp"), "wo": _P("tp", None), "wg": _P(None, "tp"),
    "bq": _P("tp"), "bk": _P("tp"), "bv": _P("tp"), "sinks": _P("tp"),
    "gate": _P(None, "tp"), "up": _P(None, "tp"), "down": _P("tp", None),
    "e_gate": _P("ep", None, "tp"), "e_up": _P("ep", None, "tp"), "e_down": _P("ep", "tp", None),
    "e_gate_b": _P("ep", "tp"), "e_up_b": _P("ep", "tp"), "e_down_b": _P("ep", None),
}


def parse_mesh(text: str) -> dict[str, int]:
    """"tp=4,ep=2" -> {"dp": 1, "ep": 2, "tp": 4}."""
    sizes = {a: 1 for a in AXES}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, value = part.partition("=")
        if name not in AXES or not value.isdigit() or int(value) < 1:
            raise ModelError(f"bad mesh part {part!r}: expected AXIS=SIZE with AXIS one of {', '.join(AXES)}")
        sizes[name] = int(value)
    return sizes


def make_mesh(sizes: dict[str, int], c: Config) -> Mesh:
    need = math.prod(sizes.values())
    devices = jax.devices()
    if need > len(devices):
        raise ModelError(f"mesh {sizes} needs {need} devices, {len(devices)} exist (on CPU: "
                         "XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    tp, ep = sizes["tp"], sizes["ep"]
    checks = [("attention heads", c.n_heads, tp), ("KV heads", c.n_kv_heads, tp)]
    if c.n_dense_layers:
        checks.append(("MLP width", c.ffn, tp))
    if c.n_moe_layers:
        checks += [("experts", c.n_experts, ep), ("expert MLP width", c.moe_ffn, tp)]
    elif ep > 1:
        raise ModelError(f"mesh ep={ep}: {c.name} has no experts")
    for what, n, k in checks:
        if n % k:
            raise ModelError(f"mesh does not divide {c.name}: {what} {n} is not a multiple of {k}")
    return Mesh(np.array(devices[:need]).reshape([sizes[a] for a in AXES]), AXES)


def cache_spec(mesh: Mesh, shape: tuple[int, ...]) -> PartitionSpec:
    """A [rows, K, slots, hd] cache: K over tp; rows over dp when dp divides them (else replicated rows). A
    recurrent layer's state ([rows, channels, taps] or [rows, heads, dk, dv]): axis 1 over tp where tp divides it."""
    rows = "dp" if shape[0] % mesh.shape["dp"] == 0 else None
    return _P(rows, "tp" if shape[1] % mesh.shape["tp"] == 0 else None, *([None] * (len(shape) - 2)))


def constrain_step(fn, mesh: Mesh | None):
    """fn(...) -> (logits, kc, vc), traced under jit: the logits replicated and the per-layer caches by
    cache_spec. The identity when mesh is None."""
    if mesh is None:
        return fn

    def wrapped(*args, **kwargs):
        logits, kc, vc = fn(*args, **kwargs)
        return (replicate(logits, mesh), constrain_caches(kc, mesh), constrain_caches(vc, mesh))

    return wrapped


def constrain_caches(caches: list, mesh: Mesh | None) -> list:
    if mesh is None:
        return caches
    return [jax.lax.with_sharding_constraint(x, NamedSharding(mesh, cache_spec(mesh, x.shape))) for x in caches]


def replicate(x, mesh: Mesh | None):
    """Inside jit: x replicated on every device (a multi-process run's host reads it in every process)."""
    if mesh is None or x is None:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, _P()))


def host_input(x, mesh: Mesh):
    """A host array as a global array replicated over the mesh (each process passes the same value)."""
    return jax.device_put(np.asarray(x), NamedSharding(mesh, _P()))


def place_lazy(arrays, mesh: Mesh, dtype_of, whole: tuple[str, ...]) -> dict:
    """device_params' dict on the mesh, from engines.lazy.LazyArrays (engines.lazy.as_lazy wraps in-memory
    weights), every array placed by SPECS: each array is built with
    jax.make_array_from_callback, which asks for the slice each of this process's devices holds, so only those
    slices are read from the files (a shard's 1/tp of a tensor-parallel weight; replicated arrays whole, once
    per process). dtype_of(name): the device dtype; whole: the names kept as one array (not per layer)."""
    def build(name: str, layer: int | None):
        lz = arrays.lazy(name)
        shape = lz.shape if layer is None else lz.shape[1:]
        spec = _P() if layer is None else SPECS.get(name, _P())
        memo: dict[str, np.ndarray] = {}  # devices holding the same slice (replicas) read it once

        def read(idx):
            key = repr(idx)
            if key not in memo:
                memo[key] = np.asarray(lz[idx] if layer is None else lz[(layer, *idx)]).astype(dtype_of(name))
            return memo[key]

        return jax.make_array_from_callback(shape, NamedSharding(mesh, spec), read)

    return {k: build(k, None) if k in whole else [build(k, i) for i in range(arrays.shape(k)[0])] for k in arrays}


def placement(params: dict, mesh: Mesh) -> dict:
    """The mesh, the process count, and the weight bytes held by this process's devices against the whole
    model's (1/tp of each tensor-parallel weight per tp shard; replicated arrays count in full)."""
    arrays = [x for v in params.values() for x in (v if isinstance(v, list) else [v])]
    local = sum(s.data.nbytes for a in arrays for s in a.addressable_shards)
    return {"mesh": dict(mesh.shape), "processes": jax.process_count(), "devices": mesh.size,
            "local_devices": len({d for d in mesh.devices.flat if d.process_index == jax.process_index()}),
            "param_bytes": sum(a.nbytes for a in arrays), "local_param_bytes": local}
