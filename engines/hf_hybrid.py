"""The hybrid linear-attention families of engines.hf_loader: Qwen3-Next (Gated DeltaNet + gated attention; the
layout of Qwen3.8) and Kimi Linear (Kimi Delta Attention + multi-head latent attention + DeepSeek-style MoE; the
layout of Kimi K3's attention). Their Config fields from config.json and their per-layer arrays from the tensors.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from engines.errors import ModelError

KIMI_LAYER_KIND = {"linear_attention": "kda", "full_attention": "mla"}


def qwen3_next_fields(cfg: dict, path: Path) -> dict:
    """Qwen3-Next: zero-centred norms (1 + w) everywhere but the GDN output norm, q/k norms, the per-head output
    gate, a partial RoPE, and the GDN layers' dims; and its sparse MoE (softmax router, top-k renormalised or not, a
    shared expert behind a sigmoid gate) where the sparse layers follow the dense ones."""
    L = int(cfg.get("num_hidden_layers") or 0)
    sparse = [i for i in range(L) if (cfg.get("num_experts") or 0) > 0 and i not in (cfg.get("mlp_only_layers") or [])
              and (i + 1) % int(cfg.get("decoder_sparse_step") or 1) == 0]
    moe = {}
    if sparse:
        first = L - len(sparse)
        if sparse != list(range(first, L)):
            raise ModelError(f"{path}: Qwen3-Next's sparse layers {sparse} do not follow the dense ones (only dense "
                             "layers first, then sparse layers, is supported)")
        F, Fs = int(cfg["moe_intermediate_size"]), int(cfg.get("shared_expert_intermediate_size") or 0)
        if Fs % F:
            raise ModelError(f"{path}: shared_expert_intermediate_size {Fs} is not a multiple of "
                             f"moe_intermediate_size {F}")
        moe = dict(n_experts=int(cfg["num_experts"]), top_k=int(cfg["num_experts_per_tok"]), moe_ffn=F,
                   n_shared_experts=Fs // F, first_dense=first, router="softmax",
                   norm_topk=bool(cfg.get("norm_topk_prob", True)), routed_scale=1.0, shared_expert_gate=Fs > 0)
    if (cfg.get("hidden_act") or "silu") != "silu":
        raise ModelError(f"{path}: hidden_act {cfg['hidden_act']!r} is not supported (Qwen3-Next: silu)")
    hd = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    factor = cfg.get("partial_rotary_factor") or (cfg.get("rope_parameters") or {}).get("partial_rotary_factor") or 1.0
    return dict(norm_style="gemma", qk_norm=True, attn_out_gate=True, rotary_dim=int(hd * float(factor)),
                gdn_k_heads=int(cfg["linear_num_key_heads"]), gdn_v_heads=int(cfg["linear_num_value_heads"]),
                gdn_k_dim=int(cfg["linear_key_head_dim"]), gdn_v_dim=int(cfg["linear_value_head_dim"]),
                gdn_conv=int(cfg["linear_conv_kernel_dim"]), **moe)


def kimi_layer_kinds(cfg: dict, L: int) -> tuple[str, ...]:
    """"kda" or "mla" per layer: config.json's layer_types, or the original checkpoints' 1-indexed
    linear_attn_config lists, or transformers' default pattern (MLA at every 4th layer but the first)."""
    if cfg.get("layer_types"):
        return tuple(KIMI_LAYER_KIND.get(k, k) for k in cfg["layer_types"])
    lac = cfg.get("linear_attn_config") or {}
    if "full_attn_layers" in lac:
        full = {int(i) - 1 for i in lac["full_attn_layers"]}
        return tuple("mla" if i in full else "kda" for i in range(L))
    return tuple("mla" if i and i % 4 == 0 else "kda" for i in range(L))


