"""Kimi's layers in the reference (Kimi Delta Attention, Kimi's NoPE multi-head latent attention, the DeepSeek-style
router): hand-worked numbers, then skeptic mutations that the transformers oracle of mini-kimi-linear
(tests/engines/oracle/mini-kimi-linear.json, Kimi Linear's modelling code) must catch."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from engines.config import Config
from engines.hf_loader import load_hf
from engines.reference import gdn, mla, model
from engines.weights import Weights
from evalsuite.models import minis_dir
from tests.engines.reference.test_gdn import STEP_ATOL, STEP_RTOL, fresh_programs, oracle_rungs  # noqa: F401
from tests.engines.test_oracle import ORACLE_F64_TOL, float32_bound

ORACLE = json.loads((Path(__file__).parents[1] / "oracle" / "mini-kimi-linear.json").read_text())


def test_per_channel_decay_against_a_numpy_loop():
    """KDA's decay is one per key channel: S[h, i, :] *= exp(g[h, i])."""
    rng = np.random.default_rng(2)
    T, H, d = 5, 2, 8
    q, k, v = (rng.standard_normal((T, H, d)) * 0.3 for _ in "qkv")
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    beta = 1 / (1 + np.exp(-rng.standard_normal((T, H))))
    g = -np.exp(rng.uniform(0, 1, (T, H, d))) * np.log1p(np.exp(rng.standard_normal((T, H, d))))
    S = rng.standard_normal((H, d, d)) * 0.3
    out = []
    S_np = S.copy()
    for t in range(T):
        S_np = S_np * np.exp(g[t])[:, :, None]
        S_np = S_np + np.einsum("hk,hv->hkv", k[t], (v[t] - np.einsum("hkv,hk->hv", S_np, k[t])) * beta[t][:, None])
        out.append(np.einsum("hkv,hk->hv", S_np, q[t]))
    o, S_j = gdn.delta_rule(*(jnp.asarray(a[None], jnp.float32) for a in (q, k, v, beta, g)),
                            jnp.asarray(S[None], jnp.float32), jnp.ones((1, T), bool))
    np.testing.assert_allclose(np.asarray(o[0]), np.stack(out), rtol=STEP_RTOL, atol=STEP_ATOL)
    np.testing.assert_allclose(np.asarray(S_j[0]), S_np, rtol=STEP_RTOL, atol=STEP_ATOL)


def test_router_bias_selects_only_on_the_worked_example():
    """ARCHITECTURES.md's example: logits [-2, 0, 2, 3] with bias [2, 1, 0, 0] select experts 0 and 1 (biased scores
    2.12, 1.5 against 0.88, 0.95), weighted by their unbiased sigmoids renormalised."""
    c = Config(name="t", family="moe", vocab_size=4, hidden=1, n_layers=2, n_heads=1, n_kv_heads=1, head_dim=2, ffn=1,
               rope_theta=1.0, rms_eps=1e-6, max_context=8, tie_embeddings=True, n_experts=4, top_k=2, moe_ffn=1,
               first_dense=1, router="sigmoid", norm_topk=True, routed_scale=1.0)
    logits, bias = jnp.asarray([[-2.0, 0.0, 2.0, 3.0]]), jnp.asarray([2.0, 1.0, 0.0, 0.0])
    w = np.asarray(model.route(jnp.ones((1,)), logits, bias, c))
    s = 1 / (1 + np.exp(-np.array([-2.0, 0.0])))
    np.testing.assert_allclose(w, [s[0] / s.sum(), s[1] / s.sum(), 0.0, 0.0], rtol=1e-6)


@pytest.fixture(scope="module")
def kimi():
    return load_hf(minis_dir() / "mini-kimi-linear", "mini-kimi-linear")


def _caught(same: bool, f32: float, f64: float) -> bool:
    return not same or f32 > float32_bound(ORACLE) or f64 > ORACLE_F64_TOL


