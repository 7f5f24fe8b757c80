"""Muse Spark's layers, which no library implements. The oracle is a float64 numpy transcription of ARCHITECTURES.md
section 3 (the window that includes the query, NoPE full layers, parameter-free QK norm, the per-head-normed sigmoid
output gate, the gated residual with its post-norms, the normed embedding, the soft-capped logits and the MoE with
normed latent and per-expert post-norm), written here token by token apart from the reference's JAX code."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from engines.config import MINI_MUSE, MUSE_ATTN_SCALE
from engines.reference import model, residual
from engines.weights import Weights, mini_muse
from evalsuite.compare.rule import DLOGIT_TOL

# float32 against float64 of the same model: diff's float32 |Δlogit| bound (evalsuite/compare/rule.py, from the
# reference's score-vs-decode noise on the older families), far tighter than the public kernels' bf16 MINI bound
# (logits within 5e-2 and the same greedy token). Measured on 40 tokens: 1.8e-4 (logits up to 13), float32 rounding
# alone: the same math in float64 agrees to 3.7e-13 (below).
MINI_LOGIT_TOL = DLOGIT_TOL["float32"]
# Layer-level bounds: the public kernels' own for a layer against its transcription are bf16-wide (2e-2); here
# float32 against float64, so the K3 layers' (tests/engines/reference/test_k3_layers.py) rtol and atol.
RTOL, ATOL = 2e-5, 2e-6
POST_EPS = 1e-8  # Muse's post_eps (ARCHITECTURES.md 3; the spec's post-attention, post-FFN and post-expert norms)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def rms(x, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rotate_half(x, pos, theta):
    """Rotate-half RoPE on x [heads, hd] at one position."""
    hd = x.shape[-1]
    freq = theta ** (-np.arange(0, hd, 2) / hd)
    cos, sin = np.cos(pos * freq), np.sin(pos * freq)
    a, b = x[:, :hd // 2], x[:, hd // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def np_attention(x, a, c, sliding: bool, window: int):
    """One Muse attention layer on normed inputs x [T, D], token by token over a cache of the earlier tokens."""
    H, K, hd = c.n_heads, c.n_kv_heads, c.head_dim
    keys, values, outs = [], [], []
    for p, xt in enumerate(x):
        q = rms((xt @ a["wq"]).reshape(H, hd), c.rms_eps)
        k = rms((xt @ a["wk"]).reshape(K, hd), c.rms_eps)
        if sliding:  # the full layers are NoPE
            q, k = rotate_half(q, p, c.rope_theta), rotate_half(k, p, c.rope_theta)
        keys.append(k)
        values.append((xt @ a["wv"]).reshape(K, hd))
        o = np.zeros((H, hd))
        for h in range(H):
            seen = [s for s in range(p + 1) if not sliding or p - window < s]  # the window includes the query
            sc = np.array([keys[s][h * K // H] @ q[h] for s in seen]) * MUSE_ATTN_SCALE / np.sqrt(hd)
            e = np.exp(sc - sc.max())
            o[h] = (e / e.sum()) @ np.array([values[s][h * K // H] for s in seen])
        o = rms(o, c.rms_eps).reshape(-1) * sigmoid(xt @ a["wg"])
        outs.append(o @ a["wo"])
    return np.stack(outs)


def np_moe(x, a, c):
    """Muse's MoE per token: sigmoid(x Wr 2^-2.5) router whose bias selects only, weights w / (sum + 1e-15); experts
    read rms(x Wpre) (1 + g_pre); each expert's SwiGLU output y becomes rms(y (1 + g_pe), 1e-8); sum, then Wpost."""
    out = []
    for xt in x:
        sc = sigmoid((xt @ a["router"]) * 2 ** -2.5)
        chosen = np.argsort(-(sc + a["router_bias"]), kind="stable")[:c.top_k]
        w = sc[chosen] / (sc[chosen].sum() + 1e-15)
        h1 = rms(xt @ a["latent_down"], c.rms_eps) * (1 + a["latent_norm"])
        m = 0.0
        for wi, e in zip(w, chosen):
            g, u = h1 @ a["e_gate"][e], h1 @ a["e_up"][e]
            y = (g * sigmoid(g) * u) @ a["e_down"][e]
            m = m + wi * rms(y * (1 + a["expert_norm"]), POST_EPS)
        out.append(m @ a["latent_up"])
    return np.stack(out)


