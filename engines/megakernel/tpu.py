"""The megakernel and a TPU without one here: the chips' published limits, TPU interpret mode, and lowering
for TPU on this CPU host (jax.export with platforms=("tpu",)), read back from the Mosaic module it carries.

Lowering proves Pallas accepted the kernel for Mosaic (every ref, DMA, semaphore and vector op has a TPU
lowering) and shows what Mosaic is asked to allocate; it does not run Mosaic's own compiler passes (layout,
register allocation, the VMEM limit's check), which happen only when a TPU backend compiles the module.
"""

from __future__ import annotations

import base64
import json
import re
from collections import Counter
from dataclasses import dataclass

import jax
from jax.experimental.pallas import tpu as pltpu

# The generations a budget is printed for: jax's own table of each chip (pltpu.get_tpu_info_for_chip, jax 0.10.2:
# VMEM per TensorCore, HBM bandwidth per TensorCore). "v7" is jax's ChipVersion "7" (Ironwood).
CHIPS = {"v5e": "v5e", "v5p": "v5p", "v6e": "v6e", "v7": "7"}
DEFAULT_CHIP = "v7"  # the seed's chip (Inferact's Kimi K3 figures are on TPU v7)
KERNEL_NAME = "decode_megakernel"


@dataclass(frozen=True)
class Chip:
    name: str
    vmem_bytes: int  # per TensorCore
    hbm_bytes_per_s: float  # per TensorCore
    bf16_flops_per_s: float  # per TensorCore
    cores_per_chip: int  # TensorCores a chip has (v7 and v5p: 2; jax's table describes one)


CORES_PER_CHIP = {"v5e": 1, "v5p": 2, "v6e": 1, "v7": 2}  # published chip specs: v5p and Ironwood have 2 TCs a chip


def chip(name: str) -> Chip:
    if name not in CHIPS:
        raise ValueError(f"unknown TPU generation {name!r}; expected one of {', '.join(CHIPS)}")
    info = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion(CHIPS[name]), 1)
    return Chip(name, int(info.vmem_capacity_bytes), float(info.mem_bw_bytes_per_second),
                float(info.bf16_ops_per_second), CORES_PER_CHIP[name])


def tpu_interpret_params() -> pltpu.InterpretParams:
    """TPU interpret mode as the tests run it: DMAs execute at once (exposes use-before-wait) and
    the happens-before race detector is on."""
    return pltpu.InterpretParams(detect_races=True, dma_execution_mode="eager")


def races_found() -> bool:
    """Whether TPU interpret mode's race detector has flagged anything since its state was reset.
    (jax 0.10.2 keeps this in a private module; there is no public accessor.)"""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    return bool(ipc.races is not None and ipc.races.races_found)


def race_checks(interpret) -> list[dict]:
    """The race detector's finding, as the engine's self-check (engines.base.Engine.self_checks), when the kernel
    runs in TPU interpret mode with it on; [] in the other modes, where nothing checks for races."""
    if not (isinstance(interpret, pltpu.InterpretParams) and interpret.detect_races):
        return []
    found = races_found()
    return [{"name": "race detector (TPU interpret mode)", "ok": not found,
             "detail": "a DMA race was flagged in a kernel step this process ran" if found else
             "no DMA race in any kernel step this process ran (DMAs executed eagerly, happens-before tracked)"}]


@dataclass(frozen=True)
class Lowered:
    """One program lowered for TPU: its Mosaic kernels (by name) and what each asks for."""

    kernels: dict  # name -> MosaicKernel

    def kernel(self, name: str = KERNEL_NAME) -> MosaicKernel:
        return self.kernels[name]


@dataclass(frozen=True)
class MosaicKernel:
    name: str
    vmem_limit_bytes: int | None  # the limit the call passes to Mosaic (None: Mosaic's default)
    ops: Counter  # Mosaic op name -> count (tpu.enqueue_dma, tpu.matmul, tpu.dynamic_rotate, ...)
    args: tuple[tuple[tuple[int, ...], str, str], ...]  # every ref and scratch buffer: (shape, dtype, memory space)
    refused_reshapes: tuple[str, ...] = ()  # vector shape casts Mosaic's layout pass refuses (shape_cast_ok)


# Element widths of the vector types a Mosaic module's shape casts carry
_BITS = {"f32": 32, "i32": 32, "bf16": 16, "f16": 16, "i16": 16, "i8": 8, "i1": 1}


