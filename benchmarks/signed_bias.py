"""Are the bf16 faults `diff` misses (norm_eps, final_norm_eps) visible at all in bf16? A signed, paired test
against the reference's own bf16 recipe on the same tokens, where drift_check uses magnitudes only: a
systematic error (a logit scale, an epsilon) moves every position the same way, rounding noise does not.
Per prompt: the mean of lp_engine(t) - lp_recipe(t) over the reference's greedy tokens t, and the mean
slope of the engine's centred logits on the recipe's (1 = the same scale); then the mean over prompts and
its t statistic. A benchmark: prints figures, asserts nothing; not a verdict path (docs/calibration.md has the
logit-scale figures).

    .venv/bin/python -m benchmarks.signed_bias --model mini-llama --prompts builtin --n 32 \\
        --faults none,norm_eps,final_norm_eps,bf16_residual,rope_theta
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

N_TOKENS = 32


def _t(v: np.ndarray) -> float:
    s = v.std(ddof=1)
    return float(v.mean() / (s / np.sqrt(len(v)))) if s > 0 else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="signed bias of bf16 engines against the reference's bf16 recipe")
    ap.add_argument("--model", default="mini-llama")
    ap.add_argument("--prompts", default="builtin")
    ap.add_argument("--n", type=int, default=32, help="at most this many prompts")
    ap.add_argument("--faults", default="none,norm_eps,final_norm_eps,bf16_residual,rope_theta")
    a = ap.parse_args(argv)
    from engines.megakernel import MegakernelEngine
    from engines.reference import ReferenceEngine
    from evalsuite.compare import metrics
    from evalsuite.models import load_model
    from evalsuite.prompts import load_prompts

    m = load_model(a.model)
    ps = [p.encode(m.tokenizer) for p in load_prompts(a.prompts).prompts]
    ps = [p for p in ps if len(p) + N_TOKENS < m.config.max_context][:a.n]
    ref, recipe = ReferenceEngine(m.weights, "float32"), ReferenceEngine(m.weights, "bfloat16")
    toks = [g.token_ids for g in ref.generate(ps, N_TOKENS)]
    rec = recipe.forced_topk(ps, toks, 5, want_logits=True)
    print(f"{a.model}, {a.prompts}: {len(ps)} prompts x {N_TOKENS} tokens, bf16, against the reference's bf16 recipe")
    for f in a.faults.split(","):
        eng = MegakernelEngine(m.weights, "bfloat16", fault=None if f == "none" else f)
        dlp, slope = [], []
        for r, e, t in zip(rec, eng.forced_topk(ps, toks, 5, want_logits=True), toks):
            j = np.arange(len(t))
            dlp.append(float((metrics.log_softmax(e.logits)[j, t] - metrics.log_softmax(r.logits)[j, t]).mean()))
            x = r.logits - r.logits.mean(-1, keepdims=True)
            y = e.logits - e.logits.mean(-1, keepdims=True)
            slope.append(float(((x * y).sum(-1) / (x * x).sum(-1)).mean() - 1))
        d, s = np.array(dlp), np.array(slope)
        print(f"  {f:16s} mean Δlogprob {d.mean():+.2e} (t {_t(d):+6.1f})   logit slope - 1 {s.mean():+.2e} "
              f"(t {_t(s):+6.1f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
