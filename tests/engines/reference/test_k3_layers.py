"""Kimi K3's own layer variants, which no library implements: KDA with its forget gate bounded at -5 and one full
output-gate projection, and MLA with its sigmoid output gate. The oracle is a float64 numpy transcription of
ARCHITECTURES.md sections 1.1 and 1.2, written here token by token apart from the reference's JAX code (which runs
the sequence at once, through the shared conv and delta rule); bf() is the identity in float32."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from engines.config import Config
from engines.reference import kda, mla, model
from engines.weights import random_weights
from evalsuite.compare.rule import DLOGIT_TOL
from tests.engines.reference.test_gdn import fresh_programs  # noqa: F401

# The public kernels' own bounds for KDA against its transcription (ARCHITECTURES.md 1.1: output and state rtol 2e-5,
# atol 2e-6). Measured here, float32 reference against float64 numpy, 9 tokens: KDA 2.3e-7 (outputs up to 0.65),
# MLA 8.0e-8 (up to 0.44), the latent MoE 7.1e-7 (up to 2.7); the mutations below move them by 1.4e-2 (Kimi
# Linear's unbounded gate), 1.9e-5 (the latent norm's eps at rms_norm_eps) and 0.30 (the MoE latent normed over a
# padded width).
RTOL, ATOL = 2e-5, 2e-6

K3_MINI = Config(name="k3-layers", family="dense", vocab_size=64, hidden=32, n_layers=2, n_heads=2, n_kv_heads=2,
                 head_dim=12, ffn=32, rope_theta=1.0, rms_eps=1e-5, max_context=64, tie_embeddings=True,
                 layer_kinds=("kda", "mla"), kda_heads=2, kda_dim=8, kda_conv=4, kda_gate_rank=8, kda_out_rank=0,
                 kda_gate_bound=5.0, mla_q_rank=16, mla_kv_rank=16, mla_nope_dim=8, mla_rope_dim=4, mla_v_dim=8,
                 mla_out_gate=True)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def np_kda(x, a, c):
    """ARCHITECTURES.md 1.1, one token at a time: x [T, D] normed inputs; a: the layer's arrays (float64)."""
    H, d = c.kda_heads, c.kda_dim
    conv = np.zeros((c.kda_conv - 1, 3 * H * d))  # the 3 previous raw q|k|v projections
    S = np.zeros((H, d, d))
    outs = []
    for xt in x:
        f = (xt @ a["kda_fa"]) @ a["kda_fb"]
        raw = np.concatenate([xt @ a["kda_q"], xt @ a["kda_k"], xt @ a["kda_v"]])
        win = np.concatenate([conv, raw[None]])  # 4 taps, oldest first
        qkv = np.array([sum(win[j, ch] * a["kda_conv"][ch, j] for j in range(c.kda_conv)) for ch in range(3 * H * d)])
        qkv = qkv * sigmoid(qkv)  # silu
        conv = win[1:]
        q, k, v = (qkv[i * H * d:(i + 1) * H * d].reshape(H, d) for i in range(3))
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) * d ** -0.5
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
        g_log = -c.kda_gate_bound * sigmoid(np.exp(a["kda_A_log"])[:, None] * (f + a["kda_dt_bias"]).reshape(H, d))
        b = sigmoid(xt @ a["kda_b"])
        o = np.zeros((H, d))
        for h in range(H):
            S[h] = np.diag(np.exp(g_log[h])) @ S[h]
            S[h] = S[h] + np.outer(k[h], b[h] * (v[h] - k[h] @ S[h]))
            o[h] = q[h] @ S[h]
        o = rms(o, a["kda_norm"], c.rms_eps) * sigmoid((xt @ a["kda_g"]).reshape(H, d))
        outs.append(o.reshape(-1) @ a["kda_out"])
    return np.stack(outs)


