"""The routing noise floor behind routing.py's ROUTING_TIE: prints figures, asserts nothing.

    .venv/bin/python -m benchmarks.calibrate_routing [--prompts 128] [--json OUT]

On the REFERENCE only (never an engine): for each MoE mini model, the float32 reference's greedy track of
32 tokens on prompts 65.. of benchmarks/detection.py's seeded order (disjoint from the 64 the detection
table judges), scored by the float32 reference and by its own bfloat16 recipe with taps. The rounding move
(routing.routing_move: per position the largest change over the MoE layers of the k-th to (k+1)-th router
choice gap, over the whole sequence up to the recipe's first expert flip) says how far bf16 rounding moves
the scores that pick the experts: a float32 margin (engines.reference.model.routing_margin, the smallest
such gap) below it can flip the expert set in a correct bf16 engine. Also: how many sequences have a flip,
the share of generated positions under ROUTING_TIE_FACTOR x the largest move, and the positions where the
recipe's own argmax token differs from the float32 one, with the float32 margin there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.detection import prompt_order
from engines.reference import ReferenceEngine
from evalsuite.compare import routing
from evalsuite.models import load_model
from evalsuite.versions import versions

N = 32


def measure(name: str, n_prompts: int) -> dict:
    m = load_model(name)
    prompts = [ids for _, ids in prompt_order(m.tokenizer, 64 + n_prompts, 0, m.config.max_context, N)[64:]]
    r32, r16 = ReferenceEngine(m.weights, "float32"), ReferenceEngine(m.weights, "bfloat16")
    d, m32_all, flips, flipped = [], [], [], 0
    for c in range(0, len(prompts), 16):
        chunk = prompts[c:c + 16]
        print(f"{name}: prompts {c + 1}-{c + len(chunk)}", flush=True)
        for p, g in zip(chunk, r32.generate(chunk, N, top_k=1)):
            seq = list(p) + list(g.token_ids[:-1])
            a, b = r32.score([seq], want_taps=True)[0], r16.score([seq], want_taps=True)[0]
            at = slice(len(p) - 1, len(seq))
            ma = a.routing_margins[at]
            mv = routing.routing_move(a.routing_layers, a.routing_experts, b.routing_layers, b.routing_experts)
            d.extend(mv.tolist())
            flipped += int(mv.size < len(seq))
            m32_all.extend(ma.tolist())
            moved = np.flatnonzero(a.logits[at].argmax(-1) != b.logits[at].argmax(-1))
            flips.extend(float(ma[j]) for j in moved)
    d, m32 = np.asarray(d), np.asarray(m32_all)
    return {"model": name, "weights_sha256": m.weights.sha256, "prompts": len(prompts), "positions": int(d.size),
            "max_dmargin": float(d.max()), "p999_dmargin": float(np.quantile(d, 0.999)),
            "median_margin_f32": float(np.median(m32)), "sequences_with_an_expert_flip": flipped,
            "tied_share": float(np.mean(m32 < routing.ROUTING_TIE_FACTOR * d.max())),
            "recipe_token_flips": len(flips), "f32_margin_at_recipe_flips": sorted(flips)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    out = {"max_new_tokens": N, "versions": versions(), "models": []}
    for name in ("mini-moe", "mini-gptoss"):
        r = measure(name, a.prompts)
        out["models"].append(r)
        print(f"{name}: {r['positions']} rounding-only positions; routing move bf16 recipe vs f32: max "
              f"{r['max_dmargin']:.3g}, p99.9 {r['p999_dmargin']:.3g}; {r['sequences_with_an_expert_flip']}/"
              f"{r['prompts']} sequences flip an expert; median f32 margin {r['median_margin_f32']:.3g}, "
              f"{r['tied_share']:.0%} of generated positions under the bound; recipe token flips "
              f"{r['recipe_token_flips']} at f32 margins {[round(x, 4) for x in r['f32_margin_at_recipe_flips']]}",
              flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
