"""The reference on a JAX mesh: named axes dp (batch rows), tp (heads and MLP columns), ep (experts).

The math is untouched (engines.reference.model): the weights are placed on the mesh with NamedSharding and XLA's
SPMD partitioner splits every computation that reads them (GSPMD), inserting the collectives. What each weight's
PartitionSpec is:

    wq, wk, wv, bq, bk, bv   columns (heads) over tp     wo               rows (heads) over tp
    gate, up                 columns over tp             down             rows over tp
    e_gate, e_up, e_*_b      experts over ep, columns over tp; e_down experts over ep, rows over tp
    sinks                    heads over tp               everything else  replicated

A mesh that does not divide the model (heads, KV heads, MLP width, experts) or needs more devices than exist
is a one-line ModelError. Not done here yet: loading weights straight into their shards (the loaders
materialise each array on the host first) and sharding the KV cache (it is replicated; GSPMD reshards it).
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
    "wq": _P(None, "tp"), "wk": _P(None, "tp"), "wv": _P(None, "tp"), "wo": _P("tp", None),
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


def place(params: dict, mesh: Mesh) -> dict:
    """device_params' dict (per-layer lists) with every array put on the mesh by SPECS."""
    def put(name: str, a):
        return jax.device_put(a, NamedSharding(mesh, SPECS.get(name, _P())))

    return {k: ([put(k, x) for x in v] if isinstance(v, list) else put(k, v)) for k, v in params.items()}
