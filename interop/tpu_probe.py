"""On a TPU host: compile the megakernel with Mosaic for each MINI family and dtype, run a few greedy steps, and
set its tokens and top-1 logprobs beside the reference's on the same chip (docs/tpu.md). A quick census of what
Mosaic accepts, before `evalsuite diff --engine-option interpret=mosaic` judges a family in full.

  python -m interop.tpu_probe [--chip v5e] [--model NAME ...] [--out FILE]

Each (model, dtype) is one JSON line in --out, written as it finishes: ok (the step compiled and ran), tokens
equal, the first differing position, the largest |delta| of the top-1 logprob over the common prefix, compile and
step seconds, or the error's last lines. Exit 0 when every probe ran (equality is reported, not required: the
verdict is `evalsuite diff`'s), 1 when one did not (refused by Mosaic, an unknown model); 2 when jax here runs on no
TPU (unless --interpret names a CPU mode).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import numpy as np

FAMILIES = ("mini-llama", "mini-moe", "mini-qwen2", "mini-gemma2", "mini-gemma3", "mini-gptoss",
            "mini-qwen-hybrid", "mini-qwen-next-moe", "mini-kimi-linear", "mini-kimi")
PROMPTS = ("The quick brown fox", "def fib(n):\n    return", "Paris is the capital of",
           "1, 2, 3, 4, 5,")
SEED = 0  # the probe draws nothing at random; recorded so a result file states it


def probe(name: str, dtype: str, chip: str, interpret: str, max_new: int) -> dict:
    from engines.base import EngineOptions
    from engines.megakernel import MegakernelEngine
    from engines.reference import ReferenceEngine
    from evalsuite.models import load_model

    row = {"model": name, "dtype": dtype, "chip": chip, "interpret": interpret, "max_new_tokens": max_new}
    try:
        m = load_model(name)
        prompts = [m.tokenizer.encode(p) for p in PROMPTS]
        ref = ReferenceEngine.create(m, EngineOptions(dtype="float32"))
        want = ref.generate(prompts, max_new)
        t0 = time.perf_counter()
        eng = MegakernelEngine.create(m, EngineOptions(dtype=dtype, extra={"interpret": interpret, "chip": chip}))
        got = eng.generate(prompts, max_new)  # compiles every shape it meets
        row["first_call_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        eng.generate([p[:-1] for p in prompts], max_new)  # new prompts, the shapes compiled: the steady pace
        row["second_call_s"] = round(time.perf_counter() - t0, 2)
        row["ok"] = True
        first, worst = [], 0.0
        for w, g in zip(want, got):
            n = next((i for i, (a, b) in enumerate(zip(w.token_ids, g.token_ids)) if a != b),
                     min(len(w.token_ids), len(g.token_ids)))
            first.append(n if w.token_ids != g.token_ids else None)
            if n:
                worst = max(worst, float(np.max(np.abs(w.top_logprobs[:n, 0] - g.top_logprobs[:n, 0]))))
        row.update(tokens_equal=all(f is None for f in first), first_difference=first,
                   max_top1_logprob_delta=worst)
    except Exception as e:  # the census records every failure and goes on
        row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:2000]}",
                   traceback=traceback.format_exc()[-4000:])
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chip", default="v5e")
    ap.add_argument("--model", action="append", help="a MINI model (repeatable; default: every family)")
    ap.add_argument("--dtype", action="append", choices=("float32", "bfloat16"))
    ap.add_argument("--interpret", default="mosaic", choices=("mosaic", "tpu", "generic"))
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--out", default="runs/tpu-probe.jsonl")
    a = ap.parse_args(argv)
    import jax

    backend = jax.default_backend()
    if a.interpret == "mosaic" and backend != "tpu":
        print(f"error: jax here runs on {backend}; interpret=mosaic needs a TPU host", file=sys.stderr)
        return 2
    print(f"jax {jax.__version__} on {jax.devices()}", flush=True)
    ran = True
    with open(a.out, "w") as f:
        for name in a.model or FAMILIES:
            for dtype in a.dtype or ("float32", "bfloat16"):
                row = probe(name, dtype, a.chip, a.interpret, a.max_new_tokens)
                row.update(jax=jax.__version__, device=str(jax.devices()[0].device_kind), seed=SEED)
                f.write(json.dumps(row) + "\n")
                f.flush()
                brief = {k: row.get(k) for k in ("ok", "tokens_equal", "first_difference", "max_top1_logprob_delta",
                                                 "first_call_s", "second_call_s", "error")}
                print(name, dtype, json.dumps(brief), flush=True)
                ran = ran and row["ok"]
    return 0 if ran else 1


if __name__ == "__main__":
    sys.exit(main())
