"""Lowered programs kept on disk (jax.export), so a new process neither traces nor lowers them again.

JAX's persistent compilation cache keys a program by its lowered module, so every process still traces and lowers
before it can hit the cache. For a Pallas kernel in the generic interpreter that is the bulk of a short run: a quick
`diff` on mini-llama spent 41 of its 60 s (warm compilation cache) lowering 8 decode-step shapes, about 5 s each,
most of it discharging the kernel body's state. `Kept` wraps a jitted function: the first call at a shape exports
it (jax.export: the StableHLO jax would have compiled) and writes it beside the compilation cache; a later process
reads it back and calls it, and XLA compiles the same module.

The key is everything the traced program depends on: the engine's source fingerprint (its package's files and
the shared engines/*.py, jax and jaxlib's versions, the static spec: engines.base.source_fingerprint), the
program's name, its static arguments, the argument tree with each leaf's shape and dtype, the backend and jax's
numeric settings. One changed line of the kernel is a new key, never a stale program. A program jax cannot export
(an effect, a host callback: TPU interpret mode's race detector) runs as a plain jit.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import partial
from pathlib import Path

import jax

from engines import compile_cache
from engines.base import source_fingerprint

SUFFIX = ".jaxexp"


def folder() -> Path | None:
    """Where exported programs are kept: beside the compilation cache (off with it)."""
    cache = compile_cache.directory()
    return None if cache is None else cache.with_name(cache.name + "-lowered")


class Kept:
    """A jax.jit whose lowered programs are kept on disk, keyed per call shape (see the module docstring)."""

    def __init__(self, fn, name: str, package_dir, spec: dict, static_argnames=(), donate_argnums=()):
        self.fn, self.name, self.package_dir, self.spec = fn, name, package_dir, spec
        self.static_argnames, self.donate_argnums = tuple(static_argnames), tuple(donate_argnums)
        self.plain = jax.jit(fn, static_argnames=self.static_argnames, donate_argnums=self.donate_argnums)
        self.calls: dict = {}
        self.where = folder()
        self._fingerprint: str | None = None
        self.loaded = self.exported = 0  # programs read back and programs written, this process

    def __call__(self, *args, **static):
        if self.where is None:
            return self.plain(*args, **static)
        leaves, tree = jax.tree.flatten(args)
        avals = tuple(jax.typeof(x) for x in leaves)  # shape, dtype and weak type: what a trace depends on
        key = (str(tree), tuple(map(str, avals)), tuple(sorted(static.items())))
        call = self.calls.get(key)
        if call is None:
            call = self.calls[key] = self._program(tree, avals, static, key)
        return call(*args)

    def _cache_size(self) -> int:
        return len(self.calls)

    def _program(self, tree, avals, static, key):
        if self._fingerprint is None:
            self._fingerprint = source_fingerprint(self.package_dir, self.spec)
        settings = {"backend": jax.default_backend(), "x64": jax.config.jax_enable_x64,
                    "precision": str(jax.config.jax_default_matmul_precision)}
        digest = hashlib.sha256(json.dumps([self._fingerprint, self.name, repr(key), settings],
                                           default=str).encode()).hexdigest()
        path = self.where / f"{self.name.strip('_')}-{digest[:40]}{SUFFIX}"
        exported = _read(path)
        if exported is None:
            fn = partial(self.fn, **static)
            specs = jax.tree.unflatten(tree, [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
                                              for a in avals])
            try:
                exported = jax.export.export(jax.jit(fn))(*specs)
            except Exception:  # noqa: BLE001 - not exportable (an effect, a callback): run it as a plain jit
                return partial(self.plain, **static)
            _write(path, exported)
            self.exported += 1
        else:
            self.loaded += 1
        # shardings stated: without them an exported call is compiled again when its inputs turn from uncommitted to
        # committed (the second decode step), a module jax's cache does not match (mini-llama: 2.6 s more a shape)
        one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.jit(exported.call, in_shardings=one, out_shardings=one, donate_argnums=self.donate_argnums)


def _read(path: Path):
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    try:
        return jax.export.deserialize(bytearray(blob))
    except Exception:  # noqa: BLE001 - a torn or foreign file: export again and overwrite it
        return None


def _write(path: Path, exported) -> None:
    """Atomically (two processes may export the same program at once). A read-only disk, or a program the
    serializer refuses, is kept in memory only: this process still calls the exported program."""
    try:
        blob = exported.serialize()
    except Exception:  # noqa: BLE001 - e.g. a custom call it has no serialization for
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(bytes(blob))
        os.replace(tmp, path)
    except OSError:
        pass


def jit(fn, name: str, package_dir, spec: dict, keep: bool, static_argnames=(), donate_argnums=()):
    """Kept where `keep` (and the compilation cache is on), else a plain jax.jit with the same arguments."""
    if keep:
        return Kept(fn, name, package_dir, spec, static_argnames, donate_argnums)
    return jax.jit(fn, static_argnames=static_argnames, donate_argnums=donate_argnums)
