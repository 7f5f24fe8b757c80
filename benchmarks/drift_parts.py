"""What carries the bf16 drift ratio: per position, each subject's KL from the float32 reference against the
reference's own bf16 recipe's, teacher-forced along the float32 reference's greedy tokens (as diff's drift check).
Subjects: the faithful megakernel, its bf16-class faults, and the null draws: the same reference in the same
declared recipe with its hidden and MLP dimensions permuted (engines.weights.permuted: another correct bf16 engine,
summing in another order, that is not the engine judged). The statistics the drift check could use are computed at
every chunk of 8 prompts, and the per-position KLs are kept so another statistic can be tried without a re-run.
A benchmark: prints figures, writes JSON, asserts nothing.

    .venv/bin/python -m benchmarks.drift_parts --model mini-kimi-linear --prompts 16 \
        --out benchmarks/results/drift-parts-mini-kimi-linear.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from evalsuite.compare.rule import KL_TOL

NULL_SEEDS = (1, 2, 3)  # the permuted reference draws (engines.weights.permuted's seeds)
TRIMS = (0.01, 0.02, 0.05)  # fractions of each side's largest per-position KLs left out of a trimmed mean
DRIFT_FAULTS = ("bf16_residual", "mm_bf16_out", "kv_bf16_slot", "attn_scale", "pos_weights_dtype")


def statistics(e: np.ndarray, r: np.ndarray) -> dict:
    """The candidate drift statistics of an engine's per-position KLs e against the recipe's r (same positions)."""
    out = {"mean": float(e.mean() / max(r.mean(), 1e-30)), "median": float(np.median(e) / max(np.median(r), 1e-30))}
    for q in TRIMS:
        k = int(np.floor(q * e.size))
        te, tr = np.sort(e)[:e.size - k], np.sort(r)[:r.size - k]
        out[f"trim{q:g}"] = float(te.mean() / max(tr.mean(), 1e-30))
    cap = KL_TOL["bfloat16"]  # the per-position bound: what lies above it is the per-position rule's to judge
    out["capped"] = float(np.minimum(e, cap).mean() / max(np.minimum(r, cap).mean(), 1e-30))
    s = np.sort(e)[::-1]
    out["top5_share"] = float(s[:5].sum() / max(e.sum(), 1e-30))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="what carries the bf16 drift ratio, per position")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=16, help="a multiple of 8 (detection's chunk)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--faults", default=",".join(DRIFT_FAULTS),
                    help="comma-separated bf16-class faults (those the model cannot have are skipped); '' for none")
    ap.add_argument("--null-seeds", default=",".join(map(str, NULL_SEEDS)))
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.out and not Path(a.out).parent.is_dir():
        print(f"error: --out {a.out}: no directory {Path(a.out).parent}", file=sys.stderr)
        return 2
    if a.prompts < 8 or a.prompts % 8:
        print(f"error: --prompts {a.prompts}: expected a positive multiple of 8", file=sys.stderr)
        return 2
    try:
        seeds = [int(s) for s in a.null_seeds.split(",") if s]
    except ValueError:
        print(f"error: --null-seeds {a.null_seeds!r}: expected comma-separated integers", file=sys.stderr)
        return 2

    from benchmarks.detection import CHUNK, prompt_order
    from engines.errors import ModelError
    from engines.megakernel import MegakernelEngine
    from engines.megakernel.faults import CATALOGUE
    from engines.reference import ReferenceEngine
    from evalsuite.compare import metrics
    from evalsuite.models import load_model
    from evalsuite.plugins import judge
    from evalsuite.versions import versions

    try:
        m = load_model(a.model)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    known = {f.name for f in CATALOGUE}
    faults = [f for f in a.faults.split(",") if f]
    bad = [f for f in faults if f not in known]
    if bad:
        print(f"error: --faults: unknown fault {bad[0]!r}", file=sys.stderr)
        return 2
    prompts = prompt_order(m.tokenizer, a.prompts, 0, m.config.max_context, a.tokens)
    faithful = MegakernelEngine(m.weights, "bfloat16")
    declared = faithful.recipe
    subjects = {"faithful": faithful}
    skipped = {}
    for f in faults:
        try:
            subjects[f] = MegakernelEngine(m.weights, "bfloat16", fault=f)
        except (ModelError, ValueError) as e:  # a fault this model cannot have
            skipped[f] = str(e).splitlines()[0]
    for s in seeds:
        subjects[f"null-seed{s}"] = judge(m, "bfloat16", order_seed=s, recipe=declared)
    ref = ReferenceEngine(m.weights, "float32")
    recipe = ReferenceEngine(m.weights, "bfloat16", recipe=declared)
    kl = {name: [] for name in ["recipe", *subjects]}
    t0 = time.time()
    stats = []
    for c in range(0, len(prompts), CHUNK):
        ids = [p for _, p in prompts[c:c + CHUNK]]
        g = ref.generate(ids, a.tokens, top_k=5, want_logits=True)
        toks = [x.token_ids for x in g]
        for name, eng in [("recipe", recipe), *subjects.items()]:
            fo = eng.forced_topk(ids, toks, 5, want_logits=True)
            kl[name] += [metrics.kl(x.logits, y.logits) for x, y in zip(g, fo)]
        r = np.concatenate(kl["recipe"])
        row = {"prompts": c + len(ids), "positions": int(r.size),
               "subjects": {n: statistics(np.concatenate(kl[n]), r) for n in subjects}}
        stats.append(row)
        print(f"{a.model}: {row['prompts']} prompts ({time.time() - t0:.0f} s)", flush=True)
        for n, s in row["subjects"].items():
            print(f"  {n:>22}: " + "  ".join(f"{k} {v:.3f}" for k, v in s.items()), flush=True)
        if a.out:  # after every chunk: a run cut short keeps what it measured
            doc = {"model": a.model, "weights_sha256": m.weights.sha256, "dtype": "bfloat16",
                   "recipe": asdict(declared),
                   "prompt_set": "benchmarks/make_prompts.py (detection order)", "order_seed": 0,
                   "prompts": [pid for pid, _ in prompts[:row["prompts"]]], "tokens": a.tokens, "null_seeds": seeds,
                   "trims": TRIMS, "skipped_faults": skipped, "by_chunk": stats,
                   "per_position_kl": {n: [np.round(v, 9).tolist() for v in vs] for n, vs in kl.items()},
                   "seconds": round(time.time() - t0, 1), "versions": versions()}
            Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    if a.out:
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