def np_mla(x, a, c):
    """ARCHITECTURES.md 1.2 (K3: NoPE, k_pe raw, output gate), causal over the T tokens."""
    H, n, r, dv = c.n_heads, c.mla_nope_dim, c.mla_rope_dim, c.mla_v_dim
    q = (rms(x @ a["mla_qa"], a["mla_q_norm"], c.mla_norm_eps) @ a["mla_qb"]).reshape(len(x), H, n + r)
    ckv = x @ a["mla_kva"]
    lat, k_pe = rms(ckv[:, :c.mla_kv_rank], a["mla_kv_norm"], c.mla_norm_eps), ckv[:, c.mla_kv_rank:]
    kv = (lat @ a["mla_kvb"]).reshape(len(x), H, n + dv)
    outs = []
    for t in range(len(x)):
        o = np.zeros((H, dv))
        for h in range(H):
            keys = np.concatenate([kv[:t + 1, h, :n], k_pe[:t + 1]], axis=1)
            s = keys @ q[t, h] * (n + r) ** -0.5
            p = np.exp(s - s.max())
            o[h] = (p / p.sum()) @ kv[:t + 1, h, n:]
        o = o.reshape(-1) * sigmoid(x[t] @ a["mla_g"])
        outs.append(o @ a["mla_o"])
    return np.stack(outs)


@pytest.fixture(scope="module")
def k3():
    w = random_weights(K3_MINI)
    arrays = {k: np.asarray(v, np.float64) for k, v in w.arrays.items()}
    params = {k: [jnp.asarray(x, jnp.float32) for x in v] if v.ndim > 1 and k not in ("embed", "final_norm")
              else jnp.asarray(v, jnp.float32) for k, v in w.arrays.items()}
    x = np.random.default_rng(3).standard_normal((9, K3_MINI.hidden)) * 0.5
    return arrays, params, x


@pytest.mark.parametrize("mutation", [None, {"kda_gate_bound": 0.0}], ids=["faithful", "kimi-linear-gate"])
def test_k3_kda_layer_against_its_transcription(k3, mutation):
    arrays, params, x = k3
    c = dataclasses.replace(K3_MINI, **(mutation or {}))
    conv, S = kda.empty_state(c, 1, jnp.float32)
    out, _, _ = kda.kda_layer(jnp.asarray(x[None], jnp.float32), params, 0, c, conv, S, jnp.array([len(x)]),
                              model.matmul, model.rms_norm, jnp.float32)
    want = np_kda(x, {k: v[0] for k, v in arrays.items() if k.startswith("kda_")}, K3_MINI)
    assert np.allclose(np.asarray(out[0]), want, rtol=RTOL, atol=ATOL) == (mutation is None)


def test_k3_gate_is_bounded_and_differs_from_kimi_linears(k3):
    """The bounded gate stays in (-5, 0) where Kimi Linear's softplus form is unbounded below: the two disagree."""
    arrays, _, x = k3
    a = {k: v[0] for k, v in arrays.items() if k.startswith("kda_")}
    f = ((x @ a["kda_fa"]) @ a["kda_fb"] + a["kda_dt_bias"]).reshape(len(x), 2, 8)
    rate = np.exp(a["kda_A_log"])[:, None]
    bounded = -5.0 * sigmoid(rate * f)
    assert ((bounded > -5.0) & (bounded < 0.0)).all()
    assert np.abs(bounded - (-rate * np.log1p(np.exp(f)))).max() > 0.1


@pytest.mark.parametrize("mutation", [None, {"mla_norm_eps": 1e-5}], ids=["faithful", "latent-eps"])
def test_k3_mla_layer_against_its_transcription(k3, mutation):
    arrays, params, x = k3
    c = dataclasses.replace(K3_MINI, **(mutation or {}))
    T = len(x)
    kc, vc = model.empty_cache(c, 1, T)
    pos = jnp.arange(T)[None]

    def attend(q, k, v, kc_, vc_, scale):
        return model.causal_attention(q, k, v, pos, scale=scale)

    out, _, _ = mla.mla_layer(jnp.asarray(x[None], jnp.float32), params, 0, c, pos, jnp.arange(1)[:, None], kc[1],
                              vc[1], lambda z: z, attend, model.matmul, model.rms_norm)
    want = np_mla(x, {k: v[0] for k, v in arrays.items() if k.startswith("mla_")}, K3_MINI)
    assert np.allclose(np.asarray(out[0]), want, rtol=RTOL, atol=ATOL) == (mutation is None)