@pytest.mark.heavy  # these three change greedy tokens or logprobs outright; the latent eps (float64 only) runs in CI
def test_the_oracle_catches_kdas_gate_collapsed_to_one_per_head(kimi, monkeypatch, fresh_programs):  # noqa: F811
    rule = gdn.delta_rule
    monkeypatch.setattr(gdn, "delta_rule", lambda q, k, v, b, g, S, ok: rule(q, k, v, b, g.mean(-1) if g.ndim == 4
                                                                             else g, S, ok))
    same, f32, f64 = oracle_rungs(kimi, runs=1, oracle=ORACLE)
    print(f"KDA gate per head: tokens {'same' if same else 'differ'}, float32 {f32:.1e}, float64 {f64:.1e}")
    assert _caught(same, f32, f64)


@pytest.mark.heavy
def test_the_oracle_catches_the_router_bias_in_the_weights(kimi, monkeypatch, fresh_programs):  # noqa: F811
    scores = model.router_scores
    monkeypatch.setattr(model, "router_scores", lambda x, r, b, c: (scores(x, r, b, c)[1],) * 2)
    same, f32, f64 = oracle_rungs(kimi, runs=1, oracle=ORACLE)
    print(f"router bias in the weights: tokens {'same' if same else 'differ'}, float32 {f32:.1e}, float64 {f64:.1e}")
    assert _caught(same, f32, f64)


def test_the_oracle_catches_the_latent_norm_eps(kimi, fresh_programs):  # noqa: F811
    """The mistake the float64 rung found in this reference: transformers' latent norms use the RMSNorm default 1e-6,
    not the model's rms_norm_eps (1e-5). Float32 cannot see it (Δlogprob ~1e-5, under its bound)."""
    c = dataclasses.replace(kimi.config, mla_norm_eps=kimi.config.rms_eps)
    same, f32, f64 = oracle_rungs(Weights(c, kimi.arrays, kimi.sha256, kimi.source), runs=1, oracle=ORACLE)
    print(f"latent norm eps 1e-5: tokens {'same' if same else 'differ'}, float32 {f32:.1e}, float64 {f64:.1e}")
    assert _caught(same, f32, f64)


@pytest.mark.heavy
def test_the_oracle_catches_the_padded_score_scale(kimi, monkeypatch, fresh_programs):  # noqa: F811
    monkeypatch.setattr(mla, "score_scale", lambda c: (c.mla_nope_dim + c.mla_rope_dim + 8) ** -0.5)
    same, f32, f64 = oracle_rungs(kimi, runs=1, oracle=ORACLE)
    print(f"padded score scale: tokens {'same' if same else 'differ'}, float32 {f32:.1e}, float64 {f64:.1e}")
    assert _caught(same, f32, f64)


def _original_layout(name: str) -> str:
    """transformers' tensor name -> the original Kimi Linear checkpoints' (what save_pretrained writes back)."""
    for ours, theirs in (("forget_gate.", ""), (".mlp.", ".block_sparse_moe.")):
        name = name.replace(ours, theirs)
    return name


def original_layout_tensors(t: dict) -> dict:
    """mini-kimi-linear's tensors (transformers' names) in the released checkpoints' layout."""
    out = {}
    for k, v in t.items():
        if k.endswith("self_attn.conv1d.weight"):
            for x, part in zip("qkv", np.split(v, 3)):
                out[k.replace("conv1d", f"{x}_conv1d")] = part
        elif k.endswith("mlp.experts.gate_up_proj"):  # [E, 2F, D]: gate rows, then up rows
            F = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[_original_layout(k).replace("gate_up_proj", f"{e}.w1.weight")] = v[e, :F]
                out[_original_layout(k).replace("gate_up_proj", f"{e}.w3.weight")] = v[e, F:]
        elif k.endswith("mlp.experts.down_proj"):
            for e in range(v.shape[0]):
                out[_original_layout(k).replace("down_proj", f"{e}.w2.weight")] = v[e]
        else:
            out[_original_layout(k)] = v
    return out


def test_the_original_checkpoint_layout_loads_the_same(tmp_path, kimi):
    """The released checkpoints name things as Moonshot's code does: separate q/k/v convs, the forget gate's tensors
    under self_attn, block_sparse_moe with per-expert w1 (gate), w3 (up), w2 (down)."""
    from safetensors.numpy import load_file, save_file

    src = minis_dir() / "mini-kimi-linear"
    out = original_layout_tensors(load_file(str(src / "model.safetensors")))
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    save_file(out, str(tmp_path / "model.safetensors"))
    w = load_hf(tmp_path, "kimi-original")
    assert any(".block_sparse_moe.experts.0.w1." in k for k in out) and not any("forget_gate" in k for k in out)
    assert sorted(w.arrays) == sorted(kimi.arrays)
    for k in kimi.arrays:
        assert np.array_equal(np.asarray(w.arrays[k]), np.asarray(kimi.arrays[k])), k


