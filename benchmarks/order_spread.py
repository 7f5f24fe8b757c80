"""How far does one more correct draw of the judge's own rounding fall from the conditioning witness? Measured on the
judge alone, by leaving draws out.

The witness (evalsuite/compare/witness.py) bounds a flagged position by CONDITIONING_FACTOR times the worst of the
judge's own draws there: in bfloat16 its bf16 recipe (decode path) and the recipe in witness.ORDER_SEEDS other
reduction orders, each against the float32 reference; in float32 the reference and its orders, each against its
float64 math. Its premise: a correct engine is one more such draw. Here more draws are made (the recipe in held-out
orders, seeds past ORDER_SEEDS), and at every position of a seeded prompt set each held-out draw is divided by the
witness's worst:

    ratio = held-out draw's error / max(the witness's draws' errors)   (|Δlogit|, and √KL)

By exchangeability a held-out draw exceeds the witness's worst at about 1 position in len(ORDER_SEEDS) + 2; what the
factor must cover is how far it goes then, above all at the ill-conditioned positions (the tenth with the largest
witness), where a correct engine's flags arise. A benchmark: prints figures, writes JSON, asserts nothing.

    .venv/bin/python -m benchmarks.order_spread --model mini-kimi --dtype bfloat16 --prompts 32 \\
        --out benchmarks/results/order-spread-mini-kimi-bfloat16.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

TOP_SHARE = 0.1  # the ill-conditioned positions: the tenth with the largest witness
THRESHOLDS = (1.0, 1.5, 2.0, 3.0)  # the shares of held-out draws past these ratios are reported


def measure(model, dtype: str, n: int, held: int, max_new: int, seed: int, progress) -> dict:
    """Per position: each draw's (|Δlogit|, KL) from the judge's better answer, the witness's worst and each
    held-out draw's; prompts from benchmarks.detection's seeded order."""
    from benchmarks.detection import prompt_order
    from engines.megakernel import MegakernelEngine
    from evalsuite.compare.witness import ORDER_SEEDS, own_error
    from evalsuite.plugins import judge

    prompts = prompt_order(model.tokenizer, n, seed, model.config.max_context, max_new)
    ref = judge(model)
    declared = MegakernelEngine(model.weights, dtype).recipe if dtype != "float32" else None  # as diff's judge
    gens = []
    for c in range(0, len(prompts), 8):
        progress(f"reference: prompts {c + 1}-{min(c + 8, len(prompts))}")
        gens += ref.generate([p for _, p in prompts[c:c + 8]], max_new, top_k=5, want_logits=True)
    if dtype == "float32":
        against = [ref.float64_logits(p, g.token_ids) for (_, p), g in zip(prompts, gens)]
        first = [own_error(g.logits, a) for g, a in zip(gens, against)]
    else:
        against = [np.asarray(g.logits, np.float64) for g in gens]
        recipe = judge(model, dtype, recipe=declared)
        rl = recipe.forced_topk([p for _, p in prompts], [g.token_ids for g in gens], 1, want_logits=True)
        first = [own_error(r.logits, a) for r, a in zip(rl, against)]
    moe = bool(model.config.n_moe_layers)
    base = recipe if dtype != "float32" else ref  # whose expert choices a draw's are compared with (score path)
    chose = [base.score([_seq(p, g)], want_taps=True)[0].routing_experts if moe else None
             for (_, p), g in zip(prompts, gens)]
    seeds = list(ORDER_SEEDS) + [max(ORDER_SEEDS) + 1 + k for k in range(held)]
    sames: dict = {}
    draws = {0: first}  # 0: the judge's own first draw (the recipe's decode path; float32: the reference)
    for s in seeds:
        progress(f"order {s} ({'witness' if s in ORDER_SEEDS else 'held out'})")
        eng = judge(model, dtype, order_seed=s, recipe=declared)
        out, same = [], []
        for (_, p), g, a, c in zip(prompts, gens, against, chose):
            sc = eng.score([_seq(p, g)], want_taps=moe)[0]
            out.append(own_error(sc.logits[len(p) - 1:len(p) - 1 + len(g.token_ids)], a))
            same.append(_same_so_far(c, sc.routing_experts, len(p), len(g.token_ids)))
        draws[s], sames[s] = out, same
        del eng
    wit = [0, *ORDER_SEEDS]
    rows = []
    for i, (pid, _) in enumerate(prompts):
        w_dl = np.maximum.reduce([draws[s][i][0] for s in wit])
        w_kl = np.maximum.reduce([draws[s][i][1] for s in wit])
        for s in seeds[len(ORDER_SEEDS):]:
            dl, kl = draws[s][i]
            for j in range(len(dl)):
                rows.append((pid, j, s, bool(sames[s][i][j]), float(w_dl[j]), float(w_kl[j]), float(dl[j]),
                             float(kl[j])))
    return {"dtype": dtype, "prompts": [pid for pid, _ in prompts], "witness_seeds": [0, *ORDER_SEEDS],
            "held_out_seeds": seeds[len(ORDER_SEEDS):], "rows": rows}


def _seq(prompt, gen) -> list[int]:
    return list(prompt) + [int(t) for t in gen.token_ids[:-1]]


def _same_so_far(a, b, P: int, n: int) -> np.ndarray:
    """[n] per position: the draw chose the same experts as the judge at every token up to it (all True without
    MoE), so a difference there is rounding with the same experts (what the routing replay leaves to the bounds)."""
    if a is None:
        return np.ones(n, bool)
    same = (np.asarray(a) == np.asarray(b)).all(axis=-1).all(axis=0)  # [T]
    return np.logical_and.accumulate(same)[P - 1:P - 1 + n]


def summarise(m: dict) -> dict:
    """Ratio quantiles and shares past THRESHOLDS, over every position and over the ill-conditioned tenth, and the
    held-out draws the per-position rule would flag (a correct engine's false alarms, as the judge alone predicts)."""
    from evalsuite.compare import rule

    r = np.asarray([x[4:] for x in m["rows"]], np.float64)  # w_dl, w_kl, dl, kl
    same = np.asarray([x[3] for x in m["rows"]], bool)
    tiny = np.finfo(np.float64).tiny
    dl = r[:, 2] / np.maximum(r[:, 0], tiny)
    sq = np.sqrt(r[:, 3] / np.maximum(r[:, 1], tiny))
    ill = r[:, 1] >= np.quantile(r[:, 1], 1 - TOP_SHARE)

    def part(mask) -> dict:
        return {"n": int(mask.sum()), **{f"{name}_{q}": float(np.quantile(v[mask], q / 100)) for name, v in
                                         (("dlogit", dl), ("sqrt_kl", sq)) for q in (50, 90, 99)},
                "dlogit_max": float(dl[mask].max()), "sqrt_kl_max": float(sq[mask].max()),
                "share_past": {f"{t:g}": {"dlogit": float((dl[mask] > t).mean()),
                                          "sqrt_kl": float((sq[mask] > t).mean())} for t in THRESHOLDS}}

    # each held-out draw judged as an engine is: beyond the per-position bounds the witness's draws widen
    tol = rule.Tolerances.for_dtype(m["dtype"])
    b = rule.position_bounds(tol, len(r), (r[:, 0], r[:, 1]))
    flagged = (r[:, 2] > b["dlogit"]) | (r[:, 3] > b["kl"])
    # the factor the witness would need so that no held-out draw is flagged: where a draw is past the plain
    # tolerance, its ratio to the witness's worst in that measure (|Δlogit|, √KL)
    need = np.maximum(np.where(r[:, 2] > tol.dlogit, dl, 0.0), np.where(r[:, 3] > tol.kl, sq, 0.0))
    worst = np.argsort(-sq)[:10]
    return {"flagged": int(flagged.sum()), "flagged_share": float(flagged.mean()),
            "same_experts": int(same.sum()), "flagged_same_experts": int((flagged & same).sum()),
            "factor": rule.CONDITIONING_FACTOR[m["dtype"]], "factor_to_clear": float(need.max()),
            "factor_to_clear_same_experts": float(need[same].max()) if same.any() else None,
            "flagged_at": [{"prompt": m["rows"][k][0], "position": m["rows"][k][1], "seed": m["rows"][k][2],
                            "same_experts_so_far": bool(same[k]), "sqrt_kl_ratio": float(sq[k]),
                            "dlogit_ratio": float(dl[k]), "witness_kl": float(r[k, 1])}
                           for k in np.flatnonzero(flagged)[:20]],
            "all": part(np.ones(len(r), bool)), "ill_conditioned": part(ill),
            "worst": [{"prompt": m["rows"][k][0], "position": m["rows"][k][1], "seed": m["rows"][k][2],
                       "sqrt_kl_ratio": float(sq[k]), "dlogit_ratio": float(dl[k]), "witness_kl": float(r[k, 1])}
                      for k in worst]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the witness's premise, measured on the judge: held-out draws of its "
                                             "own rounding against the witness's worst")
    ap.add_argument("--model", default="mini-kimi")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--held-out", type=int, default=4, help="orders past witness.ORDER_SEEDS, each one more draw")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0, help="the prompts' order (benchmarks.detection's)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.out and not Path(a.out).parent.is_dir():
        print(f"error: --out {a.out}: no directory {Path(a.out).parent}", file=sys.stderr)
        return 2
    if a.prompts < 1 or a.held_out < 1:
        print("error: --prompts and --held-out must be at least 1", file=sys.stderr)
        return 2
    from engines.errors import ModelError
    from evalsuite.models import load_model
    from evalsuite.versions import versions

    t0 = time.time()
    try:
        model = load_model(a.model)
    except ModelError as e:
        print(f"error: --model {a.model}: {e}", file=sys.stderr)
        return 2
    m = measure(model, a.dtype, a.prompts, a.held_out, a.max_new_tokens, a.seed,
                lambda s: print(f"[{time.time() - t0:.0f} s] {s}", flush=True))
    s = summarise(m)
    for k in ("all", "ill_conditioned"):
        p = s[k]
        print(f"{k}: {p['n']} held-out draws; ratio to the witness's worst, |Δlogit| p50 {p['dlogit_50']:.2f} p99 "
              f"{p['dlogit_99']:.2f} max {p['dlogit_max']:.2f}; √KL p50 {p['sqrt_kl_50']:.2f} p99 "
              f"{p['sqrt_kl_99']:.2f} max {p['sqrt_kl_max']:.2f}; past 1.5 (√KL): "
              f"{p['share_past']['1.5']['sqrt_kl']:.2%}")
    print(f"held-out draws the per-position rule flags (CONDITIONING_FACTOR x the witness's worst): {s['flagged']} of "
          f"{s['all']['n']} ({s['flagged_share']:.2%}); with the judge's experts at every token so far: "
          f"{s['flagged_same_experts']} of {s['same_experts']}; the factor that would flag none: "
          f"{s['factor_to_clear']:.2f} ({s['factor_to_clear_same_experts'] or 0:.2f} with the judge's experts; now "
          f"{s['factor']:g})")
    if a.out:
        doc = {"benchmark": "order_spread", "model": a.model, "dtype": a.dtype, "max_new_tokens": a.max_new_tokens,
               "order_seed": a.seed, "weights_sha256": model.weights.sha256, "top_share": TOP_SHARE,
               "witness_seeds": m["witness_seeds"], "held_out_seeds": m["held_out_seeds"], "prompts": m["prompts"],
               "summary": s, "seconds": round(time.time() - t0, 1), "versions": versions()}
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
