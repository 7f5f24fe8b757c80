"""The reference's building blocks against numbers worked out by hand (rung 1 of the ladder)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from engines.config import Config
from engines.reference import model


def test_rms_norm_hand_worked():
    # x = [3, 4]: mean(x^2) = 12.5, 1/sqrt(12.5 + 0) = 0.28284; times w = [1, 2].
    y = model.rms_norm(jnp.array([3.0, 4.0]), jnp.array([1.0, 2.0]), 0.0)
    np.testing.assert_allclose(y, [3 * 0.2828427, 4 * 0.2828427 * 2], rtol=1e-6)
    # eps matters for tiny inputs: x = [0, 0] stays 0, x = [1e-3, 1e-3] with eps 1e-6 -> 1e-3/sqrt(2e-6)
    y = model.rms_norm(jnp.array([1e-3, 1e-3]), jnp.ones(2), 1e-6)
    np.testing.assert_allclose(y, [1e-3 / math.sqrt(2e-6)] * 2, rtol=1e-6)


def _rope(x, pos, style, theta=100.0):
    x = jnp.asarray(x, jnp.float32)[None, None, None, :]  # [B=1, T=1, H=1, hd]
    cos, sin = model.rope_cos_sin(jnp.array([[pos]]), x.shape[-1], theta)
    return np.asarray(model.apply_rope(x, cos, sin, style))[0, 0, 0]


def test_rope_interleaved_hand_worked():
    # hd = 4, theta = 100: frequencies 1 and 100^(-1/2) = 0.1. Position 1 rotates pair (x0, x1)
    # by 1 rad and pair (x2, x3) by 0.1 rad.
    c1, s1, c2, s2 = math.cos(1), math.sin(1), math.cos(0.1), math.sin(0.1)
    got = _rope([1.0, 0.0, 0.0, 1.0], 1, "interleaved")
    np.testing.assert_allclose(got, [c1, s1, -s2, c2], atol=1e-6)


def test_rope_half_hand_worked():
    # Same rotation, but pairs are (x0, x2) and (x1, x3).
    c1, s1, c2, s2 = math.cos(1), math.sin(1), math.cos(0.1), math.sin(0.1)
    got = _rope([1.0, 0.0, 0.0, 1.0], 1, "half")
    np.testing.assert_allclose(got, [c1, -s2, s1, c2], atol=1e-6)


def test_rope_position_zero_is_identity_and_norm_preserved():
    x = [0.3, -1.2, 2.0, 0.7]
    for style in ("interleaved", "half"):
        np.testing.assert_allclose(_rope(x, 0, style), x, atol=1e-7)
        assert np.linalg.norm(_rope(x, 57, style)) == pytest.approx(np.linalg.norm(x), rel=1e-6)


def test_gqa_attention_causal_hand_worked():
    # 2 query heads share 1 kv head; hd = 1. Keys k = [0, ln 3] at positions 0, 1; values [10, 20].
    # Query (q=1) at position 0 sees only slot 0 -> 10. At position 1 scores are [0, ln3]/sqrt(1):
    # softmax = [1/4, 3/4] -> 17.5. Slot 2 holds garbage (position 2) and must never be seen.
    k = jnp.array([0.0, math.log(3.0), 99.0]).reshape(1, 1, 3, 1)  # [B, K, S, hd]
    v = jnp.array([10.0, 20.0, -1e6]).reshape(1, 1, 3, 1)
    q = jnp.ones((1, 2, 2, 1))  # [B, T=2, H=2, hd]
    out = np.asarray(model.attention(q, k, v, jnp.array([[0, 1]])))  # [1, 2, 2]
    np.testing.assert_allclose(out[0], [[10.0, 10.0], [17.5, 17.5]], rtol=1e-6)


def test_gqa_head_grouping():
    # 4 query heads, 2 kv heads: heads 0,1 read kv head 0 (value 1), heads 2,3 read kv head 1 (value 2).
    k = jnp.zeros((1, 2, 1, 1))
    v = jnp.array([1.0, 2.0]).reshape(1, 2, 1, 1)  # [B, K, S, hd]
    out = np.asarray(model.attention(jnp.ones((1, 1, 4, 1)), k, v, jnp.array([[0]])))
    np.testing.assert_allclose(out[0, 0], [1, 1, 2, 2])


def test_swiglu_hand_worked():
    # x = [1, 2]; gate col = [1, 0] -> 1, silu(1) = 1/(1+e^-1) = 0.7310586; up col = [0, 1] -> 2;
    # down = [[3]] -> 3 * 0.7310586 * 2 = 4.3863515.
    out = model.swiglu(jnp.array([[1.0, 2.0]]), jnp.array([[1.0], [0.0]]), jnp.array([[0.0], [1.0]]),
                       jnp.array([[3.0]]))
    np.testing.assert_allclose(out, [[4.3863515]], rtol=1e-6)


def _moe_config(router: str, norm_topk: bool, scale: float = 1.0) -> Config:
    return Config(name="t", family="moe", vocab_size=8, hidden=3, n_layers=1, n_heads=1, n_kv_heads=1,
                  head_dim=2, ffn=4, rope_theta=1e4, rms_eps=1e-6, max_context=8, tie_embeddings=True,
                  n_experts=3, top_k=2, moe_ffn=2, router=router, norm_topk=norm_topk,
                  routed_scale=scale)


def test_softmax_router_top2_hand_worked():
    # Identity router: logits = x = [ln 1, ln 2, ln 5]; softmax = [1/8, 2/8, 5/8]; top-2 = experts 2, 1.
    x = jnp.log(jnp.array([1.0, 2.0, 5.0]))
    w = np.asarray(model.route(x, jnp.eye(3), jnp.zeros(3), _moe_config("softmax", False)))
    np.testing.assert_allclose(w, [0, 2 / 8, 5 / 8], rtol=1e-6)
    w = np.asarray(model.route(x, jnp.eye(3), jnp.zeros(3), _moe_config("softmax", True)))
    np.testing.assert_allclose(w, [0, 2 / 7, 5 / 7], rtol=1e-6)


def test_biased_sigmoid_router_hand_worked():
    # logits [0, 1, 2] -> sigmoid [0.5, 0.7310586, 0.8807971]. Bias [+1, 0, -1] makes the choice
    # scores [1.5, 0.731, -0.119]: experts 0 and 1 are chosen, weighed by UNBIASED sigmoid,
    # normalised (0.5 + 0.7310586 = 1.2310586) and scaled by 2.5.
    x = jnp.array([0.0, 1.0, 2.0])
    w = np.asarray(model.route(x, jnp.eye(3), jnp.array([1.0, 0.0, -1.0]), _moe_config("sigmoid", True, 2.5)))
    np.testing.assert_allclose(w, [2.5 * 0.5 / 1.2310586, 2.5 * 0.7310586 / 1.2310586, 0], rtol=1e-6)
