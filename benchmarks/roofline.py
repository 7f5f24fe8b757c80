"""A roofline of the megakernel's decode step, from its static spec: bytes moved and FLOPs per step against the
ideal (every weight once, the chosen experts once, and only the KV actually attended), and the step time that
traffic implies on a TPU. A paper model: nothing here ran on a TPU. Prints figures, asserts nothing.

    .venv/bin/python -m benchmarks.roofline --results benchmarks/results/roofline.json

The kernel's bytes follow its DMA schedule (engines/megakernel/kernel.py): each layer's streamed weights once, each
distinct chosen expert once, the KV cache in whole tiles up to the highest row's position for every row and the
last attended tile in pieces of PIECE positions (a tile no row attends is skipped), one new K/V slot a row written,
and the embedding rows and LM head in XLA.
Expert choice is taken as uniform and independent per row (the expected number of distinct experts of B rows'
top-k), the routing a balanced router aims at.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from benchmarks.vmem import PAPER_CONFIGS, config_of, model_budgets
from engines.config import Config
from engines.loop import cache_slots
from engines.megakernel.attention import PIECE
from engines.megakernel.engine import ATTN_TILE
from engines.megakernel.spec import expert_keys, hbm_dtype, moe_keys
from engines.megakernel.tpu import chip
from engines.weights import expected_shapes
from evalsuite.models import load_model
from evalsuite.versions import versions

# The seed's published per-chip figures (the issue, from Google's TPU v7 "Ironwood" specification: 7,380 GB/s
# of HBM bandwidth a chip) and Inferact's reported Kimi K3 decode on 16 TPU v7 at batch 1 without speculation.
V7_HBM_BYTES_PER_S_CHIP = 7.38e12
K3_CHIPS = 16
K3_REPORTED_TOKENS_PER_S = 249.0
# MXFP4 (the format K3's experts ship in): 4-bit values and one 8-bit scale per 32, i.e. 4.25 bits a weight.
MXFP4_BYTES_PER_WEIGHT = 4.25 / 8
DEFAULT_MODELS = ("mini-llama", "mini-moe", "smollm2-135m", "k3-sized")


def _bytes(shape: tuple[int, ...], key: str, dtype: str) -> int:
    return math.prod(shape) * (2 if hbm_dtype(key, dtype, len(shape)) == "bfloat16" else 4)


def expected_distinct(n_experts: int, top_k: int, rows: int) -> float:
    """Expected distinct experts among `rows` rows' top-k under uniform routing."""
    return n_experts * (1 - (1 - top_k / n_experts) ** rows) if n_experts else 0.0