def kimi_linear_fields(cfg: dict, path: Path) -> dict:
    """Kimi Linear: KDA and MLA layers (NoPE), dense MLP layers then DeepSeek-style MoE (the caller's moe fields)."""
    H = int(cfg["num_attention_heads"])
    if int(cfg.get("num_key_value_heads") or H) != H:
        raise ModelError(f"{path}: MLA with num_key_value_heads != num_attention_heads is not supported")
    if cfg.get("mla_use_nope") is False:
        raise ModelError(f"{path}: MLA with RoPE (mla_use_nope=false) is not supported; Kimi's MLA is NoPE")
    if (cfg.get("hidden_act") or "silu") != "silu":
        raise ModelError(f"{path}: hidden_act {cfg['hidden_act']!r} is not supported (Kimi Linear: silu)")
    lac = cfg.get("linear_attn_config") or {}
    d = int(lac.get("head_dim") or cfg.get("linear_head_dim") or 128)
    return dict(kda_heads=int(lac.get("num_heads") or cfg.get("linear_num_heads") or 32), kda_dim=d,
                kda_conv=int(lac.get("short_conv_kernel_size") or cfg.get("linear_conv_kernel_dim") or 4),
                kda_gate_rank=d, kda_out_rank=d, mla_q_rank=int(cfg.get("q_lora_rank") or 0),
                mla_kv_rank=int(cfg["kv_lora_rank"]), mla_nope_dim=int(cfg["qk_nope_head_dim"]),
                mla_rope_dim=int(cfg["qk_rope_head_dim"]),
                mla_v_dim=int(cfg.get("v_head_dim") or cfg["qk_nope_head_dim"]),
                head_dim=int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"]), n_kv_heads=H)


def deepseek_mla_fields(cfg: dict, path: Path) -> dict:
    """DeepSeek-V3 with its multi-head latent attention on every layer: the rope part of q and the shared k_pe
    rotated (interleaved pairs unless rope_interleave is false). Its YaRN (the real checkpoints') also scales the
    softmax by mscale^2, which the reference does not implement: a scaled RoPE is refused."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if (params.get("rope_type") or params.get("type") or "default") != "default":
        kind = params.get("rope_type") or params.get("type")
        raise ModelError(f"{path}: DeepSeek-V3's MLA with a scaled RoPE ({kind}) is not supported")
    L, H = int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    nope, rope = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
    return dict(layer_kinds=("mla",) * L, mla_q_rank=int(cfg.get("q_lora_rank") or 0),
                mla_kv_rank=int(cfg["kv_lora_rank"]),
                mla_nope_dim=nope, mla_rope_dim=rope, mla_v_dim=int(cfg.get("v_head_dim") or nope), mla_rope=True,
                rope_style="interleaved" if cfg.get("rope_interleave", True) else "half", head_dim=nope + rope,
                n_kv_heads=H)


def kimi_mlp_split(cfg: dict, L: int, path: Path) -> int:
    """The number of leading dense MLP layers (the rest are MoE); refuses any other order."""
    kinds = cfg.get("mlp_layer_types") or ["dense" if i < int(cfg.get("first_k_dense_replace", 1)) else "sparse"
                                           for i in range(L)]
    first = next((i for i, k in enumerate(kinds) if k != "dense"), L)
    if any(k != "sparse" for k in kinds[first:]):
        raise ModelError(f"{path}: mlp_layer_types {kinds} is not dense layers followed by sparse ones")
    return first


def kimi_rename(key: str) -> str:
    """Our (transformers') tensor name -> the original Kimi checkpoints' (block_sparse_moe, w1/w3/w2 experts)."""
    key = key.replace(".mlp.", ".block_sparse_moe.")
    for ours, theirs in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
        key = re.sub(rf"experts\.(\d+)\.{ours}\.", rf"experts.\1.{theirs}.", key)
    return key


def gdn_arrays(c, r, pre: list[str]) -> dict:
    """The Gated DeltaNet layers' arrays (engines.weights' gdn_*). Qwen3-Next fuses q, k, v and z into one
    projection grouped by key head ([q | k | v of its Hv/Hk value heads | z of them] per key head), and b and a
    likewise; they are split here into the head-major layout the reference reads (value head j*r + m is key head
    j's m-th), computed whole in either loading mode."""
    if not pre:
        return {}
    Hk, Hv, dk, dv, D = c.gdn_k_heads, c.gdn_v_heads, c.gdn_k_dim, c.gdn_v_dim, c.hidden
    rv = Hv // Hk

    def per_layer(name: str, transpose: bool = True) -> np.ndarray:
        return np.stack([np.asarray(r.get(p + "linear_attn." + name, transpose)) for p in pre])

    qkvz = per_layer("in_proj_qkvz.weight").reshape(len(pre), D, Hk, 2 * dk + 2 * rv * dv)
    q, k, v, z = np.split(qkvz, [dk, 2 * dk, 2 * dk + rv * dv], axis=-1)
    ba = per_layer("in_proj_ba.weight").reshape(len(pre), D, Hk, 2 * rv)
    a = {"gdn_q": q.reshape(len(pre), D, Hk * dk), "gdn_k": k.reshape(len(pre), D, Hk * dk),
         "gdn_v": v.reshape(len(pre), D, Hv * dv), "gdn_z": z.reshape(len(pre), D, Hv * dv),
         "gdn_b": ba[..., :rv].reshape(len(pre), D, Hv), "gdn_a": ba[..., rv:].reshape(len(pre), D, Hv),
         "gdn_conv": per_layer("conv1d.weight", False)[:, :, 0, :],
         "gdn_A_log": per_layer("A_log", False), "gdn_dt_bias": per_layer("dt_bias", False),
         "gdn_norm": per_layer("norm.weight", False), "gdn_out": per_layer("out_proj.weight")}
    return {k: r.dense(np.ascontiguousarray(v, np.float32)) for k, v in a.items()}


def kda_arrays(c, r, pre: list[str]) -> dict:
    """The KDA layers' arrays (engines.weights' kda_*), from the original checkpoints' names (q/k/v_conv1d, f_a_proj,
    dt_bias and A_log under self_attn) or transformers' (one conv1d, the forget gate's own module)."""
    if not pre:
        return {}

    def get(p: str, *names: str, transpose: bool = False) -> np.ndarray:
        name = next((n for n in names if r.has(p + "self_attn." + n)), names[0])
        return np.asarray(r.get(p + "self_attn." + name, transpose), np.float32)

    def conv(p: str) -> np.ndarray:  # [3*H*d, taps]: q's channels, then k's, then v's
        if r.has(p + "self_attn.conv1d.weight"):
            return get(p, "conv1d.weight")[:, 0]
        return np.concatenate([get(p, f"{x}_conv1d.weight")[:, 0] for x in "qkv"])

    a = {"kda_q": [get(p, "q_proj.weight", transpose=True) for p in pre],
         "kda_k": [get(p, "k_proj.weight", transpose=True) for p in pre],
         "kda_v": [get(p, "v_proj.weight", transpose=True) for p in pre],
         "kda_conv": [conv(p) for p in pre],
         "kda_fa": [get(p, "f_a_proj.weight", "forget_gate.f_a_proj.weight", transpose=True) for p in pre],
         "kda_fb": [get(p, "f_b_proj.weight", "forget_gate.f_b_proj.weight", transpose=True) for p in pre],
         "kda_dt_bias": [get(p, "dt_bias", "forget_gate.dt_bias").reshape(-1) for p in pre],
         "kda_A_log": [get(p, "A_log", "forget_gate.A_log").reshape(-1) for p in pre],
         "kda_b": [get(p, "b_proj.weight", transpose=True) for p in pre],
         "kda_ga": [get(p, "g_a_proj.weight", transpose=True) for p in pre],
         "kda_gb": [get(p, "g_b_proj.weight", transpose=True) for p in pre],
         "kda_norm": [get(p, "o_norm.weight") for p in pre],
         "kda_out": [get(p, "o_proj.weight", transpose=True) for p in pre]}
    return {k: r.dense(np.ascontiguousarray(np.stack(v), np.float32)) for k, v in a.items()}


def mla_arrays(c, r, pre: list[str]) -> dict:
    """The MLA layers' arrays (engines.weights' mla_*)."""
    if not pre:
        return {}
    a = {"mla_kva": r.stack([p + "self_attn.kv_a_proj_with_mqa.weight" for p in pre], True),
         "mla_kv_norm": r.stack([p + "self_attn.kv_a_layernorm.weight" for p in pre]),
         "mla_kvb": r.stack([p + "self_attn.kv_b_proj.weight" for p in pre], True),
         "mla_o": r.stack([p + "self_attn.o_proj.weight" for p in pre], True)}
    if c.mla_q_rank:
        a.update(mla_qa=r.stack([p + "self_attn.q_a_proj.weight" for p in pre], True),
                 mla_q_norm=r.stack([p + "self_attn.q_a_layernorm.weight" for p in pre]),
                 mla_qb=r.stack([p + "self_attn.q_b_proj.weight" for p in pre], True))
    else:
        a["mla_q"] = r.stack([p + "self_attn.q_proj.weight" for p in pre], True)
    return a
