"""Gated DeltaNet (engines/reference/gdn.py) and the Qwen3-Next hybrid, rung by rung: each primitive against plain
numpy loops written here, the hybrid's recurrent state through every engine path, and skeptic mutations that the
transformers oracle (tests/engines/oracle/mini-qwen-hybrid.json) must catch."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engines.hf_loader import load_hf
from engines.reference import ReferenceEngine, gdn, model
from engines.reference import engine as engine_mod
from engines.weights import Weights
from evalsuite.compare.rule import DLOGIT_TOL
from evalsuite.models import minis_dir
from tests.engines.test_oracle import ORACLE_F64_TOL, float32_bound, float64_error

ORACLE = json.loads((Path(__file__).parents[1] / "oracle" / "mini-qwen-hybrid.json").read_text())
# The delta-rule step against the numpy loop below, float32 (ARCHITECTURES.md's bound for these recurrences,
# the public kernels' own; measured here: 1.1e-8 on the state, 1.6e-8 on the output).
STEP_RTOL, STEP_ATOL = 2e-5, 2e-6


def np_conv(x, state, w):
    """Depthwise causal conv, one output at a time: y[t, c] = sum_j w[c, j] * hist[t + j, c]."""
    taps = w.shape[1]
    hist = np.concatenate([state.T, x], axis=0)  # [taps-1+T, C]
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(taps):
            y[t] += w[:, j] * hist[t + j]
    return y, hist[-(taps - 1):].T


def test_conv_is_the_shift_sum_and_keeps_the_raw_inputs():
    rng = np.random.default_rng(0)
    C, taps, T = 6, 4, 5
    # small integers: every sum is exact in float32 whatever the order, so equality is exact
    x = rng.integers(-3, 4, (2, T, C)).astype(np.float32)
    state = rng.integers(-3, 4, (2, C, taps - 1)).astype(np.float32)
    w = rng.integers(-2, 3, (C, taps)).astype(np.float32)
    out, new = gdn.causal_conv(jnp.asarray(x), jnp.asarray(state), jnp.asarray(w), jnp.array([T, 2]))
    for b, n in enumerate((T, 2)):
        y, _ = np_conv(x[b], state[b], w)
        assert np.array_equal(np.asarray(out[b]), np.asarray(jax.nn.silu(jnp.asarray(y))))
        # the new state: the taps-1 raw inputs ending at the row's last real token, bit for bit
        assert np.array_equal(np.asarray(new[b]), np_conv(x[b, :n], state[b], w)[1])


def test_l2norm_puts_eps_inside_the_sum():
    x = jnp.array([[3e-4, 4e-4], [0.0, 0.0], [3.0, 4.0]], jnp.float32)
    got = np.asarray(gdn.l2norm(x, jnp.float32))
    # |x|^2 = 2.5e-7: inside the sum the eps (1e-6) dominates; outside it (x / (|x| + eps)) would give ~1.0
    np.testing.assert_allclose(got[0], np.array([3e-4, 4e-4]) / np.sqrt(2.5e-7 + 1e-6), rtol=1e-6)
    assert np.array_equal(got[1], [0.0, 0.0])
    np.testing.assert_allclose(got[2], [0.6, 0.8], rtol=1e-6)


def np_delta(q, k, v, beta, g, S):
    """The recurrence one token at a time, S [H, dk, dv]."""
    S, out = S.copy(), []
    for t in range(q.shape[0]):
        S = S * np.exp(g[t])[:, None, None]
        mem = np.einsum("hkv,hk->hv", S, k[t])
        S = S + np.einsum("hk,hv->hkv", k[t], (v[t] - mem) * beta[t][:, None])
        out.append(np.einsum("hkv,hk->hv", S, q[t]))
    return np.stack(out), S


def test_delta_rule_against_the_numpy_loop_and_padding_freezes_the_state():
    rng = np.random.default_rng(1)
    T, H, dk, dv = 6, 2, 8, 8
    q, k = (rng.standard_normal((T, H, dk)) * 0.3 for _ in "qk")
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((T, H, dv)) * 0.3
    beta = 1 / (1 + np.exp(-rng.standard_normal((T, H))))
    g = -np.exp(rng.uniform(0, 2.7, (T, H))) * np.log1p(np.exp(rng.standard_normal((T, H))))
    S0 = rng.standard_normal((H, dk, dv)) * 0.3
    assert (g < 0).all() and (np.exp(g) < 1).all() and ((beta > 0) & (beta < 1)).all()  # the gates' ranges
    f = [jnp.asarray(a[None], jnp.float32) for a in (q, k, v, beta, g)]
    valid = jnp.asarray([[True] * 4 + [False] * 2])
    o, S = gdn.delta_rule(*f, jnp.asarray(S0[None], jnp.float32), valid)
    o_np, S_np = np_delta(q[:4], k[:4], v[:4], beta[:4], g[:4], S0)
    np.testing.assert_allclose(np.asarray(o[0, :4]), o_np, rtol=STEP_RTOL, atol=STEP_ATOL)
    np.testing.assert_allclose(np.asarray(S[0]), S_np, rtol=STEP_RTOL, atol=STEP_ATOL)  # stopped at the 4th token


@pytest.fixture(scope="module")
def hybrid():
    return load_hf(minis_dir() / "mini-qwen-hybrid", "mini-qwen-hybrid")


def test_prefill_then_decode_equals_one_forward(hybrid):
    """The state carried token by token (prefill, then decode steps) against one forward pass over the whole
    sequence (the scan from zero), in float32: the same math in another order."""
    e = ReferenceEngine(hybrid)
    prompt, cont = list(range(40, 75)), list(range(100, 120))
    full = e.score([prompt + cont])[0].logits[len(prompt) - 1:-1]
    stepped = e.decode_forced([prompt], [cont])[0]
    # measured 1.8e-5 (max |Δlogit|, logits up to 17); the bound is diff's float32 |Δlogit| bound, set from the
    # score-vs-decode noise of the older families (evalsuite/compare/rule.py); a state bug moves logits by units
    assert np.abs(full - stepped).max() <= DLOGIT_TOL["float32"]


@pytest.mark.parametrize("name", ["mini-qwen-hybrid", pytest.param("mini-kimi-linear", marks=pytest.mark.heavy),
                                  pytest.param("mini-kimi", marks=pytest.mark.heavy)])
def test_prefill_then_decode_equals_one_forward_in_bfloat16(name):
    """The same in bf16 mode, on the GDN hybrid and both KDA stacks: the recurrence's states carried across calls in
    the recipe. Measured max |Δlogit| 2.9e-2 (mini-qwen-hybrid), 1.9e-6 (mini-kimi-linear), 2.9e-2 (mini-kimi),
    greedy tokens identical; the public kernels' GDN prefill-vs-decode bound is 3e-2 (ARCHITECTURES.md 6). The bound
    here is diff's bf16 |Δlogit| bound (rule.py, from the older families' bf16 recipe), with the argmax equal."""
    from evalsuite.models import load_model

    e = ReferenceEngine(load_model(name).weights, dtype="bfloat16")
    prompt, cont = list(range(40, 75)), list(range(100, 120))
    full = e.score([prompt + cont])[0].logits[len(prompt) - 1:-1]
    stepped = e.decode_forced([prompt], [cont])[0]
    assert np.abs(full - stepped).max() <= DLOGIT_TOL["bfloat16"]
    assert (full.argmax(-1) == stepped.argmax(-1)).all()


# ---- skeptic mutations: each a bug these kernels have had or invite; the oracle must catch every one ----------

def _decay_after_update(q, k, v, beta, g, S, valid):
    def step(S, xs):
        q_t, k_t, v_t, b_t, g_t, ok = xs
        mem = jnp.einsum("bhkv,bhk->bhv", S, k_t)
        decay = jnp.exp(g_t)[:, :, None, None] if g_t.ndim == 2 else jnp.exp(g_t)[..., None]  # per head or channel
        S1 = (S + jnp.einsum("bhk,bhv->bhkv", k_t, (v_t - mem) * b_t[:, :, None])) * decay
        return jnp.where(ok[:, None, None, None], S1, S), jnp.einsum("bhkv,bhk->bhv", S1, q_t)
    S, o = jax.lax.scan(step, S, tuple(jnp.moveaxis(a, 1, 0) for a in (q, k, v, beta, g, valid)))
    return jnp.moveaxis(o, 0, 1), S


_conv = gdn.causal_conv
MUTATIONS = {
    "decay applied after the delta update": ("delta_rule", _decay_after_update),
    "L2-norm epsilon outside the sum": ("l2norm", lambda x, f32: x / (jnp.sqrt(jnp.sum(x * x, -1, keepdims=True))
                                                                       + f32(gdn.L2_EPS))),
    "value heads tiled instead of repeated": ("expand_heads", lambda x, r: jnp.tile(x, (1, 1, r, 1))),
    "gated norm with 1 + w": ("gated_norm", lambda o, w, z, eps, rms: rms(o, w, eps, "gemma") * jax.nn.silu(z)),
    "conv state not shifted": ("causal_conv", lambda m, conv, w, n: (_conv(m, conv, w, n)[0], conv)),
}


def oracle_rungs(w: Weights, runs: int = 2, oracle: dict = ORACLE) -> tuple[bool, float, float]:
    """(greedy tokens equal, float32 max |Δlogprob|, float64 max |Δlogprob|) against the oracle's first runs."""
    sub = {**oracle, "runs": oracle["runs"][:runs],
           "float64": {**oracle["float64"], "top_logprobs": oracle["float64"]["top_logprobs"][:runs]}}
    gens = ReferenceEngine(w).generate([r["prompt"] for r in sub["runs"]], oracle["n_new"], top_k=5)
    same = all(g.token_ids == r["tokens"] for g, r in zip(gens, sub["runs"]))
    f32 = max(float(np.abs(np.asarray(g.top_logprobs) - [s["top_logprobs"] for s in r["steps"]]).max())
              for g, r in zip(gens, sub["runs"]) if g.token_ids == r["tokens"]) if same else float("inf")
    return same, f32, float64_error(w, sub)


