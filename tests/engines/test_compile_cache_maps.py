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


def test_every_generation_loop_offers_the_relief(mini_llama, monkeypatch):
    """The engines' shared loops (continuous batching, fixed batches, teacher-forced) call relieve_maps at each
    admission, so no long run of any engine compiles past the limit between two checks of its maps."""
    from engines.megakernel import MegakernelEngine
    from engines.reference import ReferenceEngine

    calls = []
    monkeypatch.setattr(compile_cache, "relieve_maps", lambda *a, **k: calls.append(1) or False)
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    for eng in (MegakernelEngine(mini_llama.weights), ReferenceEngine(mini_llama.weights)):
        before = len(calls)
        eng.generate(prompts, 2)
        eng.forced_topk(prompts, [[1, 2], [3, 4]], 2)
        assert len(calls) >= before + 2, type(eng).__name__
