"""The oracle rung of the ladder: tiny seeded checkpoints of each HF architecture the reference supports,
and transformers' own greedy decode of them.

Runs in the side environment (bash benchmarks/install_hf.sh; torch never enters .venv):

    .venv-hf/bin/python benchmarks/hf_oracle.py            # every architecture
    .venv-hf/bin/python benchmarks/hf_oracle.py --only mini-gemma3

For each architecture it writes
  engines/minis/<name>/config.json + model.safetensors   the checkpoint (float32; gpt-oss experts in MXFP4,
                                                          as the real checkpoints ship them)
  tests/engines/oracle/<name>.json                        transformers' greedy tokens and top-5 logprobs
The tests (tests/engines/test_oracle.py, no torch) load each checkpoint with evalsuite's own loader and
must reproduce the oracle. The mini models in `evalsuite models` (mini-qwen2, mini-gemma2, mini-gemma3,
mini-gptoss, mini-qwen-hybrid) are these checkpoints. For the architectures in FLOAT64_RUNG the oracle also holds
a float64 run (float64_rung), which the reference's float64 logits must match.

Weights are drawn with torch.Generator(seed) in sorted parameter order, scaled so that greedy decoding
has clear margins (transformers' own init, std 0.02, gives near-uniform logits whose argmax is decided
by rounding); the smallest top-1/top-2 logprob gap of each run is recorded in the oracle.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
SEED = 20261201
N_NEW = 16
# Prompt lengths: short, past every sliding window (8), and past gpt-oss's YaRN original context (64).
PROMPT_LENGTHS = (5, 13, 23, 41, 70)
VOCAB = 320  # the byte tokenizer's vocabulary (engines.tokenizer.byte_tokenizer): the minis are usable as text models

COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def configs() -> dict:
    t = transformers
    slide4 = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    return {
        "mini-qwen2": t.Qwen2Config(**COMMON, intermediate_size=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        "mini-gemma2": t.Gemma2Config(**COMMON, intermediate_size=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                      hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                                      sliding_window=8, layer_types=slide4, attn_logit_softcapping=50.0,
                                      final_logit_softcapping=30.0,
                                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        "mini-gemma3": t.Gemma3TextConfig(
            **COMMON, intermediate_size=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
            hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24, sliding_window=8,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
        "mini-gptoss": t.GptOssConfig(
            **{**COMMON, "max_position_embeddings": 256}, intermediate_size=64, num_local_experts=8,
            num_experts_per_tok=2, rms_norm_eps=1e-5,
            tie_word_embeddings=False, sliding_window=8, layer_types=slide4, attention_bias=True,
            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "original_max_position_embeddings": 64, "truncate": False}),
        # Qwen3-Next's hybrid as Qwen3.8 stacks it (LLLF: a gated full-attention layer after three Gated DeltaNet
        # layers), a quarter of each head rotated (Qwen3.8: 64 of 256), dense MLPs (Qwen3.8 is dense; Qwen3-Next's
        # sparse MoE is not implemented). Two key heads serve four value heads, as Qwen3.8's 16 serve 48.
        "mini-qwen-hybrid": t.Qwen3NextConfig(
            **{**COMMON, "head_dim": 32}, intermediate_size=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
            layer_types=["linear_attention"] * 3 + ["full_attention"], num_experts=0,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_conv_kernel_dim=4, partial_rotary_factor=0.25,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
        # the same hybrid with one near-dead key head (LOW_NORM): its weights are mini-qwen-hybrid's but for that head
        "mini-qwen-lownorm": t.Qwen3NextConfig(
            **{**COMMON, "head_dim": 32}, intermediate_size=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
            layer_types=["linear_attention"] * 3 + ["full_attention"], num_experts=0,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_conv_kernel_dim=4, partial_rotary_factor=0.25,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
        # Qwen3-Next itself: the same hybrid with its sparse MoE (softmax router, top-k renormalised, a shared expert
        # behind a sigmoid gate) after one dense layer (mlp_only_layers), as the 80B checkpoints have it on every layer.
        "mini-qwen-next-moe": t.Qwen3NextConfig(
            **{**COMMON, "head_dim": 32}, intermediate_size=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
            layer_types=["linear_attention"] * 3 + ["full_attention"], num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=64, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[0], linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_conv_kernel_dim=4, partial_rotary_factor=0.25,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
        # Kimi's layer stack as transformers has it (Kimi Linear): Kimi Delta Attention layers and a multi-head latent
        # attention layer (NoPE: k_pe shared and never rotated) at i % 4 == 3 as Kimi K3 places them, layer 0 with a
        # dense MLP and the rest DeepSeek-style MoE (sigmoid router whose bias selects only, a shared expert).
        "mini-kimi-linear": t.KimiLinearConfig(
            **{k: v for k, v in COMMON.items() if k not in ("head_dim", "num_key_value_heads")}, num_key_value_heads=4,
            intermediate_size=128, rms_norm_eps=1e-5,
            tie_word_embeddings=False, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=16, layer_types=["linear_attention"] * 3 + ["full_attention"],
            mlp_layer_types=["dense"] + ["sparse"] * 3, num_local_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=32, n_shared_experts=1, routed_scaling_factor=2.446, norm_topk_prob=True,
            linear_attn_config={"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4}),
        # DeepSeek-V3's multi-head latent attention on every layer (low-rank q, the rotated shared k_pe, interleaved
        # rope pairs) with its MoE after one dense layer: the MLA form the Kimi mini's NoPE one is set beside.
        "mini-deepseek-mla": t.DeepseekV3Config(
            **{k: v for k, v in COMMON.items() if k not in ("head_dim", "num_key_value_heads")}, num_key_value_heads=4,
            intermediate_size=128, rms_norm_eps=1e-6, tie_word_embeddings=False, q_lora_rank=24, kv_lora_rank=32,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
            routed_scaling_factor=2.5, norm_topk_prob=True, rope_interleave=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        # not a registry mini: the llama3-style RoPE scaling (Llama 3.1), on the plain Llama layer. With head_dim 16,
        # theta 10,000 and original 64, two of the 8 frequencies fall in the smoothed middle band (wavelengths
        # 19.9 and 62.8 between 64/4 and 64/1), one is kept and five are divided by the factor.
        "tiny-llama31-rope": t.LlamaConfig(
            **COMMON, intermediate_size=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
            rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    }


# Key head 0's q and k projections in every Gated DeltaNet layer scaled by this: their norms after the conv and SiLU
# fall from about 2.4 (median over 400 random tokens, layer 0) to 6e-3 (1st percentile 3e-3), a few times
# sqrt(L2 eps) = 1e-3, as a trained model's near-dead head may have them. There the epsilon inside the L2 norm's root
# shrinks q and k by about 1% and the fault that moves it outside (l2_eps_outside) shows; at norms of 2 it moves them
# by 5e-7, under float32 noise.
LOW_NORM = {"mini-qwen-lownorm": 3e-3}


def quiet_head(model: torch.nn.Module, scale: float) -> None:
    """Scale key head 0's q and k rows of each GDN layer's fused in_proj_qkvz (grouped per key head: [q | k | v |
    z] of head 0 first)."""
    dk = model.config.linear_key_head_dim
    with torch.no_grad():
        for layer, kind in zip(model.model.layers, model.config.layer_types):
            if kind == "linear_attention":
                layer.linear_attn.in_proj_qkvz.weight[:2 * dk] *= scale


def init_weights(model: torch.nn.Module, gemma_norms: bool, seed: int) -> None:
    """Seeded weights with decisive logits (see the module docstring). gemma_norms: the norms store offsets from 1
    (Gemma; Qwen3-Next too, but for its GDN output norm)."""
    g = torch.Generator().manual_seed(seed)
    D = model.config.hidden_size
    qwen_next = model.config.model_type == "qwen3_next"
    kimi = model.config.model_type in ("kimi_linear", "deepseek_v3")  # fused experts [E, 2F, D], router [E, D]
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("linear_attn.norm.weight"):  # Qwen3-Next's gated output norm: a plain weight
                v = 1.0 + 0.1 * r
            elif name.endswith("A_log"):  # decays exp(-A softplus(.)) spread over (0, 1), A in (1, 16)
                v = torch.log(1.0 + 15.0 * torch.rand(p.shape, generator=g))
            elif name.endswith("dt_bias"):
                v = 1.0 + 0.1 * r
            elif name.endswith("conv1d.weight"):  # [C, 1, taps]: fan-in is the taps
                v = r / math.sqrt(p.shape[-1])
            elif name.endswith("norm.weight") or "layernorm" in name:
                v = 0.1 * r if gemma_norms else 1.0 + 0.1 * r
            elif name.endswith("sinks"):
                v = r
            elif "bias" in name:
                v = 0.1 * r
            elif "embed_tokens" in name:
                v = r / math.sqrt(D) if gemma_norms and not qwen_next else r  # Gemma multiplies embeddings by sqrt(D)
            elif name.startswith("lm_head"):
                v = 4.0 * r / math.sqrt(D)
            elif "router" in name or ((kimi or qwen_next) and name.endswith("mlp.gate.weight")):
                v = 4.0 * r / math.sqrt(D)
            elif (kimi or qwen_next) and "experts." in name and "shared" not in name:  # [E, 2F, D] gate_up,
                # [E, D, F] down: fan-in is the last axis
                v = (0.5 if "down_proj" in name else 1.0) * r / math.sqrt(p.shape[-1])
            elif "experts.gate_up_proj" in name:  # [E, D, 2F]; 4x: some gate and up values pass swiglu_limit (7)
                v = 4.0 * r / math.sqrt(p.shape[1])
            elif "experts.down_proj" in name:  # [E, F, D]
                v = 0.5 * r / math.sqrt(p.shape[1])
            else:  # nn.Linear [out, in]
                v = (0.5 if ("o_proj" in name or "down_proj" in name) else 1.0) * r / math.sqrt(p.shape[1])
            p.copy_(v)
        for name, b in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):  # selects experts only: large enough to change some choices
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
        if model.config.tie_word_embeddings:
            model.tie_weights()


FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [E, out, in] -> (blocks uint8 [E, out, in/32, 16], scales uint8 [E, out, in/32]): each block of 32
    inputs shares a power-of-two scale (E8M0, bias 127) with its largest value at most 6; values round to
    the nearest FP4 (E2M1) number, two per byte, the first in the low nibble (OCP MX format)."""
    E, O, In = w.shape
    b = w.reshape(E, O, In // 32, 32)
    amax = b.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    exp = torch.ceil(torch.log2(amax / 6.0))
    scaled = b / torch.exp2(exp)
    idx = (scaled[..., None] - FP4).abs().argmin(-1).to(torch.uint8)  # nearest code (ties: the first)
    blocks = idx[..., 0::2] | (idx[..., 1::2] << 4)
    return blocks, (exp[..., 0] + 127).to(torch.uint8)


def mxfp4_experts(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Quantise every expert matrix to MXFP4, put transformers' own dequantisation of it back into the model
    (so the oracle runs on exactly what the checkpoint holds), and return the packed tensors to save."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    packed = {}
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            ex = layer.mlp.experts
            for attr in ("gate_up_proj", "down_proj"):
                w = getattr(ex, attr)  # [E, in, out]
                blocks, scales = mxfp4_quantize(w.transpose(1, 2).contiguous())
                getattr(ex, attr).copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
                key = f"model.layers.{i}.mlp.experts.{attr}"
                packed[key + "_blocks"], packed[key + "_scales"] = blocks, scales
    return packed


def greedy(model, prompt: list[int]) -> dict:
    """Greedy decode N_NEW tokens, each step a full forward over the whole sequence (no cache: the plainest
    path through transformers' code). Records each step's top-5 ids and log-probabilities."""
    seq, steps = list(prompt), []
    with torch.no_grad():
        for _ in range(N_NEW):
            logits = model(torch.tensor([seq])).logits[0, -1].double()
            logp = torch.log_softmax(logits, -1)
            top = torch.topk(logp, 5)
            steps.append({"top_ids": top.indices.tolist(), "top_logprobs": top.values.tolist(),
                          "gap": float(top.values[0] - top.values[1])})
            seq.append(int(top.indices[0]))
    return {"prompt": prompt, "tokens": seq[len(prompt):], "steps": steps}


# The architectures whose oracle also runs in float64: in float32 the chunked delta rule transformers runs for
# Qwen3-Next is itself 1.6e-4 (max |dlogprob|) from its own float64 run, more than ORACLE_TOL, so float32 alone
# cannot tell a reference error of that size; in float64 the two implementations can be compared closely.
FLOAT64_RUNG = ("mini-qwen-hybrid", "mini-qwen-lownorm", "mini-qwen-next-moe", "mini-kimi-linear", "mini-deepseek-mla")


@contextmanager
def float64_everywhere():
    """transformers computes norms, gates, routers and the softmax in float32 whatever the model's dtype
    (`.float()`, `.to(torch.float32)`, `.type(torch.float32)`, softmax(dtype=torch.float32)); inside this block each
    of those gives float64 instead, so a .double() model runs in float64 throughout (buffers computed at
    construction, as RoPE's inverse frequencies, keep their float32 values)."""
    to, flt, softmax, typ = torch.Tensor.to, torch.Tensor.float, torch.nn.functional.softmax, torch.Tensor.type

    def to64(self, *args, **kw):
        args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        if kw.get("dtype") is torch.float32:
            kw["dtype"] = torch.float64
        return to(self, *args, **kw)

    def softmax64(x, *args, **kw):
        if kw.get("dtype") is torch.float32:
            kw["dtype"] = torch.float64
        return softmax(x, *args, **kw)

    def float64(self, *args, **kw):
        return self.double()

    def type64(self, dtype=None, *args, **kw):
        return typ(self, torch.float64 if dtype is torch.float32 else dtype, *args, **kw)

    torch.Tensor.to, torch.Tensor.float, torch.Tensor.type = to64, float64, type64
    torch.nn.functional.softmax = softmax64
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.float, torch.nn.functional.softmax, torch.Tensor.type = to, flt, softmax, typ


def float64_rung(model, runs: list[dict]) -> dict:
    """Each run's float32 greedy sequence teacher-forced through a float64 copy of the model (float64_everywhere):
    the log-probabilities of each step's top-5 ids, and the float32 oracle's own distance from them."""
    m64 = copy.deepcopy(model).double()
    out, worst = [], 0.0
    with torch.no_grad(), float64_everywhere():
        for r in runs:
            n = len(r["prompt"])
            logp = torch.log_softmax(m64(torch.tensor([r["prompt"] + r["tokens"]])).logits[0], -1)
            steps = [logp[n - 1 + j][s["top_ids"]].tolist() for j, s in enumerate(r["steps"])]
            worst = max([worst] + [abs(a - b) for s, v in zip(r["steps"], steps) for a, b in zip(s["top_logprobs"], v)])
            out.append(steps)
    return {"how": "the float32 greedy tokens teacher-forced through model.double() with transformers' float32 casts "
                   "lifted (benchmarks/hf_oracle.py float64_everywhere); log-probabilities of each step's top-5 ids",
            "float32_oracle_error": worst, "top_logprobs": out}


def build(name: str, cfg) -> None:
    torch.manual_seed(SEED)
    cfg._attn_implementation = "eager"
    if name in FLOAT64_RUNG:
        cfg._experts_implementation = "eager"  # the per-expert loop: the grouped matmul has no float64
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    init_weights(model, gemma_norms=cfg.model_type.startswith("gemma") or cfg.model_type == "qwen3_next", seed=SEED)
    if name in LOW_NORM:
        quiet_head(model, LOW_NORM[name])
    out = ROOT / "engines" / "minis" / name
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    if cfg.model_type == "gpt_oss":
        packed = mxfp4_experts(model)
        tensors = {k: v.contiguous() for k, v in model.state_dict().items()
                   if not k.endswith(("experts.gate_up_proj", "experts.down_proj"))}
        tensors.update(packed)
    model.config.save_pretrained(out)
    if cfg.model_type == "gpt_oss":  # declare the MXFP4 experts as the real checkpoints do
        raw = json.loads((out / "config.json").read_text())
        keep = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
        raw["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": keep}
        (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    rng = np.random.default_rng(SEED)
    runs = [greedy(model, rng.integers(3, VOCAB, size=n).tolist()) for n in PROMPT_LENGTHS]
    oracle = {"name": name, "architecture": cfg.architectures[0] if cfg.architectures else type(model).__name__,
              "model_type": cfg.model_type, "seed": SEED, "n_new": N_NEW,
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
              "min_gap": min(s["gap"] for r in runs for s in r["steps"]), "runs": runs}
    if name in FLOAT64_RUNG:
        oracle["float64"] = float64_rung(model, runs)
    dest = ROOT / "tests" / "engines" / "oracle" / f"{name}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(oracle, indent=1) + "\n")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"{name}: {type(model).__name__}, {size / 1e6:.2f} MB, min top-1/top-2 gap {oracle['min_gap']:.2e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", help="build only this architecture (repeatable)")
    args = ap.parse_args()
    cfgs = configs()
    unknown = sorted(set(args.only or []) - set(cfgs))
    if unknown:
        print(f"error: unknown architecture {unknown[0]!r}; expected one of {', '.join(cfgs)}", file=sys.stderr)
        return 2
    torch.set_num_threads(2)
    for name, cfg in cfgs.items():
        if not args.only or name in args.only:
            build(name, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
