"""Weights read on demand from safetensors files: a sharded reference reads only its devices' slices.

A LazyArray has a shape and reads the part of itself that an index asks for (`a[idx]`), straight from the
safetensors file (safe_open's get_slice: only those elements are copied out). engines.hf_loader builds them
(load_hf(..., lazy=True)); engines.reference.sharding.place_lazy hands each device's index to
jax.make_array_from_callback, so each process reads 1/tp of every tensor-parallel weight and never holds the
whole model. LazyArrays, the dict of them, materialises a whole array only when an engine that needs it whole
(the megakernel, the unsharded reference) asks for it, and counts what it read (bytes_read).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np


class LazyArray:
    """shape, dtype (float32) and a reader of any basic index (ints and slices)."""

    shape: tuple[int, ...]
    dtype = np.dtype(np.float32)

    def read(self, idx: tuple) -> np.ndarray:
        """The elements at idx (a full tuple of ints and slices, one per dimension), as float32."""
        raise NotImplementedError

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.size * 4

    def __getitem__(self, idx) -> np.ndarray:
        idx = idx if isinstance(idx, tuple) else (idx,)
        idx = idx + (slice(None),) * (len(self.shape) - len(idx))
        return self.read(idx)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self[()]
        return a if dtype is None else a.astype(dtype)


@functools.lru_cache(maxsize=64)
def _handle(path: str, mtime_ns: int):
    """One open safetensors file per path and modification time: its header is parsed once, not on every
    slice read (a sharded load reads each tensor once per local device)."""
    from safetensors import safe_open

    return safe_open(path, framework="np")


class Tensor(LazyArray):
    """One tensor of a safetensors file, optionally transposed (HF stores (out, in); evalsuite (in, out))."""

    def __init__(self, file: Path, key: str, transpose: bool, counter: list[int]):
        self.file, self.key, self.transpose, self.counter = file, key, transpose, counter
        self.mtime_ns = Path(file).stat().st_mtime_ns
        shape = tuple(self._f().get_slice(key).get_shape())
        self.shape = shape[::-1] if transpose else shape

    def _f(self):
        return _handle(str(self.file), self.mtime_ns)

    def raw(self) -> np.ndarray:
        """The whole tensor in its stored dtype (MXFP4 blocks and scales are bytes, not floats)."""
        out = self._f().get_tensor(self.key)
        self.counter[0] += out.nbytes
        return out

    def read(self, idx: tuple) -> np.ndarray:
        part = self._f().get_slice(self.key)[idx[::-1] if self.transpose else idx]
        part = np.asarray(part, dtype=np.float32)
        self.counter[0] += part.nbytes
        return part.T if self.transpose else part


class Stacked(LazyArray):
    """Arrays of one shape stacked on a new first axis (per-layer tensors -> [L, ...]); nests (experts)."""

    def __init__(self, parts: list[LazyArray]):
        self.parts = parts
        self.shape = (len(parts), *parts[0].shape)

    def read(self, idx: tuple) -> np.ndarray:
        first, rest = idx[0], idx[1:]
        if isinstance(first, int | np.integer):
            return self.parts[int(first)].read(rest)
        return np.stack([self.parts[i].read(rest) for i in range(len(self.parts))[first]])


class Eager(LazyArray):
    """An array already in memory (a tensor the loader had to compute: dequantised, de-interleaved)."""

    def __init__(self, a: np.ndarray):
        self.a = np.asarray(a, np.float32)
        self.shape = self.a.shape

    def read(self, idx: tuple) -> np.ndarray:
        return self.a[idx]


def as_lazy(arrays) -> LazyArrays:
    """Weights.arrays as LazyArrays: itself when lazy, else each in-memory array wrapped (Eager), so one placement
    path (engines.reference.sharding.place_lazy) serves both."""
    return arrays if isinstance(arrays, LazyArrays) else LazyArrays({k: Eager(v) for k, v in arrays.items()}, [0])


class LazyArrays(Mapping):
    """Name -> LazyArray, as Weights.arrays: indexing by name materialises (and keeps) the whole array;
    lazy(name) gives the LazyArray itself. bytes_read: what every read copied out of the files so far."""

    def __init__(self, arrays: dict[str, LazyArray], counter: list[int]):
        self._lazy, self._dense, self._counter = arrays, {}, counter

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._dense:
            self._dense[name] = np.ascontiguousarray(self._lazy[name][()])
        return self._dense[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._lazy)

    def __len__(self) -> int:
        return len(self._lazy)

    def lazy(self, name: str) -> LazyArray:
        return self._lazy[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._lazy[name].shape

    @property
    def bytes_read(self) -> int:
        return self._counter[0]
