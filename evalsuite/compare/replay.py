"""The routing replay: on a bf16 MoE model, the positions routing.py left not judged (the reference's expert choice
near-tied there) judged again with the engine's own choice replayed in the reference.

A correct bf16 engine may take the other side of a near-tie, and its output then moves far (another expert's MLP),
so those positions cannot be judged against the reference's own choice. An engine that reports its expert choices
(Capabilities.routing, Engine.forced_routing: what vLLM's enable_return_routed_experts records for Rollout Routing
Replay, R3, and MaxText's forced_routed_experts replays) can be judged there: the float32 reference and its bf16
recipe are both re-run along the same tokens with the engine's experts forced (ReferenceEngine.score(experts=...):
the selection replayed, the weights recomputed, as R3 does), and at each such position
- the engine's choice must be one rounding could make: at that token and every one before it, each forced set is
  the replayed float32 reference's own choice or its bf16 recipe's, or within routing.py's near-tie bound of the
  nearer of the two (engines.reference.moe.forced_gap); else the position is real: a routing bug, not a near-tie;
- the engine's logits must be within the per-position bf16 bounds of the replayed float32 reference, widened by the
  replayed recipe's own error there (rule.CONDITIONING, as the conditioning witness widens them): the same rounding
  noise, now with the same experts on both sides.
A position passing both is cleared; one failing either is real. The tolerances are the reference's (its recipe's
error, its rounding move of the router), measured along the engine's experts but never on the engine's logits. What
the replay cannot tell apart: at a near-tie of three or more experts, another set within the bound (a router that
takes ranks 2..k+1 there looks like rounding). Where the engine reports no routing, the positions stay not judged
(routing.py's note).
"""

from __future__ import annotations

import numpy as np

from engines.base import Forced
from engines.errors import ModelError
from evalsuite.compare import rule
from evalsuite.compare.witness import ORDER_SEEDS, own_error

TOP_K = 5


def replay_all(ref, recipe, eng, cases: list[tuple], tol: rule.Tolerances, bound: float, orders=None) -> None:
    """cases: (prompt ids, tokens, rec) of the prompts whose rec["routing_ties"] is not empty. The engine's routing
    along them is asked for in one call, the reference and its recipe replayed with it, and each rec judged (edited,
    see judge); bound: routing.py's near-tie bound of this run; orders: the recipe in other reduction orders
    (witness.OrderSpread), replayed too where the engine's logits stay beyond the one recipe's."""
    if not cases:
        return
    try:
        got = eng.forced_routing([c[0] for c in cases], [list(c[1]) for c in cases], TOP_K, want_logits=True)
    except ModelError as e:
        got = [e] * len(cases)
    for (prompt, tokens, rec), g in zip(cases, got):
        judge(_replayed(ref, recipe, g, prompt, tokens), prompt, tokens, rec, tol, bound, orders)


def _replayed(ref, recipe, got, prompt, tokens):
    """(the engine's record, the float32 reference's and its recipe's Scored) with got.routing forced; or the
    ModelError that stopped it (got itself where forced_routing raised)."""
    if isinstance(got, Exception):
        return got
    try:
        if got.logits is None or got.routing is None:
            raise ModelError("the engine's forced_routing gave no full logits or no routing")
        seq = list(prompt) + [int(t) for t in tokens[:-1]]
        return got, ref.score([seq], experts=[got.routing])[0], recipe.score([seq], experts=[got.routing])[0]
    except ModelError as e:
        return e


def judge(run, prompt, tokens, rec: dict, tol: rule.Tolerances, tie: float, orders=None) -> dict:
    """rec's routing-tied positions (rec["routing_ties"], along tokens: the reference's greedy track or a golden
    file's) judged with the engine's routing replayed (run: _replayed's triple, or the error that stopped it); rec is
    edited: a position found real goes back into rec["real_positions"] (and rec["token_mismatches"] where the
    engine's argmax differs there), and rec["routing_replay"] says what was measured. tie: the near-tie bound.
    orders: where a position's logits stay beyond the one replayed recipe's error, the same recipe in other
    reduction orders is replayed as well and the witness is the worst of them, as the conditioning witness does."""
    ties = list(rec.get("routing_ties") or ())
    if isinstance(run, Exception):
        rec["routing_replay"] = {"run": False, "why": str(run), "positions": ties}
        return rec["routing_replay"]
    got, r32, r16 = run
    P, n = len(prompt), len(tokens)
    at = slice(P - 1, P - 1 + n)  # the logits that predict each token
    # [M, T]: how far the engine's set is from the float32 reference's own choice and from its bf16 recipe's, both
    # replayed along the engine's experts (> 0: not that one's choice); the nearer of the two must be within the bound
    gaps = np.minimum(np.asarray(r32.routing_gaps, np.float64), np.asarray(r16.routing_gaps, np.float64))
    worst = np.maximum.accumulate(gaps.max(axis=0))[at]  # the largest gap at this token or any before it
    l32, l16 = np.asarray(r32.logits[at], np.float64), np.asarray(r16.logits[at], np.float64)
    # the replayed judge's own tokens: after another expert choice its top-1 may not be the track's token
    mine = l32.argmax(axis=-1)
    own = own_error(l16, l32)  # the replayed recipe's (|Δlogit|, KL) from the replayed float32 reference
    track = Forced.from_logits(l32, mine, TOP_K)
    again = rule.compare_prompt(mine, track, got, None, tol, conditioning=own)
    bad = {j for j in ties if worst[j] > tie}
    spread = {"run": False, "why": "the one replayed recipe cleared every position its logits could"}
    if (set(ties) & set(again["real_positions"])) - bad:
        spread, errs = _other_orders(orders, prompt, tokens, l32, got.routing)
        if errs:
            own = tuple(np.maximum.reduce([o, *(e[i] for e in errs)]) for i, o in enumerate(own))
            again = rule.compare_prompt(mine, track, got, None, tol, conditioning=own)
    real = sorted(bad | (set(ties) & set(again["real_positions"])))
    rec["real_positions"] = sorted(set(rec["real_positions"]) | set(real))
    rec["token_mismatches"] = sorted(set(rec["token_mismatches"]) | (set(real) & set(again["token_mismatches"])))
    fd = rec.get("first_divergence")
    if fd and fd.get("class") == "routing-tie":
        fd["class"] = "real" if fd["position"] in real else "routing-replayed"
    bounds = rule.position_bounds(tol, n, own)
    rec["routing_replay"] = {
        "run": True, "positions": ties, "cleared": sorted(set(ties) - set(real)), "real": real,
        "beyond_tie": sorted(bad), "tie_bound": tie, "engine_flips": int((r32.routing_gaps > 0).sum()),
        "neither_choice": int((gaps > 0).sum()), "other_orders": spread,
        "at": {int(j): {"largest_gap_so_far": float(worst[j]), "kl": _kl(again, j), "kl_bound": float(bounds["kl"][j]),
                        "recipe_kl": float(own[1][j])} for j in ties}}
    return rec["routing_replay"]


