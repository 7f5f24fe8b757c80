"""What one decode step of the megakernel holds in a TensorCore's VMEM, from its static spec alone.

Every buffer the kernel declares (its VMEM inputs and outputs, the double-buffered weights of one layer, the
KV tiles, the staging of new K/V slots) at Mosaic's tiled size: the last two dimensions padded to (8 x 32-bit
sublanes, 128 lanes), i.e. 8 rows for float32, 16 for bfloat16. The declared part is checked against the Mosaic
module a TPU lowering carries (tests/engines/megakernel/test_tpu.py); the live values (a layer's largest
intermediates, which Mosaic keeps in vregs or spills to VMEM) are an estimate, labelled as one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engines.config import Config
from engines.megakernel import recurrent
from engines.megakernel.spec import (
    EXPERT_VECTORS,
    KernelSpec,
    cache_dims,
    dense_keys,
    expert_keys,
    expert_slots,
    hbm_dtype,
    kv_layers,
    mlp_chunks,
    streamed_keys,
)
from engines.megakernel.tpu import DEFAULT_CHIP, chip
from engines.weights import expected_shapes

LANES = 128
SUBLANE_BYTES = 32  # a vreg's 8 sublanes of 32 bits: 8 float32 rows, 16 bfloat16 rows per tile
MIB = 1 << 20
# The limit passed to Mosaic is the budget plus this share, for temporaries Mosaic allocates beyond the buffers
# the kernel declares and the live values estimated here. Not measured: the MINI families compiled within it on a
# TPU v5e (docs/tpu.md), which shows it was enough for them, not what Mosaic took.
MOSAIC_SLACK = 0.25
# A verify step (spec.block > 1) makes Mosaic allocate temporaries the buffers and live values above do not cover:
# its scoped VMEM on a TPU v5e exceeded the declared buffers by 2.0, 3.4 and 6.0-6.5 MiB at 2, 4 and 8 cache rows
# (mini-llama float32, T 2 and 4, a 128-slot tile; `python -m interop.tpu_verify_probe`), and the 25% slack did not
# hold it. About six float32 KV tiles a cache row; counted as that many (one model's measurement, not a law).
VERIFY_TILES = 6


def tiled_bytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of a VMEM buffer in Mosaic's native tiling (a rank-1 buffer as one row)."""
    item = np.dtype(dtype).itemsize if dtype != "bfloat16" else 2
    dims = (1, *shape) if len(shape) == 1 else tuple(shape)
    rows = -(-dims[-2] // (SUBLANE_BYTES // item)) * (SUBLANE_BYTES // item)
    cols = -(-dims[-1] // LANES) * LANES
    return int(np.prod(dims[:-2], dtype=np.int64)) * rows * cols * item


@dataclass(frozen=True)
class Item:
    group: str  # weights | mlp chunks | experts | kv tiles | activations | staging | live (estimate)
    name: str
    shape: tuple[int, ...]
    dtype: str
    count: int = 1  # buffers of this shape (2 for double-buffered weights)

    @property
    def bytes(self) -> int:
        return self.count * tiled_bytes(self.shape, self.dtype)


@dataclass(frozen=True)
class Budget:
    """A decode step's VMEM, by buffer, against one chip."""

    items: tuple[Item, ...]
    chip: str
    capacity: int  # the chip's VMEM per TensorCore

    @property
    def declared(self) -> int:
        """The buffers the kernel declares (what Mosaic is asked to allocate, tiled)."""
        return sum(i.bytes for i in self.items if i.group != "live (estimate)")

    @property
    def total(self) -> int:
        return sum(i.bytes for i in self.items)

    @property
    def limit(self) -> int:
        """The VMEM limit passed to Mosaic: the total and its slack, in whole MiB."""
        return -(-int(self.total * (1 + MOSAIC_SLACK)) // MIB) * MIB

    @property
    def fits(self) -> bool:
        return self.limit <= self.capacity

    def by_group(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in self.items:
            out[i.group] = out.get(i.group, 0) + i.bytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def refusal(self, what: str) -> str | None:
        """One line saying why `what` cannot run on this chip and what to shrink; None when it fits."""
        if self.fits:
            return None
        groups = self.by_group()
        top = next(iter(groups))
        shrink = {"weights": "use bfloat16 weights (the kernel streams a layer's attention weights whole: no "
                             "tiles of them yet)", "experts": "use bfloat16 weights (an expert streams whole)",
                  "mlp chunks": "use bfloat16 weights",
                  "kv tiles": "use a smaller batch or attention tile",
                  "live (estimate)": "use a smaller batch",
                  "staging": "use a smaller batch", "activations": "use a smaller batch",
                  "recurrent state": "use a smaller batch"}[top]
        parts = ", ".join(f"{g} {mib(b)}" for g, b in groups.items())
        return (f"{what} needs {mib(self.limit)} of VMEM with Mosaic's slack on TPU {self.chip} "
                f"({mib(self.capacity)} a TensorCore): {parts}; {shrink}, or name a chip with more VMEM "
                f"(--engine-option chip=...)")

    def to_dict(self) -> dict:
        return {"chip": self.chip, "capacity_bytes": self.capacity, "declared_bytes": self.declared,
                "total_bytes": self.total, "limit_bytes": self.limit, "fits": self.fits, "by_group": self.by_group(),
                "items": [{"group": i.group, "name": i.name, "shape": list(i.shape), "dtype": i.dtype,
                           "count": i.count, "bytes": i.bytes} for i in self.items]}


def mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def items(spec: KernelSpec, dtype: str) -> tuple[Item, ...]:
    """Every VMEM buffer of the kernel `spec` builds with weights in `dtype`, and the live-value estimate."""
    c: Config = spec.config
    B, D, L, K, hd, H, TS = spec.batch, c.hidden, c.n_layers, c.n_kv_heads, c.head_dim, c.n_heads, spec.tile
    R, T = spec.rows, spec.block  # query rows (a verify step's T a cache row); B: cache rows
    shapes = expected_shapes(c)
    out = [Item("activations", "x in", (R, D), "float32"), Item("activations", "positions", (R, 1), "int32"),
           Item("activations", "block positions", (B, T), "int32"),
           Item("activations", "rope q (first)", (1, H * hd), "float32"),
           Item("activations", "rope q (freq: full, sliding)", (2, H * hd), "float32"),
           Item("activations", "rope k (first)", (1, K * hd), "float32"),
           Item("activations", "rope k (freq: full, sliding)", (2, K * hd), "float32"),
           Item("activations", "x out", (R, D), "float32"),
           Item("activations", "taps", (L if spec.want_taps else 1, R, D), "float32")]
    if spec.want_taps and c.n_moe_layers:  # with taps, the gates each MoE layer chose (a routing replay's)
        out.append(Item("activations", "routes", (c.n_moe_layers, R, c.n_experts), "float32"))
    for kind in recurrent.kinds(c):  # the engine's fused layout of the linear-attention layers
        shapes |= {k: (0, *v) for k, v in recurrent.shapes(c, kind).items()}
    if spec.mla == "absorbed" and c.mla_layers:  # W_kvb's columns per head (engines.megakernel.mla)
        lx, H_, rk = len(c.mla_layers), c.n_heads, c.mla_kv_rank
        shapes |= {"mla_uk": (lx, H_, rk, c.mla_nope_dim), "mla_uv": (lx, H_, rk, c.mla_v_dim)}
    for k in streamed_keys(c, spec.mla):
        shape = shapes[k][1:]
        out.append(Item("weights", k, (1, *shape) if len(shape) == 1 else shape, hbm_dtype(k, dtype, len(shape)),
                        spec.n_buffers))
    n = mlp_chunks(c, dtype)
    for k in dense_keys(c):
        D, F = (shapes[k][2], shapes[k][1]) if k == "down" else (shapes[k][1], shapes[k][2])
        out.append(Item("mlp chunks", k, (F // n, D) if k == "down" else (D, F // n), dtype, 2))
    for k in expert_keys(c, spec.experts):
        vector = k in EXPERT_VECTORS
        shape = (1, *shapes[k][2:]) if vector else shapes[k.removesuffix("_q").removesuffix("_s")][2:]
        if k.endswith(("_q", "_s")):  # MXFP4: codes two a byte, a scale byte per 32 rows
            shape = (shape[0] // (2 if k.endswith("_q") else 32), shape[1])
        out.append(Item("experts", k, shape, hbm_dtype(k, dtype, 1 if vector else 2), 2))
    if expert_keys(c):
        out.append(Item("activations", "chosen expert ids", (1, max(LANES, expert_slots(spec))), "int32"))
    Kc, dkc, dvc = cache_dims(c, spec.mla)
    out += [Item("kv tiles", "K tiles", (B, Kc, TS, dkc), spec.kv_dtype, 2),
            Item("kv tiles", "V tiles", (B, Kc, TS, dvc), spec.kv_dtype, 2),
            Item("activations", "attention out", (R, H * hd), "float32"),
            Item("staging", "new K slots", (kv_layers(c), R, Kc, 1, dkc), spec.kv_dtype),
            Item("staging", "new V slots", (kv_layers(c), R, Kc, 1, dvc), spec.kv_dtype)]
    if c.attn_res_block:  # K3: the depth mixture's finished blocks, an output of the kernel
        out.append(Item("activations", "depth-mixture blocks", (-(-L // c.attn_res_block), R, D), "float32"))
    for kind in recurrent.kinds(c):  # each weight slot's state pair, read and written back from it
        hist, st = recurrent.state_shapes(c, kind, B)
        out += [Item("recurrent state", f"{kind.upper()} conv history", hist[1:], "float32", spec.n_buffers),
                Item("recurrent state", f"{kind.upper()} delta-rule state", st[1:], "float32", spec.n_buffers)]
        if T > 1:  # a verify step's snapshots after each block token, staged for their copy out
            out += [Item("recurrent state", f"{kind.upper()} {what} snapshots", (T, *a[1:]), "float32")
                    for what, a in (("conv history", hist), ("delta-rule state", st))]
    if T > 1:  # a verify step: Mosaic's own temporaries beyond the declared buffers, per VERIFY_TILES
        out.append(Item("live (estimate)", "verify step temporaries", (VERIFY_TILES * B * Kc, TS, max(dkc, dvc)),
                        "float32"))
    f = max(c.ffn if c.n_dense_layers else 0, c.moe_ffn if c.n_moe_layers else 0)
    out += [Item("live (estimate)", "MLP activations (gate, up, product)", (R, f), "float32", 3),
            Item("live (estimate)", "q, scores and accumulator", (R * H, max(hd, TS)), "float32", 3),
            Item("live (estimate)", "residual, normed, output", (R, D), "float32", 3)]
    return tuple(out)


def budget(spec: KernelSpec, dtype: str, chip_name: str = DEFAULT_CHIP) -> Budget:
    return Budget(items(spec, dtype), chip_name, chip(chip_name).vmem_bytes)

