"""JAX's persistent compilation cache, behind one switch: EVALSUITE_COMPILE_CACHE=off|DIR.

A cold process spends most of a short run compiling; with the cache a machine compiles each shape once, not once
per process. Unset: $JAX_COMPILATION_CACHE_DIR when the user set one for jax, else ~/.cache/evalsuite/jax.
`off` (or 0, false, no) turns jax's cache off even where $JAX_COMPILATION_CACHE_DIR is set. jax decides whether
to use the cache at its first compile, so the CLI calls enable() before anything compiles; the engines call it
too, for library use. The cache is keyed by jax on the program and the backend: a changed kernel never reuses
an old binary.
"""

from __future__ import annotations

import os
from pathlib import Path

OFF = ("off", "0", "false", "no")
DEFAULT_DIR = Path.home() / ".cache" / "evalsuite" / "jax"
# Cache every program: mini-llama's quick diff (12 tokens) took 20.6 s cold and 7.2 s warm with a floor of 0 s;
# jax's own default floor (1 s) would skip most of the small programs a short run compiles.
MIN_COMPILE_SECONDS = 0.0
# No size limit is set: jax's size-limited (LRU) cache warned "Error writing persistent compilation cache
# entry ... -atime: FileNotFoundError" here; an entry is about 0.3 MB (740 KB for a generate's three).


def directory() -> Path | None:
    """The cache's directory as EVALSUITE_COMPILE_CACHE and jax's own setting say (None: off); changes nothing."""
    import jax

    setting = os.environ.get("EVALSUITE_COMPILE_CACHE", "").strip()
    if setting.lower() in OFF:
        return None
    if setting:
        return Path(setting).expanduser()
    current = jax.config.jax_compilation_cache_dir
    return Path(current) if current else DEFAULT_DIR


def enable() -> str | None:
    """Apply EVALSUITE_COMPILE_CACHE (idempotent); returns the cache's directory, or None when it is off."""
    import jax

    path = directory()
    if path is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # a read-only home: compile in memory
    jax.config.update("jax_compilation_cache_dir", str(path))
    if os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS") is None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return str(path)


# A process's memory maps at which relieve_maps drops jax's in-memory programs: half of the kernel's
# vm.max_map_count (65,530 here), past which LLVM fails to map new code ("Cannot allocate memory", then a crash). Each
# compiled program holds maps for its code: mini-kimi's faithful detection row reached 41,517 after 16 prompts and
# crashed in its 32-prompt batching part; jax.clear_caches() took a 13,980-map process back to 671 (/tmp/maps.py).
MAPS_SHARE = 0.5


def relieve_maps(share: float = MAPS_SHARE) -> bool:
    """Drop every program jax holds in memory (jax.clear_caches) when this process's memory maps pass `share` of
    vm.max_map_count; later calls recompile, or read the persistent cache. For long runs that compile many shapes
    (a benchmark's loop over chunks). True when it cleared; False where /proc does not tell."""
    import jax

    try:
        limit = int(Path("/proc/sys/vm/max_map_count").read_text())
        with open("/proc/self/maps") as f:
            used = sum(1 for _ in f)
    except (OSError, ValueError):
        return False
    if used <= share * limit:
        return False
    jax.clear_caches()
    return True
