"""The wider families' primitives against numbers worked out by hand or in plain numpy (rung 1 of the ladder):
Gemma's norm, soft-capping, sliding windows and attention sinks (2 heads, head dim 8), GeGLU, gpt-oss's
clamped GLU, the RoPE scalings and MXFP4."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from engines.config import MINI_LLAMA
from engines.errors import ModelError
from engines.mxfp4 import dequantize
from engines.reference import model, rope


def test_gemma_norm_scales_by_one_plus_w():
    # x = [3, 4]: 1/sqrt(12.5) = 0.2828427; w = [0, 1] -> scales 1 and 2
    y = model.rms_norm(jnp.array([3.0, 4.0]), jnp.array([0.0, 1.0]), 0.0, "gemma")
    np.testing.assert_allclose(y, [3 * 0.2828427, 4 * 0.2828427 * 2], rtol=1e-6)


def _numpy_attention(q, k, v, q_pos, window=0, scale=None, softcap=0.0, sinks=None):
    """Plain loops: q [T, H, hd], k, v [S, K, hd] for one batch row."""
    T, H, hd = q.shape
    S, K, _ = k.shape
    out = np.zeros((T, H, hd))
    for t in range(T):
        for h in range(H):
            kh = h // (H // K)
            s = np.array([q[t, h] @ k[j, kh] for j in range(S)]) * (scale or 1 / math.sqrt(hd))
            if softcap:
                s = softcap * np.tanh(s / softcap)
            ok = np.array([j <= q_pos[t] and (not window or j > q_pos[t] - window) for j in range(S)])
            e = np.where(ok, np.exp(s - s[ok].max()), 0.0)
            denom = e.sum() + (np.exp(sinks[h] - s[ok].max()) if sinks is not None else 0.0)
            out[t, h] = (e / denom) @ v[:, kh]
    return out.reshape(T, H * hd)


@pytest.mark.parametrize("options", [dict(window=3), dict(softcap=2.0, scale=0.2), dict(sinks=[0.5, -1.0]),
                                     dict(window=2, softcap=5.0, sinks=[2.0, 0.0])],
                         ids=["window", "softcap+scale", "sinks", "all"])
def test_attention_options_against_plain_numpy(options):
    rng = np.random.default_rng(3)
    T, H, K, hd, S = 3, 2, 1, 8, 6
    q = rng.standard_normal((T, H, hd))
    k, v = rng.standard_normal((S, K, hd)), rng.standard_normal((S, K, hd))
    q_pos = np.array([3, 4, 5])
    want = _numpy_attention(q, k, v, q_pos, **options)
    jopts = dict(options, sinks=jnp.asarray(options["sinks"]) if "sinks" in options else None)
    got = model.attention(jnp.asarray(q[None], jnp.float32), jnp.asarray(k.transpose(1, 0, 2)[None], jnp.float32),
                          jnp.asarray(v.transpose(1, 0, 2)[None], jnp.float32), jnp.asarray(q_pos[None]), **jopts)
    np.testing.assert_allclose(np.asarray(got)[0], want, atol=2e-6)
    # and each option matters here: leaving it out changes the output
    plain = _numpy_attention(q, k, v, q_pos)
    assert np.abs(plain - want).max() > 1e-3


def test_geglu_and_gptoss_glu_hand_worked():
    # gelu_tanh(1) = 0.5 * (1 + tanh(sqrt(2/pi) * (1 + 0.044715))) = 0.8411920
    y = model.swiglu(jnp.array([[1.0]]), jnp.array([[1.0]]), jnp.array([[2.0]]), jnp.array([[1.0]]), "gelu_tanh")
    np.testing.assert_allclose(y, [[0.8411920 * 2.0]], rtol=1e-6)
    # gate 8 is clamped to 7, up -9 to -7: 7 * sigmoid(7 * 1.702) * (-7 + 1); gate -8 is not clamped below
    y = model.gptoss_glu(jnp.array([8.0, -8.0]), jnp.array([-9.0, 0.5]), 1.702, 7.0)
    sig = 1 / (1 + math.exp(-7 * 1.702))
    np.testing.assert_allclose(y, [7 * sig * -6, -8 / (1 + math.exp(8 * 1.702)) * 1.5], rtol=1e-5)


def _cfg(**kw):
    from dataclasses import replace

    return replace(MINI_LLAMA, head_dim=8, n_heads=2, n_kv_heads=1, rope_theta=10000.0, **kw)


def test_yarn_hand_worked():
    # hd 8, theta 1e4: plain [1, 0.1, 0.01, 0.001]. Correction dims: low = 8 ln(64/(32*2pi)) / (2 ln 1e4) < 0 -> 0,
    # high = 8 ln(64/(2pi)) / (2 ln 1e4) = 1.00806 (not truncated); ramp (i - 0) / 1.00806 clipped:
    # [0, 0.9920, 1, 1]; kept share 1 - ramp; factor 4 elsewhere. Attention factor 0.1 ln 4 + 1 = 1.138629.
    c = _cfg(rope_scaling=(("type", "yarn"), ("factor", 4.0), ("original_max_position_embeddings", 64),
                           ("beta_fast", 32.0), ("beta_slow", 1.0), ("truncate", False)))
    theta, inv, factor = rope.inv_freq(c, "full")
    high = 8 * math.log(64 / (2 * math.pi)) / (2 * math.log(1e4))
    r1 = 1 / high
    np.testing.assert_allclose(inv, [1.0, 0.1 * (1 - r1) + 0.025 * r1, 0.0025, 0.00025], rtol=1e-5)
    assert abs(factor - (0.1 * math.log(4) + 1)) < 1e-9 and theta == 1e4


def test_llama3_and_linear_hand_worked():
    # wavelengths 2pi/inv = [6.28, 62.8, 628, 6283] against 64/4 = 16 and 64/1 = 64: kept, smoothed, /8, /8.
    # smoothed: s = (64 / 62.83 - 1) / (4 - 1); (1 - s) * 0.1 / 8 + s * 0.1
    c = _cfg(rope_scaling=(("type", "llama3"), ("factor", 8.0), ("low_freq_factor", 1.0), ("high_freq_factor", 4.0),
                           ("original_max_position_embeddings", 64)))
    s = (64 / (2 * math.pi / 0.1) - 1) / 3
    np.testing.assert_allclose(rope.inv_freq(c, "full")[1], [1.0, (1 - s) * 0.0125 + s * 0.1, 0.00125, 0.000125],
                               rtol=1e-5)
    lin = _cfg(rope_scaling=(("type", "linear"), ("factor", 8.0)), rope_theta_local=100.0, layer_kinds=("full",) * 4,
               sliding_window=0)
    np.testing.assert_allclose(rope.inv_freq(lin, "full")[1], [0.125, 0.0125, 0.00125, 0.000125], rtol=1e-6)
    assert rope.inv_freq(lin, "sliding")[:2] == (100.0, None)  # sliding layers: their own base, unscaled


def test_mxfp4_hand_worked():
    # byte 0x21: low nibble 1 (0.5) first, high nibble 2 (1.0); 0x9A: codes 10 (-1.0), 9 (-0.5).
    # scale byte 128 -> 2^1. One output row of 32 inputs: [1, 2, -2, -1, 0, ...].
    blocks = np.zeros((1, 1, 16), np.uint8)
    blocks[0, 0, :2] = [0x21, 0x9A]
    out = dequantize(blocks, np.array([[128]], np.uint8))
    assert out.shape == (32, 1)
    np.testing.assert_array_equal(out[:4, 0], [1.0, 2.0, -2.0, -1.0])
    assert not out[4:].any()
    with pytest.raises(ModelError, match="malformed MXFP4"):
        dequantize(blocks.astype(np.int8), np.array([[128]], np.uint8))