@pytest.fixture
def fresh_programs():
    engine_mod._programs.cache_clear()  # the jitted steps are shared per config: trace the mutated math anew
    yield
    engine_mod._programs.cache_clear()


# In CI: the two that only one rung sees (the eps: float64 only; the conv state: the decode path only); the rest,
# which change greedy tokens outright, run in the heavy session (nox -s heavy).
IN_CI = ("L2-norm epsilon outside the sum", "conv state not shifted")


@pytest.mark.parametrize("name", [m if m in IN_CI else pytest.param(m, marks=pytest.mark.heavy) for m in MUTATIONS])
def test_the_oracle_catches_each_mutation(name, hybrid, monkeypatch, fresh_programs):
    attr, fn = MUTATIONS[name]
    monkeypatch.setattr(gdn, attr, fn)
    same, f32, f64 = oracle_rungs(hybrid, runs=1)
    print(f"{name}: tokens {'same' if same else 'differ'}, float32 {f32:.1e}, float64 {f64:.1e}")
    assert not same or f32 > float32_bound(ORACLE) or f64 > ORACLE_F64_TOL


@pytest.mark.heavy
def test_the_oracle_catches_a_full_rope_for_a_partial_one(hybrid, fresh_programs):
    c = dataclasses.replace(hybrid.config, rotary_dim=0)  # every dim rotated where a quarter should be
    same, f32, f64 = oracle_rungs(Weights(c, hybrid.arrays, hybrid.sha256, hybrid.source), runs=1)
    print(f"full RoPE: tokens {'same' if same else 'differ'}, float32 {f32:.1e}, float64 {f64:.1e}")
    assert not same or f32 > float32_bound(ORACLE) or f64 > ORACLE_F64_TOL


