"""The witness's tables in docs/faults.md, rendered from benchmarks/results/f32-paths-*.json (written by
`python -m benchmarks.f32_paths`): a flagged float32 position, each engine's every path against float64."""

from __future__ import annotations

import json
from pathlib import Path

from evalsuite.doctables import RESULTS, _sci, _source, _table
from evalsuite.roles import JUDGE

F32_PATHS = "f32-paths-*.json"


def f32_paths(root: Path) -> str:
    files = sorted((root / RESULTS).glob(F32_PATHS))
    if not files:
        return f"not measured: no `{RESULTS}/{F32_PATHS}`.\n"
    docs = [json.loads(f.read_text("utf-8")) for f in files]
    rows = []
    for d in docs:
        names = list(dict.fromkeys(r["engine"] for r in d["rows"]))  # the judge, then the engine measured
        for who in names:
            mine = [r for r in d["rows"] if r["engine"] == who]
            worst = max(mine, key=lambda r: r["dlogit"])
            ratio = "" if who == JUDGE else f"{d['worst_dlogit'][who] / d['worst_dlogit'][JUDGE]:.2f}x"
            w = d["witness"]
            far = max(mine, key=lambda r: r["from_record_dlogit"])
            kl = max(r["from_record_kl"] for r in mine)
            rows.append([d["model"], f"{d['prompt']} position {d['position']}", who, str(len(mine)),
                         f"{_sci(worst['dlogit'])} ({worst['path']})", _sci(max(r["kl"] for r in mine)), ratio,
                         f"{far['from_record_dlogit'] / w['dlogit']:.2f}x, {(kl / w['kl']) ** 0.5:.2f}x",
                         _sci(mine[0]["median_dlogit"])])
    return (_source(*(f"{RESULTS}/{f.name}" for f in files), how=" (`python -m benchmarks.f32_paths`)")
            + _table(["model", "position", "engine", "paths", "worst abs Δlogit from float64 (its path)", "worst KL",
                      "worst / the judge's worst", "farthest from the judge's record / the witness (abs Δlogit, "
                      "√KL; diff clears up to CONDITIONING_FACTOR)", "the prompt's median abs Δlogit"], rows))


DRIFT_PARTS = "drift-parts-*.json"


def drift_parts(root: Path) -> str:
    """Each subject of benchmarks/drift_parts.py judged by rule.drift_check itself, so the table is the rule's."""
    from evalsuite.compare import rule

    files = sorted((root / RESULTS).glob(DRIFT_PARTS))
    if not files:
        return f"not measured: no `{RESULTS}/{DRIFT_PARTS}`.\n"
    rows = []
    for f in files:
        d = json.loads(f.read_text("utf-8"))
        k = d["per_position_kl"]
        for who in (s for s in k if s != "recipe"):
            r = rule.drift_check(k[who], k["recipe"], "bfloat16")
            t = r["tail"]
            verdict = "not checked" if not r["checked"] else "ok" if r["ok"] else "FAIL"
            bulk = "" if r.get("ratio") is None else f"{r['ratio']:.3f}"
            rows.append([f.name.removeprefix("drift-parts-").removesuffix(".json"), str(len(k["recipe"])), who,
                         f"{r['mean_ratio']:.3f}", f"{t['bound']:.3g} ({t['bound_from']})",
                         f"{r['within']}/{r['positions']}", bulk,
                         f"{t['engine_only']} vs {t['recipe_only']}", f"{t['p']:.2g}", verdict])
    return (_source(*(f"{RESULTS}/{f.name}" for f in files), how=" (`python -m benchmarks.drift_parts`)")
            + _table(["run", "prompts", "subject", "all-position mean ratio (the old check)",
                      "per-position bound (KL)", "positions within the bound", "bulk ratio",
                      "beyond the bound on one side only (engine vs recipe)", "tail p", "drift check"], rows))


ORDER_SPREAD = "order-spread-*.json"


def order_spread(root: Path) -> str:
    """benchmarks/order_spread.py: held-out draws of the judge's own rounding against the witness's worst."""
    files = sorted((root / RESULTS).glob(ORDER_SPREAD))
    if not files:
        return f"not measured: no `{RESULTS}/{ORDER_SPREAD}`.\n"
    rows = []
    for f in files:
        d = json.loads(f.read_text("utf-8"))
        s = d["summary"]
        a, ill = s["all"], s["ill_conditioned"]
        rows.append([d["model"], d["dtype"], str(len(d["prompts"])), f"{a['n']:,}",
                     f"{a['sqrt_kl_99']:.2f} / {a['sqrt_kl_max']:.2f}",
                     f"{ill['sqrt_kl_99']:.2f} / {ill['sqrt_kl_max']:.2f}",
                     f"{a['share_past']['1.5']['sqrt_kl']:.2%}", f"{s['flagged']} ({s['flagged_share']:.2%})",
                     f"{s['flagged_same_experts']} of {s['same_experts']:,}",
                     "none past the plain tolerance" if not s["factor_to_clear"] else
                     f"{s['factor_to_clear']:.2f} ({s['factor_to_clear_same_experts'] or 0:.2f}; now {s['factor']:g})"])
    return (_source(*(f"{RESULTS}/{f.name}" for f in files), how=" (`python -m benchmarks.order_spread`)")
            + _table(["model", "dtype", "prompts", "held-out draws (positions x orders)",
                      "√KL ratio to the witness's worst, p99 / max", "the same, ill-conditioned tenth",
                      "past 1.5x (√KL)", "flagged by the per-position rule",
                      "flagged with the judge's experts at every token so far (MoE)",
                      "the factor that flags none (with the judge's experts; CONDITIONING_FACTOR)"], rows))
