"""Load a Hugging Face checkpoint directory (config.json + *.safetensors) into float32 Weights.

Supported: model_type llama and qwen3 (dense), qwen3_moe (softmax router) and deepseek_v3 with
plain q/k/v attention (biased sigmoid router, shared experts, first_k_dense_replace). Not
supported, each a clear error: multi-head latent attention (DeepSeek-V3/Kimi MLA tensors),
grouped routing (n_group > 1), RoPE scaling, attention biases.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from engines.config import Config
from engines.errors import ModelError
from engines.weights import Weights

SUPPORTED = ("llama", "qwen3", "qwen3_moe", "deepseek_v3")


def _require(cfg: dict, key: str, path: Path):
    if key not in cfg:
        raise ModelError(f"{path}: config.json lacks {key!r}")
    return cfg[key]


def hf_config(cfg: dict, name: str, path: Path) -> Config:
    mt = cfg.get("model_type")
    if mt not in SUPPORTED:
        raise ModelError(f"unsupported architecture {mt!r} in {path}/config.json; supported: "
                         + ", ".join(SUPPORTED))
    if cfg.get("rope_scaling"):
        raise ModelError(f"{path}: rope_scaling {cfg['rope_scaling']!r} is not supported")
    if cfg.get("attention_bias"):
        raise ModelError(f"{path}: attention_bias=true is not supported")
    if mt == "deepseek_v3" and (cfg.get("q_lora_rank") or cfg.get("kv_lora_rank")):
        raise ModelError(f"{path}: multi-head latent attention (q_lora_rank/kv_lora_rank) is not "
                         "supported; only plain q/k/v attention")
    if (cfg.get("n_group") or 1) > 1:
        raise ModelError(f"{path}: grouped expert routing (n_group={cfg['n_group']}) is not supported")
    D = int(_require(cfg, "hidden_size", path))
    H = int(_require(cfg, "num_attention_heads", path))
    common = dict(
        name=name, vocab_size=int(_require(cfg, "vocab_size", path)), hidden=D,
        n_layers=int(_require(cfg, "num_hidden_layers", path)), n_heads=H,
        n_kv_heads=int(cfg.get("num_key_value_heads") or H),
        head_dim=int(cfg.get("head_dim") or D // H),
        ffn=int(_require(cfg, "intermediate_size", path)),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_context=int(cfg.get("max_position_embeddings", 4096)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_style="half", qk_norm=mt in ("qwen3", "qwen3_moe"),
    )
    try:
        if mt in ("llama", "qwen3"):
            return Config(family="dense", **common)
        if mt == "qwen3_moe":
            return Config(family="moe", n_experts=int(cfg["num_experts"]),
                          top_k=int(cfg["num_experts_per_tok"]), moe_ffn=int(cfg["moe_intermediate_size"]),
                          n_shared_experts=0, first_dense=0, router="softmax",
                          norm_topk=bool(cfg.get("norm_topk_prob", False)), routed_scale=1.0, **common)
        return Config(family="moe", n_experts=int(cfg["n_routed_experts"]),
                      top_k=int(cfg["num_experts_per_tok"]), moe_ffn=int(cfg["moe_intermediate_size"]),
                      n_shared_experts=int(cfg.get("n_shared_experts") or 0),
                      first_dense=int(cfg.get("first_k_dense_replace", 0)),
                      router="sigmoid" if cfg.get("scoring_func", "sigmoid") == "sigmoid" else "softmax",
                      norm_topk=bool(cfg.get("norm_topk_prob", True)),
                      routed_scale=float(cfg.get("routed_scaling_factor", 1.0)), **common)
    except KeyError as e:
        raise ModelError(f"{path}: config.json lacks {e.args[0]!r} for {mt}") from None
    except ValueError as e:
        raise ModelError(f"{path}: {e}") from None


def _read_tensors(path: Path) -> tuple[dict[str, np.ndarray], str]:

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"no *.safetensors files in {path}")
    h = hashlib.sha256()
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        data = f.read_bytes()
        h.update(data)
        try:
            from safetensors.numpy import load

            tensors.update(load(data))
        except Exception as e:  # safetensors raises its own SafetensorError for corrupt headers
            raise ModelError(f"corrupt safetensors file {f}: {e}") from None
    return tensors, h.hexdigest()


def load_hf(path: Path, name: str | None = None) -> Weights:
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelError(f"{path} is not a checkpoint directory (no config.json)")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ModelError(f"{cfg_file} is not valid JSON: {e}") from None
    c = hf_config(raw, name or path.name, path)
    t, digest = _read_tensors(path)
    used: set[str] = set()

    def get(key: str, transpose: bool = False) -> np.ndarray:
        if key not in t:
            raise ModelError(f"{path}: missing tensor {key!r}")
        used.add(key)
        a = np.asarray(t[key], dtype=np.float32)
        return a.T if transpose else a

    def stack(keys: list[str], transpose: bool = False) -> np.ndarray:
        return np.ascontiguousarray(np.stack([get(k, transpose) for k in keys]))

    L, Ld = c.n_layers, c.n_dense_layers
    pre = [f"model.layers.{i}." for i in range(L)]
    a: dict[str, np.ndarray] = {
        "embed": get("model.embed_tokens.weight"), "final_norm": get("model.norm.weight"),
        "attn_norm": stack([p + "input_layernorm.weight" for p in pre]),
        "mlp_norm": stack([p + "post_attention_layernorm.weight" for p in pre]),
        "wq": stack([p + "self_attn.q_proj.weight" for p in pre], True),
        "wk": stack([p + "self_attn.k_proj.weight" for p in pre], True),
        "wv": stack([p + "self_attn.v_proj.weight" for p in pre], True),
        "wo": stack([p + "self_attn.o_proj.weight" for p in pre], True),
    }
    if not c.tie_embeddings:
        a["lm_head"] = get("lm_head.weight")
    if c.qk_norm:
        a["q_norm"] = stack([p + "self_attn.q_norm.weight" for p in pre])
        a["k_norm"] = stack([p + "self_attn.k_norm.weight" for p in pre])
    if Ld:
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            a[ours] = stack([p + f"mlp.{theirs}.weight" for p in pre[:Ld]], True)
    if c.n_moe_layers:
        moe = pre[Ld:]
        a["router"] = stack([p + "mlp.gate.weight" for p in moe], True)
        bias_key = "mlp.gate.e_score_correction_bias"
        a["router_bias"] = (stack([p + bias_key for p in moe]) if moe[0] + bias_key in t
                            else np.zeros((len(moe), c.n_experts), np.float32))
        for ours, theirs in (("e_gate", "gate_proj"), ("e_up", "up_proj"), ("e_down", "down_proj")):
            a[ours] = np.stack([stack([p + f"mlp.experts.{e}.{theirs}.weight"
                                       for e in range(c.n_experts)], True) for p in moe])
        if c.n_shared_experts:
            for ours, theirs in (("s_gate", "gate_proj"), ("s_up", "up_proj"), ("s_down", "down_proj")):
                a[ours] = stack([p + f"mlp.shared_experts.{theirs}.weight" for p in moe], True)
    if c.tie_embeddings and "lm_head.weight" in t:
        used.add("lm_head.weight")  # some tied checkpoints still store a copy
    unused = sorted(k for k in set(t) - used if "rotary_emb" not in k)
    if unused:
        raise ModelError(f"{path}: unsupported tensors {unused[:3]}{'...' if len(unused) > 3 else ''}")
    try:
        return Weights(c, a, sha256=digest, source=str(path))
    except ValueError as e:
        raise ModelError(str(e)) from None