def kv_positions(c: Config, context: int, tile: int) -> tuple[int, int]:
    """Cache positions a row at position `context` reads over all layers in the kernel (whole tiles from the first
    any row attends, a sliding layer's window start's, the last attended one in PIECE-position pieces, up to the
    highest row's position) and attends (the ideal: a sliding layer its window, the new token included)."""
    read = attended = 0
    piece = min(PIECE, tile)
    for i in range(c.n_layers):
        first = max(context - c.sliding_window + 1, 0) if c.kind(i) == "sliding" else 0
        whole = context // tile  # the tiles attended to their end (first <= context: first // tile <= whole)
        read += (whole - first // tile) * tile + -(-(context - whole * tile) // piece) * piece
        attended += context + 1 - first
    return read, attended


def step(c: Config, batch: int, context: int, dtype: str, expert_bytes_per_weight: float | None = None) -> dict:
    """One decode step at `batch` rows that each attend `context` earlier positions: the kernel's bytes, the ideal's,
    and FLOPs. expert_bytes_per_weight overrides the routed experts' storage (MXFP4's 4.25 bits: a paper variant)."""
    shapes = expected_shapes(c)
    L, Ld, Lm, K, hd, H = c.n_layers, c.n_dense_layers, c.n_moe_layers, c.n_kv_heads, c.head_dim, c.n_heads
    wsize = 2 if dtype == "bfloat16" else 4
    per_layer = {k: _bytes(shapes[k][1:], k, dtype) for k in shapes if k not in ("embed", "lm_head", "final_norm")}
    attn = sum(per_layer[k] for k in ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "q_norm", "k_norm")
               if k in per_layer)
    dense = sum(per_layer[k] for k in ("gate", "up", "down") if k in per_layer and Ld)
    moe = sum(per_layer[k] for k in moe_keys(c))
    one_expert = sum(per_layer[k] // c.n_experts for k in expert_keys(c))
    if expert_bytes_per_weight is not None and one_expert:
        one_expert = int(one_expert / wsize * expert_bytes_per_weight)
    used = expected_distinct(c.n_experts, c.top_k, batch) if Lm else 0.0
    weights = L * attn + Ld * dense + Lm * (moe + used * one_expert)
    head = c.vocab_size * c.hidden * wsize + batch * c.hidden * wsize  # LM head once, the embedding rows
    window = cache_slots(context + 1, c.max_context)
    tile = min(ATTN_TILE, window)
    read, attended = kv_positions(c, context, tile)
    kv_slot = 2 * K * hd * 4  # K and V of one position, one layer, float32
    kernel = weights + head + batch * kv_slot * (read + L)  # the tiles read, the new slot written
    ideal = weights + head + batch * kv_slot * attended
    per_token = (L * attn + Ld * dense + Lm * (moe + c.top_k * one_expert)) / wsize  # weights a row multiplies
    flops = 2 * batch * (per_token + c.vocab_size * c.hidden) + 4 * batch * H * hd * attended
    return {"batch": batch, "context": context, "window": window, "positions_read": read // L, "dtype": dtype,
            "expert_bytes_per_weight": expert_bytes_per_weight, "expected_distinct_experts": round(used, 2),
            "weights_bytes": int(weights), "kernel_bytes": int(kernel), "ideal_bytes": int(ideal),
            "kernel_over_ideal": round(kernel / ideal, 4), "flops": int(flops),
            "flops_per_byte": round(flops / kernel, 3)}


def on_chip(s: dict, name: str, chips: int = 1) -> dict:
    """The step's time on `chips` chips of TPU `name` when bound by HBM bandwidth or by bf16 FLOPs, whichever is
    longer (the roofline; every byte spread evenly over the chips, no communication counted)."""
    ch = chip(name)
    bw = ch.hbm_bytes_per_s * ch.cores_per_chip * chips
    flops = ch.bf16_flops_per_s * ch.cores_per_chip * chips
    t = max(s["kernel_bytes"] / bw, s["flops"] / flops)
    return {"chip": name, "chips": chips, "step_s": t, "tokens_per_s": s["batch"] / t,
            "bound": "memory" if s["kernel_bytes"] / bw >= s["flops"] / flops else "compute"}


def k3_paper(c: Config) -> dict:
    """k3-sized on 16 TPU v7 at batch 1 and a 4,096-token context, beside Inferact's reported 249 tokens/s."""
    out = {}
    for label, bpw in (("bf16 experts (this kernel)", None), ("MXFP4 experts (the seed's format)",
                                                             MXFP4_BYTES_PER_WEIGHT)):
        s = step(c, 1, 4096, "bfloat16", bpw)
        t = s["kernel_bytes"] / (V7_HBM_BYTES_PER_S_CHIP * K3_CHIPS)
        out[label] = {"kernel_bytes": s["kernel_bytes"], "step_ms": round(t * 1e3, 3),
                      "tokens_per_s": round(1 / t, 1)}
    return {"chips": K3_CHIPS, "hbm_bytes_per_s_chip": V7_HBM_BYTES_PER_S_CHIP, "batch": 1, "context": 4096,
            "reported_tokens_per_s": K3_REPORTED_TOKENS_PER_S, "implied": out,
            "note": "a paper number: the stand-in's HBM traffic over 16 chips' bandwidth, no communication, no "
                    "compute, no step overhead; k3-sized has GQA where K3 has MLA and KDA"}


def _line(name: str, s: dict, chip_name: str) -> str:
    return (f"{name:<14} {s['dtype']:<9} batch {s['batch']:<2} context {s['context']:<5} "
            f"kernel {s['kernel_bytes'] / 1e6:10.1f} MB  ideal {s['ideal_bytes'] / 1e6:10.1f} MB  "
            f"ratio {s['kernel_over_ideal']:.3f}  {s['flops'] / 1e9:9.2f} GFLOP  "
            f"{s['on_chip']['step_s'] * 1e3:8.3f} ms on one TPU {chip_name} ({s['on_chip']['bound']})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--contexts", nargs="+", type=int, default=[200, 1100])
    ap.add_argument("--chip", default="v7")
    ap.add_argument("--results", default=None, help="write the figures as JSON here")
    a = ap.parse_args(argv)
    rows = []
    for name in a.models:
        c = config_of(name)
        for dtype in ("float32", "bfloat16"):
            for b in a.batches:
                for ctx in a.contexts:
                    s = {"model": name, **step(c, b, ctx, dtype)}
                    s["on_chip"] = on_chip(s, a.chip)
                    rows.append(s)
                    print(_line(name, s, a.chip))
    paper = k3_paper(config_of("k3-sized"))
    for label, v in paper["implied"].items():
        print(f"k3-sized on {K3_CHIPS} TPU v7, batch 1: {label}: {v['kernel_bytes'] / 1e9:.1f} GB a step, "
              f"{v['step_ms']} ms, {v['tokens_per_s']} tokens/s (paper; Inferact reported {K3_REPORTED_TOKENS_PER_S})")
    vmem = model_budgets(a.models, (), (), 8, ATTN_TILE)
    for r in vmem:
        r["budget"].pop("items")
    doc = {"benchmark": "roofline", "command": " ".join(["python -m benchmarks.roofline", *(argv or sys.argv[1:])]),
           "chip": a.chip, "rows": rows, "k3_paper": paper, "vmem_batch8": vmem,
           "versions": versions(),
           "configs": {n: config_of(n).to_dict() for n in a.models}, "weights_sha256": {
               n: load_model(n).weights.sha256 for n in a.models if n not in PAPER_CONFIGS}}
    if a.results:
        Path(a.results).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {a.results}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
