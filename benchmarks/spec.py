"""Speculative decoding benchmark (prints figures, asserts nothing): the spec engine against plain greedy decoding
by the same target (the reference), in the same run, per drafter.

    .venv/bin/python -m benchmarks.spec [--model smollm2-135m] [--drafters ngram,layers:8] [--block 4]
        [--max-new-tokens 64] [--prompts builtin] [--no-diff] [--results benchmarks/results/spec.json]

Per drafter: the acceptance length (tokens committed per target step per row; plain decoding: 1), the acceptance
rate by draft position, target steps saved, whether every prompt's tokens equal plain decoding's, the wall time of a
warm generate against plain decoding's, and `evalsuite diff --engine spec`'s verdict with that drafter.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _timed_generate(make, prompts, n):
    """(generations, seconds) of the second of two generate calls, each on a new engine: the first compiles."""
    make().generate(prompts, n)
    eng = make()
    t = time.perf_counter()
    out = eng.generate(prompts, n)
    return eng, out, time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--drafters", default="ngram,layers:8")
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompts", default="builtin")
    ap.add_argument("--no-diff", action="store_true", help="skip `evalsuite diff --engine spec` per drafter")
    ap.add_argument("--results", default=None, help="also write the figures as JSON here (docs/speculative.md)")
    a = ap.parse_args(argv)
    if a.results and not Path(a.results).parent.is_dir():
        raise SystemExit(f"error: --results {a.results}: no directory {Path(a.results).parent}")

    from engines.errors import ModelError
    from engines.reference import ReferenceEngine
    from engines.spec import SpeculativeEngine
    from evalsuite.compare.diff import DiffSpec, run_diff
    from evalsuite.models import load_model
    from evalsuite.prompts import load_prompts
    from evalsuite.versions import versions

    try:
        m = load_model(a.model)
        pset = load_prompts(a.prompts)
        for d in a.drafters.split(","):
            SpeculativeEngine(m.weights, drafter=d, block=a.block)  # bad options fail before minutes of timing
    except ModelError as e:
        raise SystemExit(f"error: {e}") from None
    prompts = [p.encode(m.tokenizer) for p in pset.prompts]
    prompts = [p for p in prompts if len(p) + a.max_new_tokens + a.block <= m.config.max_context]
    N = a.max_new_tokens
    _, plain, plain_s = _timed_generate(lambda: ReferenceEngine(m.weights), prompts, N)
    print(f"plain greedy (reference): {len(prompts)} prompts x {N} tokens in {plain_s:.2f} s", flush=True)
    rows = []
    for d in a.drafters.split(","):
        eng, out, s = _timed_generate(lambda d=d: SpeculativeEngine(m.weights, drafter=d, block=a.block), prompts, N)
        st = eng.run_stats()["speculation"]
        row = {"drafter": d, "block": a.block, "seconds": round(s, 3), "plain_seconds": round(plain_s, 3),
               "speedup": round(plain_s / s, 3),
               "identical_prompts": sum(x.token_ids == y.token_ids for x, y in zip(out, plain)),
               "prompts": len(prompts), **{k: v for k, v in st.items() if k != "what"}}
        if not a.no_diff:
            t = time.perf_counter()
            r = run_diff(DiffSpec(engine="spec", model=a.model, prompts=a.prompts,
                                  engine_options=(("drafter", d), ("block", str(a.block)))))
            row["diff"] = {"verdict": r.verdict, "positions": r.positions, "real_mismatches": r.real_mismatches,
                           "not_checked": list(r.not_checked), "seconds": round(time.perf_counter() - t, 1),
                           "speculation": r.details["engine_stats"]["speculation"]}
        rows.append(row)
        rates = ", ".join(f"{x:.2f}" for x in st["acceptance_rate_by_position"])
        print(f"{d:<10} acceptance length {st['acceptance_length']:.2f}, rate by position [{rates}], "
              f"{st['target_steps']} target steps for {st['tokens_committed']} tokens, {s:.2f} s "
              f"({plain_s / s:.2f}x plain), identical {row['identical_prompts']}/{len(prompts)}"
              + (f", diff {row['diff']['verdict']}" if "diff" in row else ""), flush=True)
    doc = {"model": a.model, "dtype": "float32", "weights_sha256": m.weights.sha256, "prompt_set": pset.name,
           "prompt_set_sha256": pset.sha256, "prompts": len(prompts), "max_new_tokens": N, "seed": 0,
           "seed_note": "greedy decoding and deterministic drafters: no random choice is made",
           "command": "python -m benchmarks.spec " + " ".join(argv or __import__("sys").argv[1:]),
           "versions": versions(), "rows": rows,
           "what": "wall time: a warm generate of every prompt (continuous batching, 8 rows), the spec engine against "
                   "the reference's plain greedy decoding, measured in the same run on this machine"}
    if a.results:
        Path(a.results).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
