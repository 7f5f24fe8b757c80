"""compile_cache.relieve_maps: jax's in-memory programs dropped when the process's memory maps pass a share of
vm.max_map_count (a long benchmark over a deep model crashed in LLVM there), and kept below it."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from engines import compile_cache


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc")
def test_programs_are_dropped_only_past_the_share():
    f = jax.jit(lambda x: jnp.sin(x) * 2)
    f(jnp.ones(3))
    assert f._cache_size() == 1
    assert not compile_cache.relieve_maps(share=1.0)  # no process is past the whole limit: nothing dropped
    assert f._cache_size() == 1
    assert _maps() > 0 and compile_cache.relieve_maps(share=0.0)  # past a zero share: dropped
    assert f._cache_size() == 0
