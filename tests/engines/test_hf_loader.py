"""Hugging Face checkpoints: a tiny one written by the test itself, in HF tensor names and the
half-split RoPE order, must give exactly the logits of the mini model it was converted from
(this also checks the two RoPE conventions against each other end to end)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from safetensors.numpy import save_file

from engines.errors import ModelError
from engines.hf_loader import load_hf
from engines.reference import ReferenceEngine
from engines.weights import Weights, interleaved_to_half, random_weights

# Same arithmetic up to a permutation of Q/K columns and the RoPE pairing: measured max
# |Δlogit| 4.5e-6 (llama: interleaved vs half-split) and 0 (deepseek_v3: mini-moe is already
# half-split); bound at 1e-5 for float32 summation-order noise.
CONVERSION_TOL = 1e-5


def _hf_config(c, model_type):
    cfg = dict(model_type=model_type, vocab_size=c.vocab_size, hidden_size=c.hidden,
               num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
               num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim, intermediate_size=c.ffn,
               rope_theta=c.rope_theta, rms_norm_eps=c.rms_eps, max_position_embeddings=c.max_context,
               tie_word_embeddings=c.tie_embeddings)
    if model_type == "deepseek_v3":
        cfg.update(n_routed_experts=c.n_experts, num_experts_per_tok=c.top_k,
                   moe_intermediate_size=c.moe_ffn, n_shared_experts=c.n_shared_experts,
                   first_k_dense_replace=c.first_dense, scoring_func=c.router,
                   norm_topk_prob=c.norm_topk, routed_scaling_factor=c.routed_scale)
    return cfg


def write_checkpoint(w: Weights, directory, model_type: str) -> None:
    """Save Weights in HF layout: (out, in) matrices, half-split Q/K order."""
    c, a = w.config, w.arrays
    q, k = a["wq"], a["wk"]
    if c.rope_style == "interleaved":
        q = np.stack([interleaved_to_half(x, c.n_heads, c.head_dim) for x in q])
        k = np.stack([interleaved_to_half(x, c.n_kv_heads, c.head_dim) for x in k])
    t = {"model.embed_tokens.weight": a["embed"], "model.norm.weight": a["final_norm"]}
    if not c.tie_embeddings:
        t["lm_head.weight"] = a["lm_head"]
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = a["attn_norm"][i]
        t[p + "post_attention_layernorm.weight"] = a["mlp_norm"][i]
        for name, arr in (("q_proj", q), ("k_proj", k), ("v_proj", a["wv"]), ("o_proj", a["wo"])):
            t[p + f"self_attn.{name}.weight"] = arr[i].T
        if c.qk_norm:
            t[p + "self_attn.q_norm.weight"] = a["q_norm"][i]
            t[p + "self_attn.k_norm.weight"] = a["k_norm"][i]
        if i < c.n_dense_layers:
            for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                t[p + f"mlp.{theirs}.weight"] = a[ours][i].T
        else:
            m = i - c.n_dense_layers
            t[p + "mlp.gate.weight"] = a["router"][m].T
            t[p + "mlp.gate.e_score_correction_bias"] = a["router_bias"][m]
            for e in range(c.n_experts):
                for ours, theirs in (("e_gate", "gate_proj"), ("e_up", "up_proj"), ("e_down", "down_proj")):
                    t[p + f"mlp.experts.{e}.{theirs}.weight"] = a[ours][m, e].T
            for ours, theirs in (("s_gate", "gate_proj"), ("s_up", "up_proj"), ("s_down", "down_proj")):
                t[p + f"mlp.shared_experts.{theirs}.weight"] = a[ours][m].T
    directory.mkdir(parents=True, exist_ok=True)
    save_file({n: np.ascontiguousarray(v, dtype=np.float32) for n, v in t.items()},
              str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(_hf_config(c, model_type)))


SEQ = [5, 77, 130, 9, 250, 33, 18, 200, 61, 4, 99]


@pytest.mark.parametrize("name,model_type", [("mini-llama", "llama"), ("mini-moe", "deepseek_v3")])
def test_checkpoint_round_trip_gives_same_logits(tmp_path, name, model_type):
    from evalsuite.models import load_model

    orig = load_model(name).weights
    write_checkpoint(orig, tmp_path / name, model_type)
    loaded = load_hf(tmp_path / name)
    assert loaded.config.rope_style == "half" and loaded.config.family == orig.config.family
    want = ReferenceEngine(orig).score([SEQ])[0].logits
    got = ReferenceEngine(loaded).score([SEQ])[0].logits
    print(name, f"{np.abs(want - got).max():.1e}")
    assert np.abs(want - got).max() <= CONVERSION_TOL


def test_qwen3_qk_norm_is_loaded_and_used(tmp_path):
    from engines.config import MINI_LLAMA

    c = replace(MINI_LLAMA, name="tiny-qwen3", rope_style="half", qk_norm=True, tie_embeddings=True)
    w = random_weights(c, seed=5)
    write_checkpoint(w, tmp_path / "q", "qwen3")
    loaded = load_hf(tmp_path / "q")
    assert loaded.config.qk_norm
    np.testing.assert_array_equal(loaded.arrays["q_norm"], w.arrays["q_norm"])
    base = ReferenceEngine(loaded).score([SEQ])[0].logits
    arrays = dict(loaded.arrays, k_norm=loaded.arrays["k_norm"] * 3.0)
    bumped = ReferenceEngine(Weights(loaded.config, arrays, "x", "x")).score([SEQ])[0].logits
    assert np.abs(base - bumped).max() > 1e-2


def test_unsupported_architecture_and_mla(tmp_path):
    d = tmp_path / "gpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelError, match="unsupported architecture 'gpt2'"):
        load_hf(d)
    from evalsuite.models import minis_dir

    cfg = json.loads((minis_dir() / "mini-deepseek-mla" / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}  # the real checkpoints' RoPE
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="DeepSeek-V3's MLA with a scaled RoPE \\(yarn\\) is not supported"):
        load_hf(d)


def test_corrupt_safetensors(tmp_path):
    from evalsuite.models import load_model

    write_checkpoint(load_model("mini-llama").weights, tmp_path / "c", "llama")
    f = tmp_path / "c" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(ModelError, match="corrupt safetensors"):
        load_hf(tmp_path / "c")
