"""A GGUF file's metadata and tensor table, read directly (the format: github.com/ggml-org/ggml, docs/gguf.md).

The gguf package's reader builds a numpy view for every item of every metadata array; on SmolLM2 (a
49,152-token vocabulary and 48,900 merges) that took about 5 s per open, measured with cProfile. This
reader decodes the same bytes with struct in about 0.1 s and hands the tensors' bytes, as numpy views
of a read-only memory map, to gguf's own dequantisers. tests/engines/test_gguf_file.py checks it
against the gguf package's reader field by field and tensor by tensor.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# metadata value types (gguf.md): struct format of each scalar type
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class Field:
    value: object

    def contents(self):
        return self.value


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # ggml order: the fastest-varying dimension first
    tensor_type: object  # gguf.constants.GGMLQuantizationType
    data: np.ndarray  # float32/float16 values, or the raw bytes of the quantised rows [..., row bytes]


class GGUFFile:
    """fields: key -> Field (.contents(): int/float/bool/str or a list); tensors: [Tensor]. Raises
    ValueError on anything that is not a well-formed GGUF file (truncated, wrong magic, bad type)."""

    def __init__(self, path: str | Path):
        with open(path, "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        buf, self._at = self._map, 0
        if bytes(buf[:4]) != MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        self._at = 4
        self.version = self._scalar(4)
        if self.version < 2:
            raise ValueError(f"GGUF version {self.version} is not supported (2 or later)")
        n_tensors, n_kv = self._scalar(10), self._scalar(10)
        self.fields: dict[str, Field] = {}
        for _ in range(n_kv):
            key = self._string()
            self.fields[key] = Field(self._value(self._scalar(4)))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = tuple(self._scalar(10) for _ in range(self._scalar(4)))
            infos.append((name, dims, self._scalar(4), self._scalar(10)))
        align = int(self.fields.get("general.alignment", Field(DEFAULT_ALIGNMENT)).value)
        start = -(-self._at // align) * align
        self.tensors = [self._tensor(name, dims, kind, start + offset) for name, dims, kind, offset in infos]

    def _scalar(self, kind: int):
        fmt = SCALARS.get(kind)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {kind}")
        size = struct.calcsize(fmt)
        if self._at + size > len(self._map):
            raise ValueError("truncated GGUF file")
        (v,) = struct.unpack_from(fmt, self._map, self._at)
        self._at += size
        return v

    def _string(self) -> str:
        n = self._scalar(10)
        if self._at + n > len(self._map):
            raise ValueError("truncated GGUF file")
        s = self._map[self._at:self._at + n].decode("utf-8", errors="replace")
        self._at += n
        return s

    def _value(self, kind: int):
        if kind == STRING:
            return self._string()
        if kind != ARRAY:
            return self._scalar(kind)
        item, n = self._scalar(4), self._scalar(10)
        if item in NUMPY:  # a numeric array in one read
            dt = np.dtype(NUMPY[item])
            if self._at + n * dt.itemsize > len(self._map):
                raise ValueError("truncated GGUF file")
            out = np.frombuffer(self._map, dt, n, self._at).tolist()
            self._at += n * dt.itemsize
            return out
        return [self._value(item) for _ in range(n)]

    def _tensor(self, name: str, dims: tuple[int, ...], kind: int, at: int) -> Tensor:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        qtype = GGMLQuantizationType(kind)
        block, size = GGML_QUANT_SIZES[qtype]
        if dims[0] % block:
            raise ValueError(f"tensor {name}: row of {dims[0]} is not a whole number of {block}-blocks")
        rows = int(np.prod(dims[1:], dtype=np.int64))
        row_bytes = dims[0] // block * size
        if at + rows * row_bytes > len(self._map):
            raise ValueError(f"truncated GGUF file (tensor {name})")
        raw = np.frombuffer(self._map, np.uint8, rows * row_bytes, at)
        outer = tuple(reversed(dims[1:]))
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            data = raw.view("<f4" if qtype == GGMLQuantizationType.F32 else "<f2").reshape(*outer, dims[0])
        else:
            data = raw.reshape(*outer, row_bytes)
        return Tensor(name, dims, qtype, data)
