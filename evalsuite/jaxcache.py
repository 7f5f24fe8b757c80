"""JAX's persistent compilation cache for evalsuite's commands.

A cold process spends most of a short run compiling (the megakernel's interpret-mode program, the
reference's bucketed shapes): measured, `evalsuite diff --model mini-llama --prompts quick
--max-new-tokens 12` took 20.6 s cold and 7.2 s with the cache warm (2 cores, 2026-11-30).
The cache is keyed by JAX on the program and the backend, so a changed kernel never reuses an old
binary. Where: $JAX_COMPILATION_CACHE_DIR when set (JAX reads it itself), else
~/.cache/evalsuite/jax; EVALSUITE_JAX_CACHE=0 turns it off. Called by the CLI, never at import.
"""

from __future__ import annotations

import os
from pathlib import Path


def enable() -> str | None:
    """Turn the cache on (idempotent); returns its folder, or None when off."""
    if os.environ.get("EVALSUITE_JAX_CACHE", "1") == "0":
        return None
    import jax

    path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(Path.home() / ".cache" / "evalsuite" / "jax")
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # a read-only home: run without the cache rather than fail
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return path
