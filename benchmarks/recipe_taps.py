"""Where does the engine leave its own declared bf16 recipe? At a flagged position and its neighbours, the residual
stream after each layer of the megakernel, the reference in the engine's declared recipe and the float32 reference
(Engine.step_taps: the engine's kernel steps over the generated tokens, as forced_topk runs them), and the KL of
each one's logits from the float32 reference there.

A faithful engine equal to its recipe to a few ulps of float32 at every layer, and leaving it by one bf16 rounding
at one layer of one token, is rounding on a knife-edge (the same sums landing either side of a bf16 boundary); an
engine off its recipe at every token is a recipe mismatch or a bug. A benchmark: prints figures, writes JSON,
asserts nothing.

    .venv/bin/python -m benchmarks.recipe_taps --model mini-kimi --prompt gen-0874-chat --positions 8,9,10,11 \\
        --out benchmarks/results/recipe-taps-mini-kimi.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def measure(model, pid: str, positions: list[int], n: int, seed: int) -> dict:
    from benchmarks.detection import prompt_order
    from engines.errors import ModelError
    from engines.megakernel import MegakernelEngine
    from evalsuite.compare import metrics
    from evalsuite.plugins import judge

    c = model.config
    prompt = dict(prompt_order(model.tokenizer, 1000, seed, c.max_context, n)).get(pid)
    if prompt is None:
        raise ModelError(f"no prompt {pid!r} in the detection benchmark's order (seed {seed}) that fits {model.name}")
    if max(positions) >= n or min(positions) < 1:
        raise ModelError(f"--positions: from 1 to {n - 1} (--max-new-tokens {n})")
    ref = judge(model)
    eng = MegakernelEngine(model.weights, "bfloat16")
    recipe = judge(model, "bfloat16", recipe=eng.recipe)
    tokens = list(ref.generate([prompt], n, top_k=5, want_logits=True)[0].token_ids)
    logits = {who: np.asarray(e.forced_topk([prompt], [tokens], 5, want_logits=True)[0].logits, np.float64)
              for who, e in (("float32", ref), ("engine", eng), ("recipe", recipe))}
    rows = []
    for j in positions:  # position j's logits come from the step that feeds generated token j - 1
        pr = [list(prompt) + tokens[:j - 1]]
        taps = {who: e.step_taps(pr, [tokens[j - 1]], decoded=j - 1)[0] for who, e in
                (("float32", ref), ("engine", eng), ("recipe", recipe))}
        rows.append({"position": j, "engine_vs_recipe": _rel(taps, "engine"),
                     "recipe_vs_float32": _rel(taps, "float32"),
                     "kl_from_float32": {who: float(metrics.kl(logits["float32"][j:j + 1], logits[who][j:j + 1])[0])
                                         for who in ("engine", "recipe")}})
    return {"prompt": pid, "layers": [c.kind(i) for i in range(c.n_layers)], "recipe": str(eng.recipe), "rows": rows}


def _rel(taps: dict, who: str) -> list[float]:
    """Per layer: max |Δ| between the recipe's residual stream and who's, over the recipe's max |x|."""
    d = np.abs(taps[who] - taps["recipe"]).max(-1) / np.abs(taps["recipe"]).max(-1)
    return [float(x) for x in d]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the megakernel's residual stream against its own bf16 recipe, by layer")
    ap.add_argument("--model", default="mini-kimi")
    ap.add_argument("--prompt", default="gen-0874-chat", help="an id of benchmarks.detection's prompt order")
    ap.add_argument("--positions", default="8,9,10,11", help="comma-separated positions of the generation")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0, help="the prompts' order (benchmarks.detection's)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.out and not Path(a.out).parent.is_dir():
        print(f"error: --out {a.out}: no directory {Path(a.out).parent}", file=sys.stderr)
        return 2
    try:
        positions = [int(x) for x in a.positions.split(",")]
    except ValueError:
        print(f"error: --positions {a.positions!r}: comma-separated integers", file=sys.stderr)
        return 2
    from engines.errors import ModelError
    from evalsuite.models import load_model
    from evalsuite.versions import versions

    t0 = time.time()
    try:
        model = load_model(a.model)
        m = measure(model, a.prompt, positions, a.max_new_tokens, a.seed)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{a.model} {a.prompt}, layers {' '.join(m['layers'])}; max |Δ| / max |recipe| of the residual stream after "
          "each layer")
    for r in m["rows"]:
        print(f"position {r['position']}: engine vs recipe " + " ".join(f"{x:.1e}" for x in r["engine_vs_recipe"])
              + " | recipe vs float32 " + " ".join(f"{x:.1e}" for x in r["recipe_vs_float32"])
              + f" | KL from float32: engine {r['kl_from_float32']['engine']:.4f}, recipe "
              f"{r['kl_from_float32']['recipe']:.4f}")
    if a.out:
        doc = {"benchmark": "recipe_taps", "model": a.model, "max_new_tokens": a.max_new_tokens, "order_seed": a.seed,
               "weights_sha256": model.weights.sha256, **m, "seconds": round(time.time() - t0, 1),
               "versions": versions()}
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
