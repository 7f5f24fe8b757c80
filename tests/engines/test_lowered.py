"""engines.lowered: exported programs kept on disk are reused only when everything the trace read is the same."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engines import lowered


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALSUITE_COMPILE_CACHE", str(tmp_path / "jax"))
    return tmp_path / "jax-lowered"


def _package(tmp_path, body: str):
    pkg = tmp_path / "pkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "mod.py").write_text(body)
    return pkg


def _step(w, x, state, scale=2.0):
    return jnp.tanh(x @ w) * scale, tuple(s + 1 for s in state)


def _args():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.normal(size=(8, 8)), jnp.float32), jnp.asarray(rng.normal(size=(3, 8)), jnp.float32),
            (jnp.zeros(4), jnp.ones(2, jnp.int32)))


def _kept(pkg, spec=None):
    return lowered.Kept(_step, "_step", pkg, spec or {"s": 1}, static_argnames=("scale",))


def test_a_new_process_reads_the_program_back_and_computes_the_same(cache, tmp_path):
    pkg = _package(tmp_path, "A = 1\n")
    first = _kept(pkg)
    out = first(*_args(), scale=3.0)
    assert (first.exported, first.loaded) == (1, 0) and len(list(cache.glob("*.jaxexp"))) == 1
    again = _kept(pkg)  # a new instance holds nothing in memory: what a new process sees
    back = again(*_args(), scale=3.0)
    assert (again.exported, again.loaded) == (0, 1)
    assert np.array_equal(out[0], back[0]) and all(np.array_equal(a, b) for a, b in zip(out[1], back[1]))
    plain = jax.jit(_step, static_argnames=("scale",))(*_args(), scale=3.0)
    assert np.array_equal(out[0], plain[0])


def test_anything_the_trace_read_is_a_new_key(cache, tmp_path):
    pkg = _package(tmp_path, "A = 1\n")
    _kept(pkg)(*_args())
    k = _kept(pkg)
    k(*_args(), scale=3.0)  # a static argument
    w, x, state = _args()
    k(w, x[:2], state)  # a shape
    k(w, x.astype(jnp.bfloat16), state)  # a dtype
    _kept(pkg, {"s": 2})(*_args())  # the engine's static spec
    _package(tmp_path, "A = 2\n")  # one changed line of the engine's source
    edited = _kept(pkg)
    edited(*_args())
    assert edited.exported == 1 and len(list(cache.glob("*.jaxexp"))) == 6


def test_a_torn_file_is_exported_again(cache, tmp_path):
    pkg = _package(tmp_path, "A = 1\n")
    out = _kept(pkg)(*_args())
    (path,) = cache.glob("*.jaxexp")
    path.write_bytes(path.read_bytes()[:100])
    k = _kept(pkg)
    assert np.array_equal(k(*_args())[0], out[0]) and (k.exported, k.loaded) == (1, 0)


def test_off_with_the_compilation_cache_and_a_callback_runs_as_a_plain_jit(tmp_path, monkeypatch):
    pkg = _package(tmp_path, "A = 1\n")
    monkeypatch.setenv("EVALSUITE_COMPILE_CACHE", "off")
    k = _kept(pkg)
    assert k.where is None and np.array_equal(k(*_args())[0], jax.jit(_step)(*_args())[0])
    monkeypatch.setenv("EVALSUITE_COMPILE_CACHE", str(tmp_path / "jax"))
    seen = []

    def with_callback(x):
        jax.debug.callback(lambda v: seen.append(float(v)), x.sum())
        return x * 2

    cb = lowered.Kept(with_callback, "cb", pkg, {})
    assert np.array_equal(cb(jnp.ones(3)), 2 * np.ones(3)) and seen == [3.0] and cb.exported == 0
    assert not list((tmp_path / "jax-lowered").glob("cb-*"))


def test_the_megakernel_reads_its_decode_steps_back_with_the_same_tokens_and_logprobs(mini_llama, caplog):
    """The engine's own use: a second engine after its programs were dropped (a new process, in effect) loads every
    decode step from disk, traces none, and generates bitwise what the first did."""
    from engines.megakernel import engine as mk

    prompts = [[1, 2, 3, 4, 5], [9, 8, 7], list(range(20, 60))]
    mk._programs.cache_clear()
    first = mk.MegakernelEngine(mini_llama.weights)
    a = first.generate(prompts, 6)
    mk._programs.cache_clear()
    second = mk.MegakernelEngine(mini_llama.weights)
    with jax.log_compiles(), caplog.at_level("WARNING"):
        b = second.generate(prompts, 6)
    assert second._decode.loaded >= 1 and second._decode.exported == 0
    # each read-back program compiled once: an exported call without stated shardings was compiled again when its
    # inputs became committed (the second step), doubling the compiled code (a CI worker ran out of memory maps)
    compiled = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling jit(call)")]
    assert len(compiled) == len(second._decode.calls), compiled
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids and np.array_equal(x.top_logprobs, y.top_logprobs)
    mk._programs.cache_clear()