def np_gate(s, nb, g):
    u = g / 0.3
    beta = sigmoid(u)
    alpha = np.sqrt(np.maximum(sigmoid(-u) * (1 + beta), 1e-3))
    return alpha * s + beta * nb


def np_muse_forward(tokens: list[int], a: dict, c, window: int | None = None) -> np.ndarray:
    """The whole Muse MINI, float64: logits [T, V]. window: a mutation's sliding window."""
    s = rms(a["embed"][tokens], c.rms_eps)
    for L in range(c.n_layers):
        sliding = L % 4 != 1
        assert sliding == (c.kind(L) == "sliding")
        layer = {k: a[k][L] for k in ("wq", "wk", "wv", "wg", "wo")}
        h = rms(s, c.rms_eps) * (1 + a["attn_norm"][L])
        out = np_attention(h, layer, c, sliding, window or c.sliding_window)
        s = np_gate(s, rms(out, POST_EPS), a["res_gate_attn"][L])
        h = rms(s, c.rms_eps) * (1 + a["mlp_norm"][L])
        moe = {k: a[k][L] for k in ("router", "router_bias", "latent_down", "latent_norm", "latent_up", "e_gate",
                                    "e_up", "e_down", "expert_norm")}
        out = np_moe(h, moe, c)
        s = np_gate(s, rms(out * (1 + a["post_mlp_norm"][L]), POST_EPS), a["res_gate_mlp"][L])
    raw = (rms(s, c.rms_eps) * a["final_norm"]) @ a["lm_head"].T  # the final gain as-is
    return 20 * np.tanh(raw * 2 ** -2.5 / 20)


@pytest.fixture(scope="module")
def muse():
    w = mini_muse()
    tokens = [int(t) for t in np.random.default_rng(7).integers(3, 320, 40)]  # 40 > the window of 16
    return w, tokens, {k: np.asarray(v, np.float64) for k, v in w.arrays.items()}


def reference_logits(w: Weights, tokens: list[int], **config) -> np.ndarray:
    """The reference's float32 forward pass over one sequence (a fresh prefill), config fields replaced."""
    c = dataclasses.replace(w.config, **config)
    p = {k: [jnp.asarray(x) for x in v] if v.ndim > 1 and k not in ("embed", "lm_head") else jnp.asarray(v)
         for k, v in w.arrays.items()}
    T = len(tokens)
    kc, vc = model.empty_cache(c, 1, T)
    logits, *_ = model.forward(p, c, jnp.asarray([tokens]), jnp.arange(T)[None], kc, vc, fresh=True)
    return np.asarray(logits[0])