def test_padding_must_not_advance_the_state(hybrid, monkeypatch, fresh_programs):
    """A right-padded prefill that lets the pad tokens through the recurrence (lengths ignored): the batched
    generate then differs from the oracle on the shorter prompts."""
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **kw: forward(*a, **{**kw, "lengths": None}))
    same, f32, _ = oracle_rungs(hybrid)
    print(f"padding through the recurrence: tokens {'same' if same else 'differ'}, float32 {f32:.1e}")
    assert not same or f32 > float32_bound(ORACLE)


MOE_ORACLE = json.loads((Path(__file__).parents[1] / "oracle" / "mini-qwen-next-moe.json").read_text())


@pytest.mark.parametrize("bug", ["faithful", "shared expert ungated",
                                 pytest.param("top-k not renormalised", marks=pytest.mark.heavy)])
def test_qwen3_next_moe_against_its_oracle(bug, fresh_programs):
    """Qwen3-Next's sparse MoE (mini-qwen-next-moe: softmax top-2 of 8 renormalised, a shared expert behind a sigmoid
    gate, after one dense layer) through evalsuite's loader: the oracle's tokens and logprobs, and each bug fails it."""
    w = load_hf(minis_dir() / "mini-qwen-next-moe", "mini-qwen-next-moe")
    assert w.config.family == "moe" and w.config.first_dense == 1 and w.config.shared_expert_gate
    c, arrays = w.config, dict(w.arrays)
    if bug == "shared expert ungated":
        c = dataclasses.replace(c, shared_expert_gate=False)
        arrays.pop("shared_gate")
    elif bug == "top-k not renormalised":
        c = dataclasses.replace(c, norm_topk=False)
    same, f32, f64 = oracle_rungs(Weights(c, arrays, w.sha256, w.source), runs=1, oracle=MOE_ORACLE)
    print(f"qwen3-next moe {bug}: tokens {'same' if same else 'differ'}, float32 {f32:.1e}, float64 {f64:.1e}")
    ok = same and f32 <= float32_bound(MOE_ORACLE) and f64 <= ORACLE_F64_TOL
    assert ok == (bug == "faithful")


