"""The megakernel's VMEM budget per model, dtype and TPU generation (engines/megakernel/budget.py), as a command:

    .venv/bin/python -m benchmarks.vmem --model smollm2-135m --model k3-sized [--chip v7] [--dtype bfloat16] [--json]

What one decode step declares, the live values' estimate, the limit passed to Mosaic, and whether it fits (exit 0
whether or not it does: the engine is what refuses). Models: registered names, or a paper configuration below.
"""

from __future__ import annotations

import argparse
import json
import sys

from engines.config import Config
from engines.errors import ModelError
from engines.megakernel.budget import budget, mib
from engines.megakernel.spec import KernelSpec
from engines.megakernel.tpu import CHIPS

# Paper configurations: shapes only, no weights here. k3-sized: Kimi K3's widths (ARCHITECTURES.md section 1: hidden
# 7168, 93 layers, 96 heads, vocab 163840, layer 0 dense 33792 wide, 896 experts top-16 of width 3072, a shared width
# of 6144) in the layer kinds this kernel runs: GQA attention with 8 KV heads of 128 in every layer where K3 has MLA
# and KDA, and experts on the full hidden width where K3 projects into a 3584-wide latent. A stand-in for sizing.
PAPER_CONFIGS = {
    "k3-sized": Config(
        name="k3-sized", family="moe", vocab_size=163840, hidden=7168, n_layers=93, n_heads=96, n_kv_heads=8,
        head_dim=128, ffn=33792, rope_theta=50000.0, rms_eps=1e-5, max_context=131072, tie_embeddings=False,
        rope_style="half", n_experts=896, top_k=16, moe_ffn=3072, n_shared_experts=2, first_dense=1,
        router="sigmoid", norm_topk=True, routed_scale=1.0),
    # Kimi K3 in its own layer kinds (ARCHITECTURES.md section 1): MLA at i % 4 == 3 and the last layer, KDA
    # elsewhere (head dim 128; the KDA head count is not given there: 96, the config's heads, is assumed), layer 0
    # dense, a latent MoE of 896 experts top-16 (latent 3584, width 3072; the shared 6144: two of 3072), situ,
    # attention residuals over blocks of 12, MLA with a 1536 q rank, 512 kv rank, 128 + 64 key, 128 value, gated
    "kimi-k3": Config(
        name="kimi-k3", family="moe", vocab_size=163840, hidden=7168, n_layers=93, n_heads=96, n_kv_heads=96,
        head_dim=128, ffn=33792, rope_theta=50000.0, rms_eps=1e-5, max_context=131072, tie_embeddings=False,
        n_experts=896, top_k=16, moe_ffn=3072, n_shared_experts=2, first_dense=1,
        router="sigmoid", norm_topk=True, routed_scale=1.0, mlp_act="situ", expert_act="situ", moe_latent=3584,
        attn_res_block=12, layer_kinds=tuple("mla" if i % 4 == 3 or i == 92 else "kda" for i in range(93)),
        kda_heads=96, kda_dim=128, kda_conv=4, kda_gate_rank=128, kda_out_rank=0, kda_gate_bound=5.0,
        mla_q_rank=1536, mla_kv_rank=512, mla_nope_dim=128, mla_rope_dim=64, mla_v_dim=128, mla_out_gate=True),
    # Qwen3.8-27B (ARCHITECTURES.md section 2): 64 layers, full attention at i % 4 == 3 (24 heads, 4 KV heads of 256,
    # 64 rotary dims, an output gate), Gated DeltaNet elsewhere (16 key heads and 48 value heads of 128, 4 taps),
    # SwiGLU 17408, 1 + w norms
    "qwen3.8-27b": Config(
        name="qwen3.8-27b", family="dense", vocab_size=248320, hidden=5120, n_layers=64, n_heads=24, n_kv_heads=4,
        head_dim=256, ffn=17408, rope_theta=1e7, rms_eps=1e-6, max_context=262144, tie_embeddings=False,
        rope_style="half", norm_style="gemma", attn_out_gate=True, rotary_dim=64, qk_norm=True,
        layer_kinds=tuple("full" if i % 4 == 3 else "gdn" for i in range(64)), gdn_k_heads=16, gdn_v_heads=48,
        gdn_k_dim=128, gdn_v_dim=128, gdn_conv=4),
}


def config_of(name: str) -> Config:
    """A paper configuration's Config, or a registered model's (loading it)."""
    if name in PAPER_CONFIGS:
        return PAPER_CONFIGS[name]
    from evalsuite.models import load_model

    return load_model(name).config


def model_budgets(models, chips, dtypes, batch: int, tile: int) -> list[dict]:
    """Every model x dtype x chip: {model, dtype, batch, tile, budget}."""
    for c in chips:
        if c not in CHIPS:
            raise ModelError(f"--chip {c!r}: expected one of {', '.join(CHIPS)}")
    rows = []
    for name in models:
        spec = KernelSpec(config_of(name), batch, tile, tile)
        for dtype in dtypes or ("float32", "bfloat16"):
            for chip_name in chips or tuple(CHIPS):
                rows.append({"model": name, "dtype": dtype, "batch": batch, "tile": tile,
                             "budget": budget(spec, dtype, chip_name).to_dict()})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.vmem", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="repeatable (default: smollm2-135m)")
    ap.add_argument("--chip", action="append", default=[], help=f"repeatable, one of {', '.join(CHIPS)} (default: all)")
    ap.add_argument("--dtype", action="append", default=[], choices=("float32", "bfloat16"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tile", type=int, default=128, help="cache positions per attention tile")
    ap.add_argument("--json", action="store_true", help="print one JSON list")
    a = ap.parse_args(argv)
    try:
        rows = model_budgets(a.model or ["smollm2-135m"], a.chip, a.dtype, a.batch, a.tile)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        b = r["budget"]
        groups = ", ".join(f"{g} {mib(n)}" for g, n in b["by_group"].items())
        verdict = "fits" if b["fits"] else "DOES NOT FIT"
        print(f"{r['model']:<20} {r['dtype']:<9} TPU {b['chip']:<4} limit {mib(b['limit_bytes']):>10} of "
              f"{mib(b['capacity_bytes']):>10}  {verdict:<12} ({groups})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
