"""Load a Hugging Face checkpoint directory (config.json + *.safetensors) into float32 Weights.

Supported model_types: llama, qwen2, qwen3 (dense), qwen3_moe (softmax router), deepseek_v3 with plain q/k/v
attention or its multi-head latent attention (biased sigmoid router, shared experts, first_k_dense_replace),
gemma2, gemma3_text (Gemma3ForCausalLM), gpt_oss (MXFP4 experts dequantised on load), qwen3_next (the Gated
DeltaNet hybrid of Qwen3-Next / Qwen3.8: GDN layers and gated full-attention layers with a partial RoPE; dense
MLPs or Qwen3-Next's sparse MoE with its gated shared expert) and kimi_linear (Kimi Delta Attention and NoPE
multi-head latent attention layers, DeepSeek-style MoE);
the hybrids' parts are in engines.hf_hybrid. RoPE scaling: linear, llama3, yarn, read from transformers 5's
`rope_parameters` or the older `rope_theta` + `rope_scaling`. Not supported, each a one-line error naming it:
a scaled RoPE on DeepSeek-V3's MLA, grouped routing (n_group > 1), other RoPE scalings, Qwen2's own sliding window,
MLP biases.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from engines import hf_hybrid, mxfp4
from engines import lazy as lazy_mod
from engines.config import Config
from engines.errors import ModelError
from engines.weights import Weights

SUPPORTED = ("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "gemma2", "gemma3_text", "gpt_oss", "qwen3_next",
             "kimi_linear")
GEMMA = ("gemma2", "gemma3_text")
LAYER_KIND = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "gdn"}
ROPE_KEYS = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                               "original_max_position_embeddings"),
             "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
                      "mscale", "mscale_all_dim", "truncate")}


def _require(cfg: dict, key: str, path: Path):
    if key not in cfg:
        raise ModelError(f"{path}: config.json lacks {key!r}")
    return cfg[key]


def _rope(params: dict | None, path: Path) -> tuple[float | None, tuple]:
    """(rope_theta or None, Config.rope_scaling pairs) from one rope_parameters / rope_scaling dict."""
    if not params:
        return None, ()
    kind = params.get("rope_type") or params.get("type") or "default"
    theta = params.get("rope_theta")
    if kind == "default":
        return theta, ()
    if kind not in ROPE_KEYS:
        raise ModelError(f"{path}: RoPE scaling {kind!r} is not supported (supported: {', '.join(ROPE_KEYS)})")
    return theta, (("type", kind),) + tuple((k, params[k]) for k in ROPE_KEYS[kind] if params.get(k) is not None)


def _rope_fields(cfg: dict, path: Path) -> dict:
    """rope_theta, rope_theta_local and rope_scaling, from either config.json format."""
    params = cfg.get("rope_parameters")
    local: dict | None = None
    if isinstance(params, dict) and "full_attention" in params:  # per layer kind (Gemma 3, transformers 5)
        params, local = params.get("full_attention"), params.get("sliding_attention")
    if params is None:  # transformers 4: rope_theta + rope_scaling (+ Gemma 3's rope_local_base_freq)
        params = dict(cfg.get("rope_scaling") or {}, rope_theta=cfg.get("rope_theta", 10000.0))
        if cfg.get("rope_local_base_freq"):
            local = {"rope_type": "default", "rope_theta": cfg["rope_local_base_freq"]}
    theta, scaling = _rope(params, path)
    theta_local, local_scaling = _rope(local, path)
    if local_scaling:
        raise ModelError(f"{path}: RoPE scaling on the sliding layers is not supported")
    return dict(rope_theta=float(theta or 10000.0), rope_theta_local=float(theta_local or 0.0), rope_scaling=scaling)


def _layer_kinds(cfg: dict, mt: str, n_layers: int) -> tuple[str, ...]:
    if mt == "kimi_linear":
        return hf_hybrid.kimi_layer_kinds(cfg, n_layers)
    if cfg.get("layer_types"):
        return tuple(LAYER_KIND.get(k, k) for k in cfg["layer_types"])
    if mt == "gemma2":  # transformers 4: sliding, full, sliding, ...
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(n_layers))
    if mt == "gemma3_text":  # every sliding_window_pattern-th layer is full
        n = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        return tuple("full" if (i + 1) % n == 0 else "sliding" for i in range(n_layers))
    return ()


def _family_fields(cfg: dict, mt: str, path: Path) -> dict:
    """The Config fields beyond Llama's that each family sets."""
    out: dict = {}
    if mt == "qwen2":
        if cfg.get("use_sliding_window"):
            raise ModelError(f"{path}: Qwen2's use_sliding_window=true is not supported")
        out.update(attn_bias=True)
    elif cfg.get("attention_bias") and mt != "gpt_oss":
        raise ModelError(f"{path}: attention_bias=true is not supported for {mt}")
    if cfg.get("mlp_bias"):
        raise ModelError(f"{path}: mlp_bias=true is not supported")
    if mt in GEMMA:
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ModelError(f"{path}: hidden_activation {act!r} is not supported (Gemma: gelu_pytorch_tanh)")
        out.update(norm_style="gemma", post_norms=True, mlp_act="gelu_tanh", embed_scale=True,
                   query_scale=float(cfg.get("query_pre_attn_scalar") or cfg.get("head_dim") or 0),
                   attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
                   final_softcap=float(cfg.get("final_logit_softcapping") or 0.0), qk_norm=mt == "gemma3_text")
    if mt == "qwen3_next":
        out.update(hf_hybrid.qwen3_next_fields(cfg, path))
    if mt == "kimi_linear":
        out.update(hf_hybrid.kimi_linear_fields(cfg, path))
    if mt == "deepseek_v3" and cfg.get("kv_lora_rank"):
        out.update(hf_hybrid.deepseek_mla_fields(cfg, path))
    if mt == "gpt_oss":
        out.update(attn_bias=True, o_bias=True, attn_sinks=True, expert_act="gptoss", expert_bias=True,
                   swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)), swiglu_limit=float(cfg.get("swiglu_limit", 7.0)))
    return out