# Each mutation stands for a bug a Muse kernel invites; each must fail the whole-model comparison.
MUTATIONS = {
    "faithful": {},
    "window-one-slot-short": {"sliding_window": 15},
    "rope-on-the-nope-layers": {"nope_full": False},
    "no-per-head-output-norm": {"attn_out_norm": False},
    "final-gain-as-1+w": {"final_norm_style": ""},
    "no-logit-scale": {"logit_scale": 1.0},
    "router-unscaled": {"router_logit_scale": 1.0},
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_mini_muse_against_the_whole_model_transcription(muse, mutation):
    w, tokens, arrays = muse
    got = reference_logits(w, tokens, **MUTATIONS[mutation])
    want = np_muse_forward(tokens, arrays, MINI_MUSE)
    err = float(np.abs(got - want).max())
    same = list(got.argmax(-1)) == list(want.argmax(-1))
    print(f"mini-muse {mutation}: max |Δlogit| {err:.1e}, argmax same {same}")
    assert (err <= MINI_LOGIT_TOL and same) == (mutation == "faithful"), err


# The reference's own math in float64 (model.float64_math) against the transcription: what is left is summation order
# alone. Measured 3.7e-13 on 40 tokens (the post-norm eps at 1e-5 moves it by 1.5e-2); the bound is the oracle
# ladder's float64 one (tests/engines/test_oracle.py).
F64_TOL = 1e-6


@pytest.mark.parametrize("post_eps", [residual.GATED_POST_EPS, 1e-5], ids=["faithful", "post-eps-at-rms-eps"])
def test_mini_muse_in_float64_is_its_transcription(muse, post_eps, monkeypatch):
    """Muse's post-norm eps at the pre-norms' 1e-5 instead of 1e-8 fails it."""
    monkeypatch.setattr(residual, "GATED_POST_EPS", post_eps)
    w, tokens, arrays = muse
    with model.float64_math():
        p = {k: [jnp.asarray(x, jnp.float64) for x in v] if v.ndim > 1 and k not in ("embed", "lm_head")
             else jnp.asarray(v, jnp.float64) for k, v in arrays.items()}
        T = len(tokens)
        kc, vc = model.empty_cache(MINI_MUSE, 1, T)
        got, *_ = model.forward(p, MINI_MUSE, jnp.asarray([tokens]), jnp.arange(T)[None], kc, vc, fresh=True)
        err = float(np.abs(np.asarray(got[0]) - np_muse_forward(tokens, arrays, MINI_MUSE)).max())
    print(f"mini-muse float64, post eps {post_eps}: max |Δlogit| {err:.1e}")
    assert (err <= F64_TOL) == (post_eps == 1e-8), err


@pytest.mark.parametrize("temperature", [residual.GATE_TEMPERATURE, 1.0], ids=["faithful", "gate-temperature-1"])
def test_the_gated_residual_against_its_transcription(muse, temperature, monkeypatch):
    monkeypatch.setattr(residual, "GATE_TEMPERATURE", temperature)
    w, tokens, arrays = muse
    err = np.abs(reference_logits(w, tokens) - np_muse_forward(tokens, arrays, MINI_MUSE)).max()
    assert (err <= MINI_LOGIT_TOL) == (temperature == 0.3), err


@pytest.mark.heavy  # CI drives every engine path on mini-muse through its golden file's teacher-forced check only
def test_the_reference_decodes_mini_muse_as_it_scores_it():
    """Prefill, decode past the window and a batch of unequal prompts give the one-pass argmax."""
    from engines.reference import ReferenceEngine

    e = ReferenceEngine(mini_muse())
    prompts = [list(range(3, 21)), [9, 8, 7]]  # 18 tokens: decode crosses positions 15, 16, 17 of the window
    for p, g in zip(prompts, e.generate(prompts, 6, top_k=3)):
        full = e.score([p + g.token_ids])[0].logits[len(p) - 1:-1]
        assert list(np.argmax(full, -1)) == g.token_ids


@pytest.mark.parametrize("window", [16, 15], ids=["faithful", "one-slot-short"])
def test_the_window_includes_the_query(window):
    """Hand-worked: slot s holds the value s and every score is equal, so a query's output is the mean of the slots it
    sees. With W = 16 the query at 15 sees 0..15 (7.5), at 16 sees 1..16 (8.5), at 17 sees 2..17 (9.5)."""
    S, hd = 20, 2
    q = jnp.zeros((1, 3, 1, hd))
    k = jnp.zeros((1, 1, S, hd))
    v = jnp.broadcast_to(jnp.arange(S, dtype=jnp.float32)[None, None, :, None], (1, 1, S, hd))
    out = np.asarray(model.attention(q, k, v, jnp.asarray([[15, 16, 17]]), window=window))[0, :, 0]
    assert np.allclose(out, [7.5, 8.5, 9.5]) == (window == 16), out


def test_the_router_bias_selects_only():
    """Muse's router on hand-worked numbers: logits [-2, 0, 2, 3] x 2^-2.5 through a sigmoid; the bias [2, 1, 0, 0]
    selects experts 0 and 1 (top-2 of score + bias), weighted by their unbiased scores over their sum (+ 1e-15)."""
    c = dataclasses.replace(MINI_MUSE, n_experts=4, top_k=2)
    x = jnp.eye(4)[None, :1]  # x W = the router's first row
    router = jnp.asarray([[-2.0, 0.0, 2.0, 3.0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    gates = np.asarray(model.route(x, router, jnp.asarray([2.0, 1.0, 0.0, 0.0]), c))[0, 0]
    sc = sigmoid(np.array([-2.0, 0.0]) * 2 ** -2.5)
    np.testing.assert_allclose(gates, [sc[0] / sc.sum(), sc[1] / sc.sum(), 0, 0], rtol=1e-6)


def test_the_megakernel_builds_mini_muse_with_its_own_layers():
    """The megakernel implements Muse's layers (its numbers against the reference: tests/engines/megakernel); the
    arrays it streams include the gated residual's vectors and the latent MoE's expert norm, and no QK-norm weight."""
    from engines.megakernel.engine import MegakernelEngine

    eng = MegakernelEngine(mini_muse())
    assert {"res_gate_attn", "res_gate_mlp", "expert_norm"} <= set(eng.hbm) and "q_norm" not in eng.hbm
