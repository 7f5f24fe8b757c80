"""The numeric-recipe envelope behind evalsuite/compare/rule.py's `character` (and the echo
consistency bound of engines/openai/probe.py): how far a legitimately different numeric recipe
moves greedy decoding, measured on the REFERENCE only (its bf16 recipe against its float32).

    .venv/bin/python -m benchmarks.recipe_envelope [builtin|quick] [max_new_tokens]

Prints: teacher-forced |Δlogprob| of the float32 reference's token under the bf16 recipe; the
bf16 recipe's free-running first divergences (reference gap to the recipe's token, its rank);
and the bf16 recipe's prefill path against its decode path. Asserts nothing. About 4 minutes on
the builtin set with 32 tokens, 2 cores.
"""
import argparse
import time

import numpy as np

from engines.reference import ReferenceEngine
from evalsuite.compare import metrics
from evalsuite.models import load_model
from evalsuite.prompts import load_prompts


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="the bf16 recipe's envelope around the float32 reference")
    ap.add_argument("pset", nargs="?", default="builtin", help="prompt set (builtin, quick)")
    ap.add_argument("max_new_tokens", nargs="?", type=int, default=32)
    args = ap.parse_args(argv)
    pset, N = args.pset, args.max_new_tokens
    t0 = time.time()
    m = load_model("smollm2-135m")
    ps = [p.encode(m.tokenizer) for p in load_prompts(pset).prompts]
    r32, r16 = ReferenceEngine(m.weights, "float32"), ReferenceEngine(m.weights, "bfloat16")
    g32 = r32.generate(ps, N, top_k=5, want_logits=True)
    g16 = r16.generate(ps, N, top_k=5, want_logits=True)
    forced = r16.decode_forced(ps, [g.token_ids for g in g32])
    dlp, gaps, ranks = [], [], []
    for a, b, f in zip(g32, g16, forced):
        la, lf = metrics.log_softmax(a.logits), metrics.log_softmax(f)
        dlp.extend(np.abs(la[np.arange(N), a.token_ids] - lf[np.arange(N), a.token_ids]).tolist())
        j = next((j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
        if j is not None:
            gaps.append(float(a.logits[j].max() - a.logits[j, b.token_ids[j]]))
            ranks.append(metrics.rank_of(b.token_ids[j], a.logits[j]))
    dlp = np.array(dlp)
    print(f"smollm2-135m, {pset} ({len(ps)} prompts x {N} tokens), bf16 recipe vs float32 reference")
    print(f"  teacher-forced |dlogprob| of the f32 token: max {dlp.max():.3f} p99 {np.percentile(dlp, 99):.3f} "
          f"mean {dlp.mean():.4f} over {dlp.size} positions")
    print(f"  free-running first divergences: {len(gaps)} of {len(ps)} prompts; reference gap to the recipe's token: "
          f"max {max(gaps, default=0):.3f} p50 {np.median(gaps) if gaps else 0:.3f}; ranks {sorted(set(ranks))}")
    d = []
    for p, g in zip(ps[:8], g16[:8]):
        sc = r16.score([p + g.token_ids[:-1]])[0].logits[len(p) - 1:]
        a = metrics.log_softmax(g.logits)[np.arange(N), g.token_ids]
        b = metrics.log_softmax(sc)[np.arange(N), g.token_ids]
        d.extend(np.abs(a - b).tolist())
    print(f"  bf16 recipe prefill vs decode path (first 8 prompts): max |dlogprob| {max(d):.3f} "
          f"p99 {np.percentile(d, 99):.3f}")
    print(f"  {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
