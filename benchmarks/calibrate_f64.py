"""The float32 noise floor against a float64 witness (issue 14's false alarm): the reference
run in float32 as `diff` runs it (greedy, full logits), against the SAME reference math in float64
(ReferenceEngine.float64_logits: jax x64 inside model.float64_math, weights cast up; diff's conditioning
witness) teacher-forced along the float32 tokens.
Two independent float32 implementations can each be this far from exact arithmetic, so their difference
can reach about twice it: the floor a float32 bound should rest on. For comparison it also prints the
floor DLOGIT_TOL rests on today (the float32 reference's score path against its own decode path).
A benchmark: prints figures, asserts nothing; measures the reference only, never an engine under test.

    .venv/bin/python -m benchmarks.calibrate_f64 [--prompts 128] [--offset 64] [--json OUT]

Prompts: benchmarks/detection.py's seeded order of benchmarks/make_prompts.py's set, from --offset on
(64: disjoint from the detection table's first 64, as calibrate_noise.py's `varied` set), 32 tokens each.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

N_TOKENS = 32


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the float32 reference against itself in float64")
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--offset", type=int, default=64)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args(argv)
    if a.prompts < 1 or a.offset < 0:
        print("error: --prompts must be >= 1 and --offset >= 0", file=sys.stderr)
        return 2
    from benchmarks.detection import prompt_order
    from engines.reference import ReferenceEngine
    from evalsuite.compare import metrics
    from evalsuite.models import load_model
    from evalsuite.versions import versions

    m = load_model("smollm2-135m")
    c = m.config
    rows = prompt_order(m.tokenizer, a.offset + a.prompts, 0, c.max_context, N_TOKENS)[a.offset:]
    ref = ReferenceEngine(m.weights, "float32")
    t0 = time.time()
    gens = ref.generate([ids for _, ids in rows], N_TOKENS, top_k=5, want_logits=True)
    floor = [ref.score([ids + g.token_ids[:-1]])[0].logits[len(ids) - 1:] for (_, ids), g in zip(rows, gens)]
    per = []
    for (pid, ids), g, fl in zip(rows, gens, floor):
        ex = ref.float64_logits(ids, g.token_ids)  # what diff's conditioning witness computes
        l32 = np.asarray(g.logits, np.float64)
        d = np.abs(l32 - ex).max(-1)
        per.append({"id": pid, "prompt_tokens": len(ids), "max_dlogit_vs_f64": float(d.max()),
                    "first_dlogit_vs_f64": float(d[0]), "max_kl_vs_f64": float(metrics.kl(ex, l32).max()),
                    "max_abs_logit": float(np.abs(ex).max()),
                    "max_dlogit_score_vs_decode": float(np.abs(l32 - np.asarray(fl, np.float64)).max())})
        print(f"{pid:34s} {len(ids):5d} tokens  vs f64 {d.max():.2e} (first {d[0]:.2e})  "
              f"score-vs-decode {per[-1]['max_dlogit_score_vs_decode']:.2e}  max|logit| "
              f"{per[-1]['max_abs_logit']:.1f}", flush=True)
    v = np.array([p["max_dlogit_vs_f64"] for p in per])
    s = np.array([p["max_dlogit_score_vs_decode"] for p in per])
    k = np.array([p["max_kl_vs_f64"] for p in per])
    print(f"{len(per)} prompts, {time.time() - t0:.0f} s: float32 vs float64 max |Δlogit| {v.max():.3e} "
          f"(p90 over prompts {np.percentile(v, 90):.3e}), max KL {k.max():.3e}; score-vs-decode floor "
          f"{s.max():.3e}; ratio {v.max() / max(s.max(), 1e-30):.1f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"prompts": per, "offset": a.offset, "tokens": N_TOKENS,
                                            "model": m.name, "weights_sha256": m.weights.sha256,
                                            "versions": versions()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