def _other_orders(orders, prompt, tokens, l32, experts) -> tuple[dict, list]:
    """The replayed recipe in witness.ORDER_SEEDS' other reduction orders, each with the engine's experts forced:
    (what ran, or why not; each order's (|Δlogit|, KL) from the replayed float32 reference l32, [] if none ran)."""
    if orders is None:
        return {"run": False, "why": "no other reduction order was given to this run"}, []
    try:
        errs = orders.errors(prompt, tokens, l32, experts=experts)
    except ModelError as e:
        return {"run": False, "why": str(e)}, []
    return {"run": True, "seeds": list(ORDER_SEEDS)}, errs


def _kl(rec: dict, j: int) -> float | None:
    kl = rec["tf"]["kl"]
    return None if kl is None else float(kl[j])


def summary(records: list[dict]) -> dict:
    """The run's routing replay over its prompts' records ("routing_replay" where one ran)."""
    runs = [r["routing_replay"] for r in records if r and r.get("routing_replay")]
    if not runs:
        return {"run": False, "why": "no position was at a routing near-tie"}
    done = [x for x in runs if x["run"]]
    return {"run": bool(done), "prompts": len(runs), "not_run": [x["why"] for x in runs if not x["run"]],
            "positions": sum(len(x["positions"]) for x in done), "cleared": sum(len(x["cleared"]) for x in done),
            "real": sum(len(x["real"]) for x in done), "beyond_tie": sum(len(x["beyond_tie"]) for x in done),
            "engine_flips": sum(x["engine_flips"] for x in done),
            "neither_choice": sum(x["neither_choice"] for x in done),
            "tie_bound": max((x["tie_bound"] for x in done), default=None),
            "rule": "at a routing near-tie the reference and its bf16 recipe re-run with the engine's experts forced: "
                    "the engine's choice within the near-tie bound of the replayed reference's or recipe's own, and "
                    "its logits within the bf16 bounds widened by the replayed recipe's error "
                    "(evalsuite/compare/replay.py)"}


def note(records: list[dict], bound: float) -> str | None:
    """What stays not judged after the replay (no report from the engine, or it failed), one line; None if nothing."""
    left = [r for r in records if r and r.get("routing_ties") and not (r.get("routing_replay") or {}).get("run")]
    if not left:
        return None
    why = next(((r.get("routing_replay") or {}).get("why") for r in left if r.get("routing_replay")), None)
    n = sum(len(r["routing_ties"]) for r in left)
    return (f"{n} positions in {len(left)} prompts differ beyond the bounds where the reference's expert choice is "
            f"near-tied (within {bound:.3g}) and were not replayed with the engine's routing"
            + (f" ({why})" if why else " (the engine does not report its expert choices: Capabilities.routing)")
            + ": a correct bf16 engine may route them to other experts, so they are not judged")


def judge_ties(ref, recipe, eng, prompts, tracks, records: list[dict], tol: rule.Tolerances, ties: dict,
               orders=None) -> str | None:
    """routing.routing_ties' positions not judged (in records), replayed where the engine reports its routing
    (Capabilities.routing); ties gains "replay", the summary. Returns what stays not judged, one line, or None."""
    cases = [(p, t, r) for p, t, r in zip(prompts, tracks, records) if r and r.get("routing_ties")]
    if eng.capabilities.routing:
        replay_all(ref, recipe, eng, cases, tol, ties["bound"], orders)
    ties["replay"] = summary(records)
    return note(records, ties["bound"])