def shape_cast_ok(src: tuple[int, ...], dst: tuple[int, ...], bits: int) -> bool:
    """Whether Mosaic lays out a vector reshape src -> dst, by the rules seen on a TPU v5e (jax 0.10.2, about 160
    small kernels compiled there, f32 and bf16; docs/tpu.md): the lane (last) dim kept, with the dims above it
    regrouped at will; or the lane dim alone split or merged, every dim above it kept; or lanes that are multiples of
    128 on both sides. A trailing unit dim appended to 16-bit values is refused; in 32-bit it is implicit (GDN's
    (8, 2, 16) -> (16, 16) -> (16, 16, 1), folded into one cast, compiled there); any other change is refused."""
    if src == dst or (src and dst and src[-1] == dst[-1]):
        return True
    if dst and dst[-1] == 1 and bits < 32:
        return False
    if bits == 32 and (dst[-1:] == (1,) or src[-1:] == (1,)):  # a trailing unit dim is implicit in 32-bit layouts
        return shape_cast_ok(src[:-1] if src[-1:] == (1,) else src, dst[:-1] if dst[-1:] == (1,) else dst, bits)
    n, m = len(src), len(dst)
    split = m > n - 1 and dst[:n - 1] == src[:-1] and _prod(dst[n - 1:]) == src[-1]
    merge = n > m - 1 and src[:m - 1] == dst[:-1] and _prod(src[m - 1:]) == dst[-1]
    return split or merge or (bool(src) and bool(dst) and src[-1] % LANES == 0 and dst[-1] % LANES == 0)


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


LANES = 128
_CAST = re.compile(r'"(?:stable_mosaic\.)?vector\.shape_cast"\((%\w+)\) : \(vector<([0-9x]*)x?(\w+)>\) -> '
                   r"vector<([0-9x]*)x?\w+>")
_DEF = re.compile(r"^\s*(%\w+)(?::\d+)? = (.*)$", re.M)


def refused_reshapes(text: str) -> tuple[str, ...]:
    """Every shape cast in a Mosaic module's text that shape_cast_ok refuses, also where two casts in a row compose
    to one it refuses (Mosaic folds back-to-back casts into one before it lays them out). A value's definition is
    the latest one above its use: the printer numbers sibling regions alike, a nested region after its parent's."""
    dims = lambda g: tuple(int(d) for d in g.split("x") if d)  # noqa: E731
    last: dict[str, tuple | None] = {}
    bad = []
    for d in _DEF.finditer(text):
        m = _CAST.match(d[2])
        cast = (dims(m[2]), dims(m[4]), _BITS.get(m[3], 32)) if m else None
        if cast:
            src, dst, bits = cast
            first = last.get(m[1])
            for a, b in ((src, dst),) + (((first[0], dst),) if first else ()):
                if not shape_cast_ok(a, b, bits):
                    bad.append(f"{a} -> {b} ({bits}-bit)")
        last[d[1]] = cast
    return tuple(dict.fromkeys(bad))


def lower(fn, *args) -> Lowered:
    """jax.export `fn(*args)` (args: arrays or ShapeDtypeStructs) for TPU on this host and read back every Mosaic
    kernel in the module. Raises what Pallas raises where a kernel has no TPU lowering."""
    exported = jax.export.export(jax.jit(fn), platforms=("tpu",))(*args)
    text = exported.mlir_module()
    kernels = {}
    for m in re.finditer(r'tpu_custom_call.*?backend_config = "((?:[^"\\]|\\.)*)"', text):
        config = json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), m.group(1)))
        k = _read_mosaic(config)
        kernels[k.name] = k
    return Lowered(kernels)


_MEMREF = re.compile(r"memref<([0-9x]*)(f32|bf16|i32|i8|i1|f16|ui8|f8E4M3FN|!tpu\.dma_semaphore|!tpu\.semaphore)"
                     r"(?:, #tpu\.memory_space<(\w+)>)?>")


def _read_mosaic(config: dict) -> MosaicKernel:
    """The Mosaic module inside a tpu_custom_call's backend config (MLIR bytecode, printed with jax's own MLIR
    bindings and its TPU dialect: private modules of jax 0.10.2, as there is no public reader)."""
    from jax._src.lib import tpu as tpu_dialect
    from jax._src.lib.mlir import ir

    call = config["custom_call_config"]
    body = base64.b64decode(call["body"])
    with ir.Context() as ctx:
        tpu_dialect.register_dialect(ctx)
        ctx.allow_unregistered_dialects = True
        text = str(ir.Module.parse(body))
    name = re.search(r'sym_name = "([^"]+)"', text)
    ftype = re.search(r"function_type = \(([^\n]*?)\) -> \(\)", text)
    args = tuple((tuple(int(d) for d in m.group(1).split("x") if d), m.group(2), m.group(3) or "")
                 for m in _MEMREF.finditer(ftype.group(1) if ftype else ""))
    ops = Counter(re.findall(r'"?((?:tpu|vector|arith|math|scf)\.[a-z_0-9]+)"?\(', text))
    # the VMEM limit travels as a scoped memory config (memory space 1: VMEM) beside the kernel's body
    limit = [m["size"] for m in config.get("scoped_memory_configs", []) if m.get("memory_space") == 1]
    return MosaicKernel(name.group(1) if name else "?", int(limit[0]) if limit else None, ops, args,
                        refused_reshapes(text))
