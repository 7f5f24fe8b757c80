"""The measurements behind evalsuite/compare/recipe_check.py's bounds (FACTOR, FLOOR, MAJORITY): per prompt, the
median element error of the residual stream at each layer, for the recipe in its other reduction orders (the
noise the bound is set from), the faithful megakernel, and the megakernel with each one-extra-rounding fault. A
benchmark: prints figures and writes JSON, asserts nothing.

    .venv/bin/python -m benchmarks.calibrate_recipe --out benchmarks/results/calibrate-recipe.json
    .venv/bin/python -m benchmarks.calibrate_recipe --model mini-llama --prompts quick --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from evalsuite.compare import recipe_check, witness
from evalsuite.models import load_model
from evalsuite.plugins import judge, make_engine
from evalsuite.prompts import load_prompts
from evalsuite.versions import versions

FAULTS = ("mm_bf16_out", "kv_bf16_slot", "bf16_residual", "pos_weights_dtype")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", default="builtin")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--shortest", type=int, default=0, help="tap only the N shortest prompts (0: the check's own pick)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    t0 = time.time()
    model = load_model(a.model)
    prompts = [(p.id, p.encode(model.tokenizer)) for p in load_prompts(a.prompts).prompts]
    prompts = [(i, ids) for i, ids in prompts if len(ids) + a.max_new_tokens <= model.config.max_context]
    if a.shortest:
        prompts = sorted(prompts, key=lambda p: len(p[1]))[:a.shortest]
    ref = judge(model)
    tracks = [g.token_ids for g in ref.generate([ids for _, ids in prompts], a.max_new_tokens, top_k=1)]
    rows, judges = {}, {}
    for fault in (None, *[f for f in a.faults.split(",") if f]):
        eng = make_engine("megakernel", model, "bfloat16", fault)
        if eng.recipe not in judges:  # the recipe and its other orders, once per declared recipe
            judges[eng.recipe] = (judge(model, "bfloat16", recipe=eng.recipe), witness.OrderSpread(
                lambda s, r=eng.recipe: judge(model, "bfloat16", order_seed=s, recipe=r), model.weights.nbytes))
        recipe, orders = judges[eng.recipe]
        rec = recipe_check.check(eng, model, prompts, tracks, recipe, orders, a.max_new_tokens,
                                 lambda s: print(s, flush=True))
        name = fault or "faithful"
        rows[name] = {k: rec.get(k) for k in ("ok", "prompts", "first_over", "share_over_per_layer",
                                                  "engine_per_prompt_layer0", "orders_per_prompt_layer0")}
        e = np.asarray(rec["engine_per_prompt_layer0"])
        o = np.asarray(rec["orders_per_prompt_layer0"])
        over = int((e > np.maximum(recipe_check.FACTOR * o, recipe_check.FLOOR)).sum())
        print(f"{name:18s} ok={rec['ok']!s:5s} layer 0: engine {e.min():.1e}-{e.max():.1e}, "
              f"orders {o.min():.1e}-{o.max():.1e}, prompts over {over}/{len(e)}", flush=True)
    out = {"model": a.model, "shortest": a.shortest,
           "prompt_tokens": {i: len(ids) for i, ids in prompts}, "weights_sha256": model.weights.sha256,
           "prompts": a.prompts,
           "max_new_tokens": a.max_new_tokens, "factor": recipe_check.FACTOR, "floor": recipe_check.FLOOR,
           "majority": recipe_check.MAJORITY, "tap_prompts": recipe_check.TAP_PROMPTS,
           "decoded_steps": recipe_check.TAP_DECODED, "order_seeds": list(witness.ORDER_SEEDS), "rows": rows,
           "seconds": round(time.time() - t0, 1), "versions": versions()}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out} ({out['seconds']} s)")


if __name__ == "__main__":
    main()