def hf_config(cfg: dict, name: str, path: Path) -> Config:
    mt = cfg.get("model_type")
    if mt == "gemma3":
        raise ModelError(f"{path}: a multimodal Gemma 3 checkpoint (model_type 'gemma3'); only the text model "
                         "(Gemma3ForCausalLM, model_type 'gemma3_text') is supported")
    if mt not in SUPPORTED:
        raise ModelError(f"unsupported architecture {mt!r} in {path}/config.json; supported: "
                         + ", ".join(SUPPORTED))
    if (cfg.get("n_group") or 1) > 1:
        raise ModelError(f"{path}: grouped expert routing (n_group={cfg['n_group']}) is not supported")
    quant = (cfg.get("quantization_config") or {}).get("quant_method")
    # gpt-oss's mxfp4 experts; Kimi's compressed-tensors MXFP4 experts (weight_packed + weight_scale, read by _Reader)
    if quant and (quant, mt) not in (("mxfp4", "gpt_oss"), ("compressed-tensors", "kimi_linear")):
        raise ModelError(f"{path}: quantization {quant!r} is not supported (only gpt-oss's mxfp4 experts and Kimi's "
                         "compressed-tensors MXFP4 experts)")
    D = int(_require(cfg, "hidden_size", path))
    H = int(_require(cfg, "num_attention_heads", path))
    L = int(_require(cfg, "num_hidden_layers", path))
    kinds = _layer_kinds(cfg, mt, L)
    common = dict(
        name=name, vocab_size=int(_require(cfg, "vocab_size", path)), hidden=D, n_layers=L, n_heads=H,
        n_kv_heads=int(cfg.get("num_key_value_heads") or H),
        head_dim=int(cfg.get("head_dim") or D // H),
        ffn=int(_require(cfg, "intermediate_size", path)),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_context=int(cfg.get("max_position_embeddings", 4096)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", mt in GEMMA)),
        rope_style="half", qk_norm=mt in ("qwen3", "qwen3_moe"),
        layer_kinds=kinds, sliding_window=int(cfg.get("sliding_window") or 0) if "sliding" in kinds else 0,
        **_rope_fields(cfg, path))
    common.update(_family_fields(cfg, mt, path))
    try:
        if mt == "qwen3_next" and "n_experts" in common:  # its sparse MoE (hf_hybrid.qwen3_next_fields)
            return Config(family="moe", **common)
        if mt in ("llama", "qwen2", "qwen3", "qwen3_next") + GEMMA:
            return Config(family="dense", **common)
        if mt == "kimi_linear":
            first = hf_hybrid.kimi_mlp_split(cfg, L, path)
            if first == L:
                return Config(family="dense", **common)
            return Config(family="moe", n_experts=int(cfg.get("num_experts") or cfg["num_local_experts"]),
                          top_k=int(cfg.get("num_experts_per_token") or cfg["num_experts_per_tok"]),
                          moe_ffn=int(cfg["moe_intermediate_size"]),
                          n_shared_experts=int(cfg.get("n_shared_experts") or cfg.get("num_shared_experts") or 0),
                          first_dense=first, router="sigmoid", norm_topk=bool(cfg.get("norm_topk_prob", True)),
                          routed_scale=float(cfg.get("routed_scaling_factor", 1.0)), **common)
        if mt in ("qwen3_moe", "gpt_oss"):
            experts = "num_experts" if mt == "qwen3_moe" else "num_local_experts"
            ffn = "moe_intermediate_size" if mt == "qwen3_moe" else "intermediate_size"
            return Config(family="moe", n_experts=int(cfg[experts]),
                          top_k=int(cfg["num_experts_per_tok"]), moe_ffn=int(cfg[ffn]),
                          n_shared_experts=0, first_dense=0, router="softmax",
                          norm_topk=bool(cfg.get("norm_topk_prob", mt == "gpt_oss")), routed_scale=1.0, **common)
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


def _gptoss_experts(pre: list[str], names, get, stack) -> dict[str, np.ndarray]:
    """gpt-oss's router and experts. The checkpoint fuses gate and up into gate_up_proj [E, D, 2F] with the
    two interleaved (gate = even columns, up = odd), stored as MXFP4 blocks + scales (the released
    checkpoints) or as plain floats (a dequantised copy)."""
    from engines.mxfp4 import dequantize

    def experts(p: str, name: str) -> np.ndarray:  # [E, in, out]
        key = p + f"mlp.experts.{name}"
        if key + "_blocks" in names:
            return dequantize(get(key + "_blocks", raw=True), get(key + "_scales", raw=True))
        return get(key)

    gate_up = np.stack([experts(p, "gate_up_proj") for p in pre])  # [L, E, D, 2F]
    gate_up_b = stack([p + "mlp.experts.gate_up_proj_bias" for p in pre])  # [L, E, 2F]
    return {"router": stack([p + "mlp.router.weight" for p in pre], True),
            "router_bias": stack([p + "mlp.router.bias" for p in pre]),
            "e_gate": np.ascontiguousarray(gate_up[..., 0::2]), "e_up": np.ascontiguousarray(gate_up[..., 1::2]),
            "e_gate_b": np.ascontiguousarray(gate_up_b[..., 0::2]),
            "e_up_b": np.ascontiguousarray(gate_up_b[..., 1::2]),
            "e_down": np.stack([experts(p, "down_proj") for p in pre]),
            "e_down_b": stack([p + "mlp.experts.down_proj_bias" for p in pre])}


def _index_tensors(path: Path) -> tuple[dict[str, Path], str]:
    """Tensor name -> its file, and the files' sha256 (streamed: nothing is loaded)."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"no *.safetensors files in {path}")
    h = hashlib.sha256()
    where: dict[str, Path] = {}
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                h.update(chunk)
        try:
            with safe_open(str(f), framework="np") as st:
                where.update({k: f for k in st.keys()})
        except Exception as e:  # safetensors raises its own SafetensorError for corrupt headers
            raise ModelError(f"corrupt safetensors file {f}: {e}") from None
    return where, h.hexdigest()


class _Reader:
    """A checkpoint's tensors by name, eager (float32 numpy) or lazy (engines.lazy, read on demand), recording
    which were used so that an unsupported tensor is an error rather than silently ignored."""

    def __init__(self, path: Path, tensors: dict, lazy: bool, rename=None):
        """rename: our name -> the checkpoint's, tried where our name is absent (a family's original layout)."""
        self.path, self.t, self.lazy, self.rename = path, tensors, lazy, rename
        self.used: set[str] = set()
        self.counter = [0]  # bytes the lazy arrays read

    def name(self, key: str) -> str:
        return self.rename(key) if key not in self.t and self.rename else key

    def has(self, key: str) -> bool:
        return self.name(key) in self.t or self._packed(self.name(key)) is not None

    def _packed(self, key: str) -> tuple[str, str] | None:
        """(weight_packed, weight_scale) names where an MXFP4 tensor stands for key (Kimi K3's experts)."""
        if not key.endswith(".weight"):
            return None
        stem = key[:-len("weight")]
        names = (stem + "weight_packed", stem + "weight_scale")
        return names if all(n in self.t for n in names) else None

    def get(self, key: str, transpose: bool = False, raw: bool = False) -> np.ndarray:
        key = self.name(key)
        packed = self._packed(key) if key not in self.t and not raw else None
        if packed:  # dequantised whole (exact), in either mode
            a = mxfp4.dequantize_packed(*(np.asarray(self.get(n, raw=True)) for n in packed),
                                        name=f"{self.path}: {key}")
            return self.dense(a.T if transpose else a)
        if key not in self.t:
            raise ModelError(f"{self.path}: missing tensor {key!r}")
        self.used.add(key)
        if self.lazy:
            return lazy_mod.Tensor(self.t[key], key, transpose, self.counter) if not raw else lazy_mod.Tensor(
                self.t[key], key, False, self.counter).raw()
        a = self.t[key] if raw else np.asarray(self.t[key], dtype=np.float32)
        return a.T if transpose else a

    def stack(self, keys: list[str], transpose: bool = False) -> np.ndarray:
        if self.lazy:
            return lazy_mod.Stacked([self.get(k, transpose) for k in keys])
        return np.ascontiguousarray(np.stack([self.get(k, transpose) for k in keys]))

    def dense(self, a):  # an array the loader computed: whole, in either mode
        return lazy_mod.Eager(np.asarray(a, np.float32)) if self.lazy else a


def _attention_arrays(c, r: _Reader, pre_all: list[str]) -> dict:
    """Embedding, norms, attention projections (and their biases, sinks, q/k norms, output gate), the LM head.
    The projections are stacked over the attention layers only (Config.attn_layers)."""
    gemma = c.post_norms
    pre = [pre_all[i] for i in c.attn_layers]
    a = {
        "embed": r.get("model.embed_tokens.weight"), "final_norm": r.get("model.norm.weight"),
        "attn_norm": r.stack([p + "input_layernorm.weight" for p in pre_all]),
        # Gemma's post_attention_layernorm follows attention; its pre_feedforward_layernorm is the MLP's input norm
        "mlp_norm": r.stack([p + ("pre_feedforward_layernorm.weight" if gemma else "post_attention_layernorm.weight")
                             for p in pre_all]),
    }
    if pre:
        for ours, theirs in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
            a[ours] = r.stack([p + f"self_attn.{theirs}.weight" for p in pre], True)
    if gemma:
        a["post_attn_norm"] = r.stack([p + "post_attention_layernorm.weight" for p in pre_all])
        a["post_mlp_norm"] = r.stack([p + "post_feedforward_layernorm.weight" for p in pre_all])
    if c.attn_out_gate:  # q_proj's rows per head: hd of query, then hd of gate
        qg = np.stack([np.asarray(r.get(p + "self_attn.q_proj.weight", True)) for p in pre])  # [La, D, H*2*hd]
        qg = qg.reshape(len(pre), c.hidden, c.n_heads, 2, c.head_dim)
        a["wq"] = r.dense(qg[:, :, :, 0].reshape(len(pre), c.hidden, c.q_size))
        a["wg"] = r.dense(qg[:, :, :, 1].reshape(len(pre), c.hidden, c.q_size))
    a.update(hf_hybrid.gdn_arrays(c, r, [pre_all[i] for i in c.gdn_layers]))
    a.update(hf_hybrid.kda_arrays(c, r, [pre_all[i] for i in c.kda_layers]))
    a.update(hf_hybrid.mla_arrays(c, r, [pre_all[i] for i in c.mla_layers]))
    if c.attn_bias:
        for ours, theirs in (("bq", "q_proj"), ("bk", "k_proj"), ("bv", "v_proj")):
            a[ours] = r.stack([p + f"self_attn.{theirs}.bias" for p in pre])
    if c.o_bias:
        a["bo"] = r.stack([p + "self_attn.o_proj.bias" for p in pre])
    if c.attn_sinks:
        a["sinks"] = r.stack([p + "self_attn.sinks" for p in pre])
    if not c.tie_embeddings:
        a["lm_head"] = r.get("lm_head.weight")
    if c.qk_norm:
        a["q_norm"] = r.stack([p + "self_attn.q_norm.weight" for p in pre])
        a["k_norm"] = r.stack([p + "self_attn.k_norm.weight" for p in pre])
    return a


def _mlp_arrays(c, r: _Reader, pre: list[str]) -> dict:
    """The dense layers' MLPs, then the MoE layers' router, experts and shared experts."""
    Ld, a = c.n_dense_layers, {}
    if Ld:
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            a[ours] = r.stack([p + f"mlp.{theirs}.weight" for p in pre[:Ld]], True)
    if c.n_moe_layers and c.expert_act == "gptoss":
        a.update({k: r.dense(v) for k, v in _gptoss_experts(
            pre, r.t, lambda *x, **kw: np.asarray(r.get(*x, **kw)), lambda *x: np.asarray(r.stack(*x))).items()})
    elif c.n_moe_layers:
        moe = pre[Ld:]
        a["router"] = r.stack([p + "mlp.gate.weight" for p in moe], True)
        bias_key = "mlp.gate.e_score_correction_bias"
        a["router_bias"] = (r.stack([p + bias_key for p in moe]) if r.has(moe[0] + bias_key)
                            else r.dense(np.zeros((len(moe), c.n_experts), np.float32)))
        if r.has(moe[0] + "mlp.experts.gate_up_proj"):  # transformers 5's fused experts: [E, 2F, D], [E, D, F]
            gate_up = np.stack([np.asarray(r.get(p + "mlp.experts.gate_up_proj")) for p in moe]).swapaxes(2, 3)
            a.update(e_gate=r.dense(gate_up[..., :c.moe_ffn]), e_up=r.dense(gate_up[..., c.moe_ffn:]),
                     e_down=r.dense(np.stack([np.asarray(r.get(p + "mlp.experts.down_proj")) for p in moe]
                                             ).swapaxes(2, 3)))
        else:
            for ours, theirs in (("e_gate", "gate_proj"), ("e_up", "up_proj"), ("e_down", "down_proj")):
                per_layer = [r.stack([p + f"mlp.experts.{e}.{theirs}.weight" for e in range(c.n_experts)], True)
                             for p in moe]
                a[ours] = lazy_mod.Stacked(per_layer) if r.lazy else np.stack(per_layer)
        if c.n_shared_experts:
            shared = "mlp.shared_expert." if c.shared_expert_gate else "mlp.shared_experts."  # Qwen3-Next: one
            for ours, theirs in (("s_gate", "gate_proj"), ("s_up", "up_proj"), ("s_down", "down_proj")):
                a[ours] = r.stack([p + f"{shared}{theirs}.weight" for p in moe], True)
        if c.shared_expert_gate:  # [1, D] each
            a["shared_gate"] = r.dense(np.stack([np.asarray(r.get(p + "mlp.shared_expert_gate.weight"))[0]
                                                 for p in moe]))
    return a


def load_hf(path: Path, name: str | None = None, lazy: bool = False) -> Weights:
    """lazy: every array a LazyArray (engines.lazy) read from the files on demand, so that a sharded reference
    reads only its devices' slices; the tensors the loader must compute (gpt-oss's fused, MXFP4 experts) are
    computed whole."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelError(f"{path} is not a checkpoint directory (no config.json)")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ModelError(f"{cfg_file} is not valid JSON: {e}") from None
    c = hf_config(raw, name or path.name, path)
    t, digest = _index_tensors(path) if lazy else _read_tensors(path)
    r = _Reader(path, t, lazy, hf_hybrid.kimi_rename if raw.get("model_type") == "kimi_linear" else None)
    pre = [f"model.layers.{i}." for i in range(c.n_layers)]
    a = {**_attention_arrays(c, r, pre), **_mlp_arrays(c, r, pre)}
    if c.tie_embeddings and "lm_head.weight" in t:
        r.used.add("lm_head.weight")  # some tied checkpoints still store a copy
    unused = sorted(k for k in set(t) - r.used if "rotary_emb" not in k)
    if unused:
        raise ModelError(f"{path}: unsupported tensors {unused[:3]}{'...' if len(unused) > 3 else ''}")
    try:
        return Weights(c, lazy_mod.LazyArrays(a, r.counter) if lazy else a, sha256=digest, source=str(path))
    except ValueError as e:
        raise ModelError(str(e)) from None