@pytest.mark.parametrize("model_dir, change, message", [
    ("mini-kimi-linear", {"mla_use_nope": False}, "MLA with RoPE"),
    ("mini-kimi-linear", {"num_key_value_heads": 2}, "num_key_value_heads != num_attention_heads"),
    ("mini-kimi-linear", {"mlp_layer_types": ["sparse", "dense", "sparse", "sparse"]}, "not dense layers followed"),
    ("mini-qwen-next-moe", {"mlp_only_layers": [1]}, "do not follow the dense ones"),
    ("mini-qwen-next-moe", {"shared_expert_intermediate_size": 48}, "not a multiple of moe_intermediate_size"),
])
def test_unsupported_hybrid_configs_are_one_line_errors(tmp_path, model_dir, change, message):
    from engines.errors import ModelError

    src = minis_dir() / model_dir
    (tmp_path / "config.json").write_text(json.dumps({**json.loads((src / "config.json").read_text()), **change}))
    (tmp_path / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    with pytest.raises(ModelError, match=message):
        load_hf(tmp_path)


def test_the_oracle_catches_deepseeks_key_left_unrotated(fresh_programs):  # noqa: F811
    """DeepSeek-V3's MLA rotates q's rope part and the shared k_pe; Kimi's does not. Taking one for the other fails."""
    oracle = json.loads((Path(__file__).parents[1] / "oracle" / "mini-deepseek-mla.json").read_text())
    w = load_hf(minis_dir() / "mini-deepseek-mla", "mini-deepseek-mla")
    c = dataclasses.replace(w.config, mla_rope=False)
    same, f32, f64 = oracle_rungs(Weights(c, w.arrays, w.sha256, w.source), runs=1, oracle=oracle)
    print(f"DeepSeek MLA as NoPE: tokens {'same' if same else 'differ'}, float32 {f32:.1e}, float64 {f64:.1e}")
    assert not same or f32 > float32_bound(oracle) or f64 > ORACLE_F64_TOL


@pytest.mark.parametrize("name", ["mini-kimi-linear", "mini-deepseek-mla"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_absorbed_mla_form_against_the_expanded_one(name, dtype):
    """The absorbed latent form (mla.mla_absorbed) equals the expanded per-head form the reference caches: within the
    transcription bound in float32 (measured 3.6e-7 NoPE, 3.0e-7 RoPE, outputs of order 1), and within two bf16 ulps
    of the output's scale in bfloat16, where only the rounding differs (measured 0.69 and 0.71 ulp)."""
    from engines.reference.engine import device_params
    from tests.engines.reference.test_k3_layers import ATOL, RTOL

    w = load_hf(minis_dir() / name, name)
    c, p, T = w.config, device_params(w, dtype), 20
    pos = jnp.arange(T)[None]
    h = jnp.asarray(np.random.default_rng(0).standard_normal((1, T, c.hidden)), jnp.float32)
    cos_sin = model.rope_cos_sin(pos, c.mla_rope_dim, c.rope_theta)

    def rotate(x):
        return model.apply_rope(x, *cos_sin, c.rope_style)

    def attend(q, k, v, kc, vc, scale):
        return model.causal_attention(q, k, v, pos, scale=scale)

    kc, vc = model.empty_cache(c, 1, T)
    layer = c.mla_layers[0]
    expanded = np.asarray(mla.mla_layer(h, p, 0, c, pos, jnp.arange(1)[:, None], kc[layer], vc[layer], lambda z: z,
                                        attend, model.matmul, model.rms_norm, rotate)[0])
    absorbed = np.asarray(mla.mla_absorbed(h, p, 0, c, pos, model.matmul, model.rms_norm, rotate))
    if dtype == "float32":
        np.testing.assert_allclose(absorbed, expanded, rtol=RTOL, atol=ATOL)
    else:
        assert np.abs(absorbed - expanded).max() <= 2 * 2.0 ** -8 * np.abs(expanded).max()