def test_k3_variants_run_through_the_engine():
    """The whole two-layer model decodes through the reference's engine paths (prefill, decode, batch of unequal
    prompts) the same as its one forward pass over each sequence."""
    from engines.reference import ReferenceEngine

    e = ReferenceEngine(random_weights(K3_MINI))
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]
    gens = e.generate(prompts, 6, top_k=3)
    for p, g in zip(prompts, gens):
        full = e.score([p + g.token_ids])[0].logits[len(p) - 1:-1]
        assert list(np.argmax(full, -1)) == g.token_ids


K3_MOE = Config(name="k3-moe", family="moe", vocab_size=64, hidden=32, n_layers=2, n_heads=2, n_kv_heads=2,
                head_dim=8, ffn=48, rope_theta=1e4, rms_eps=1e-5, max_context=64, tie_embeddings=True, n_experts=8,
                top_k=3, moe_ffn=12, n_shared_experts=1, first_dense=1, router="sigmoid", norm_topk=True,
                routed_scale=1.0, mlp_act="situ", expert_act="situ", moe_latent=16)


def np_situ(g, u):
    return 4 * np.tanh(g / 4) * sigmoid(g) * 25 * np.tanh(u / 25)


def np_latent_moe(x, a, c, width=None):
    """ARCHITECTURES.md 1.3 token by token: the router on x (bias selects only), the experts in the latent, their sum
    normed over the latent's width (`width`: a mutation's padded one), brought up, plus the shared situ MLP on x."""
    out = []
    for xt in x:
        s = sigmoid(xt @ a["router"])
        chosen = sorted(np.argsort(-(s + a["router_bias"]), kind="stable")[:c.top_k])
        wts = s[chosen] / s[chosen].sum()
        z = xt @ a["latent_down"]
        r = sum(w * (np_situ(z @ a["e_gate"][e], z @ a["e_up"][e]) @ a["e_down"][e]) for w, e in zip(wts, chosen))
        r = r / np.sqrt((r * r).sum() / (width or len(r)) + c.rms_eps) * a["latent_norm"]
        shared = np_situ(xt @ a["s_gate"], xt @ a["s_up"]) @ a["s_down"]
        out.append(r @ a["latent_up"] + shared)
    return np.stack(out)


