"""On a TPU host: compile the megakernel's verify step (and its decode step) with Mosaic at several (batch, block)
shapes and print, for each, OK or the scoped VMEM Mosaic wanted against the limit the budget passed.
Usage: python -m interop.tpu_verify_probe [--model mini-llama] [--slack S] [--run]"""

from __future__ import annotations

import argparse
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mini-llama")
    ap.add_argument("--slack", type=float, default=None, help="override the budget's Mosaic slack")
    ap.add_argument("--shapes", default="8x1,8x2,2x4,4x4,8x4")
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--out", help="unused (the TPU scripts' common flag)")
    args = ap.parse_args()
    from engines.errors import ModelError
    from engines.megakernel import MegakernelEngine, recurrent
    from engines.megakernel import budget as budget_mod
    from engines.megakernel.spec import cache_shapes
    from evalsuite.models import load_model

    if args.slack is not None:
        budget_mod.MOSAIC_SLACK = args.slack
    m = load_model(args.model)
    try:
        eng = MegakernelEngine(m.weights, interpret="mosaic", chip="v5e")
    except ModelError as e:  # no TPU here: one line
        print(f"tpu_verify_probe: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    c = m.config
    for shape in args.shapes.split(","):
        B, T = (int(x) for x in shape.split("x"))
        spec = eng._programs._spec(B, args.window, False, args.window, "float32", T)
        b = budget_mod.budget(spec, "float32", "v5e")
        state = (*[jnp.zeros(s, jnp.float32) for s in cache_shapes(c, B, args.window)],
                 *[jnp.zeros(s, jnp.float32) for s in recurrent.state(c, B)])
        ids = jnp.ones((B, T), jnp.int32)
        pos = jnp.asarray(np.arange(T)[None, :] + 5 + np.arange(B)[:, None], jnp.int32)
        try:
            eng._verify.lower(eng.w, ids, pos, state, want_taps=False, window=args.window).compile()
            print(f"{args.model} B={B} T={T}: OK (declared {b.declared / 2**20:.2f}M, limit {b.limit / 2**20:.2f}M)",
                  flush=True)
        except Exception as e:  # noqa: BLE001 (a probe: print what Mosaic said)
            hit = re.search(r"Scoped allocation with size ([0-9.]+M) and limit ([0-9.]+M)", str(e))
            what = f"wants {hit.group(1)} against {hit.group(2)}" if hit else str(e).splitlines()[0][:300]
            print(f"{args.model} B={B} T={T}: FAILED, {what} (declared {b.declared / 2**20:.2f}M)", flush=True)
    jax.clear_caches()


if __name__ == "__main__":
    main()