FLA = np.load(Path(__file__).parents[1] / "oracle" / "fla-delta-rule.npz")  # benchmarks/fla_oracle.py


@pytest.mark.parametrize("kind, bug", [("gdn", None), ("gdn", "decay after the update"), ("kda", None),
                                       ("kda", "decay after the update"), ("kda", "one decay per head")])
def test_the_delta_rule_against_flash_linear_attention(kind, bug):
    """flash-linear-attention's naive recurrent and chunked delta rules (fla-core 0.6.0, run in the side environment)
    on seeded inputs from a random initial state: the reference's outputs and final state within the public kernels'
    bounds (measured: within 1e-6 of either form). Each bug fails: the decay after the update, and for KDA the
    per-channel decay collapsed to one per head."""
    meta = json.loads(str(FLA["meta"]))
    g = FLA["g_head"] if kind == "gdn" else FLA["g_chan"]
    if bug == "one decay per head":
        g = g.mean(-1)
    rule = _decay_after_update if bug == "decay after the update" else gdn.delta_rule
    q = jnp.asarray(FLA["q"]) * meta["scale"]
    valid = jnp.ones(FLA["q"].shape[:2], bool)
    o, S = rule(q, *(jnp.asarray(FLA[x]) for x in ("k", "v", "beta")), jnp.asarray(g), jnp.asarray(FLA["S0"]), valid)
    for form in ("", "_chunk"):
        ok = (np.allclose(np.asarray(o), FLA[f"{kind}{form}_o"], rtol=STEP_RTOL, atol=STEP_ATOL)
              and np.allclose(np.asarray(S), FLA[f"{kind}{form}_S"], rtol=STEP_RTOL, atol=STEP_ATOL))
        err = max(np.abs(np.asarray(o) - FLA[f"{kind}{form}_o"]).max(),
                  np.abs(np.asarray(S) - FLA[f"{kind}{form}_S"]).max())
        print(f"{kind} {bug or 'faithful'} vs fla{form or ' recurrent'}: max |Δ| {err:.1e}")
        assert ok == (bug is None), err