def test_situ_hand_worked():
    g, u = jnp.asarray([0.0, 2.0, -8.0]), jnp.asarray([1.0, 50.0, 3.0])
    want = [0.0, 4 * np.tanh(0.5) * sigmoid(2.0) * 25 * np.tanh(2.0),
            4 * np.tanh(-2.0) * sigmoid(-8.0) * 25 * np.tanh(0.12)]
    np.testing.assert_allclose(np.asarray(model.situ(g, u)), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("width", [None, 20], ids=["faithful", "norm-over-padded-width"])
def test_k3_latent_moe_against_its_transcription(width):
    """The transcription with the latent normed over a padded width (20 for 16, as 4096 for 3584) must disagree."""
    w = random_weights(K3_MOE)
    a = {k: np.asarray(v[0], np.float64) for k, v in w.arrays.items() if v.ndim > 1 and k not in ("embed",)}
    params = {k: [jnp.asarray(x, jnp.float32) for x in v] for k, v in w.arrays.items() if v.ndim > 1 and k != "embed"}
    x = np.random.default_rng(4).standard_normal((6, K3_MOE.hidden))
    got = np.asarray(model.moe(jnp.asarray(x[None], jnp.float32), params, 0, K3_MOE)[0])
    want = np_latent_moe(x, a, K3_MOE, width)
    assert np.allclose(got, want, rtol=RTOL, atol=ATOL) == (width is None), np.abs(got - want).max()


def test_the_latent_moe_model_permutes_for_the_bf16_witness():
    """engines.weights.permuted reorders the latent as its own dimension: the same model in another summation order
    (the bf16 conditioning witness runs it), so its float32 logits agree."""
    from engines.reference import ReferenceEngine
    from engines.weights import permuted

    w = random_weights(K3_MOE)
    seq = [[3, 1, 4, 1, 5, 9, 2, 6]]
    a = ReferenceEngine(w).score(seq)[0].logits
    b = ReferenceEngine(permuted(w, 7)).score(seq)[0].logits
    assert np.abs(a - b).max() < 1e-3 * np.abs(a).max()


def np_mix(vs: list, w, eps: float):
    """ARCHITECTURES.md 1.4's depth mixture, per token: softmax over i of (v_i . w) / rms(v_i), weighting v_i."""
    v = np.stack(vs)  # [n, T, D]
    s = (v @ w) / np.sqrt(np.mean(v * v, axis=-1) + eps)
    e = np.exp(s - s.max(axis=0))
    return np.einsum("nt,ntd->td", e / e.sum(axis=0), v)


def np_kimi_forward(tokens: list[int], a: dict, c: Config) -> np.ndarray:
    """The whole K3 MINI (embedding, layers with attention residuals, final norm, head) from the layer
    transcriptions above, float64. Returns logits [T, V]."""
    def layer_arrays(prefix: str, index: int) -> dict:
        return {k: v[index] for k, v in a.items() if k.startswith(prefix) and v.ndim > 1}

    prefix, blocks, blk = a["embed"][tokens], [], c.attn_res_block
    for L in range(c.n_layers):
        mixed = np_mix(blocks[:(L - 1) // blk + 1] + [prefix], a["res_attn"][L], c.rms_eps)
        h = rms(mixed, a["attn_norm"][L], c.rms_eps)
        if c.kind(L) == "kda":
            out = np_kda(h, layer_arrays("kda_", c.kda_layers.index(L)), c)
        else:
            out = np_mla(h, layer_arrays("mla_", c.mla_layers.index(L)), c)
        if L % blk == 0:
            blocks, prefix = blocks + [prefix], np.zeros_like(prefix)
        prefix = prefix + out
        h = rms(np_mix(blocks[:L // blk + 1] + [prefix], a["res_mlp"][L], c.rms_eps), a["mlp_norm"][L], c.rms_eps)
        if L < c.first_dense:
            out = np_situ(h @ a["gate"][L], h @ a["up"][L]) @ a["down"][L]
        else:
            m = L - c.first_dense
            moe_keys = ("router", "router_bias", "latent_down", "latent_norm", "latent_up", "e_", "s_")
            out = np_latent_moe(h, {k: v[m] for k, v in a.items() if k.startswith(moe_keys)}, c)
        prefix = prefix + out
    x = rms(np_mix(blocks + [prefix], a["res_out"], c.rms_eps), a["final_norm"], c.rms_eps)
    return x @ a["lm_head"].T


# float32 against float64 of the same model: diff's float32 |Δlogit| bound (evalsuite/compare/rule.py, from the
# reference's score-vs-decode noise on the older families), far tighter than the public kernels' bf16 MINI bound
# (5e-2 and the same greedy token). Measured 9.6e-5 on 11 tokens; one block short: 18.
MINI_LOGIT_TOL = DLOGIT_TOL["float32"]


@pytest.mark.parametrize("blocks_short", [False, True], ids=["faithful", "mixture-one-block-short"])
def test_mini_kimi_against_the_whole_model_transcription(blocks_short, monkeypatch, fresh_programs):  # noqa: F811
    from engines.config import MINI_KIMI
    from engines.reference import ReferenceEngine, residual
    from engines.weights import mini_kimi

    if blocks_short:  # the MLP's mixture over one block too few
        monkeypatch.setattr(residual.AttnRes, "mlp_input", lambda self, layer: self.mix(
            self.p["res_mlp"][layer], layer // self.c.attn_res_block))
    w = mini_kimi()
    tokens = [int(t) for t in np.random.default_rng(5).integers(3, 320, 11)]
    got = ReferenceEngine(w).score([tokens])[0].logits
    want = np_kimi_forward(tokens, {k: np.asarray(v, np.float64) for k, v in w.arrays.items()}, MINI_KIMI)
    err = float(np.abs(got - want).max())
    same = list(got.argmax(-1)) == list(want.argmax(-1))
    print(f"mini-kimi {'one block short' if blocks_short else 'faithful'}: max |Δlogit| {err:.1e}, argmax same {same}")
    assert (err <= MINI_LOGIT_TOL and same) == (not blocks_short), err
