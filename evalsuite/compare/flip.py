"""float32 on an MoE model: flags explained by the other side of a routing near-tie.

A correct float32 engine may round a near-tied pair of router scores (a margin of 1e-6) the other way, in another
batch shape or another kernel's tiling: it then sends that token to another expert, and its output there and after
moves far (the other expert's MLP, carried on by attention) with nothing wrong. bf16's routing rule (routing.py)
takes such positions out and replays the engine's own routing (replay.py). In float32, where a faithful engine's
flags are rare, the judge runs the other side itself: the float32 reference with that one token's k-th expert
swapped for its (k+1)-th (engines.base.OTHER_EXPERTS), every other token routed freely, in one teacher-forced
forward. The prompt's flags from that token on are judged again against it, each output of the engine (teacher-forced
and free-running) as compare_prompt judges it, under the same bounds as before; those within them are cleared.

Measured on the reference alone, never on the engine judged:
- the near-tie bound: routing.ROUTING_TIE_FACTOR x the largest move the reference's own float32 rounding makes to a
  routing margin, the reference in witness.ORDER_SEEDS other reduction orders against itself
  (routing.routing_move) on the flagged prompt; past witness.ORDER_PROMPTS prompts a run, the run's largest so far;
- the token flipped: the one with the smallest margin at or before the first flag (in the prompt or the
  generation), if that margin is within the bound, at its most tied MoE layer. One hypothesis a prompt, not a search.
Once a prompt's flags stand after it, the run FAILs whatever later prompts show, so they are not tried (a broken
engine flags every prompt; the orders cost 4 forwards a prompt). What it cannot see: a bug whose first flag falls
right after such a token and that stays within the bounds of the flipped reference from there; a flip at two tokens
or more (the flags then stand).
"""

from __future__ import annotations

import numpy as np

from engines.base import FREE_EXPERTS as FREE
from engines.base import OTHER_EXPERTS as OTHER
from engines.base import Forced
from engines.errors import ModelError
from evalsuite.compare import rule
from evalsuite.compare.routing import ROUTING_TIE_FACTOR, routing_move

TOP_K = 5


def judge(ref, orders, case, rec: dict, tol: rule.Tolerances, conditioning) -> dict:
    """rec (case's record after the conditioning witness; case: witness.Flagged) judged again against the flipped
    reference where its first flag is at or after a routing near-tie; rec is edited (cleared positions leave
    real_positions) and gains "routing_flip", what was measured. conditioning: the witness's (e, k) per position."""
    if orders is not None and orders.stood:
        rec["routing_flip"] = {"run": False, "why": "not tried: an earlier prompt of this run has flags no witness "
                               "explains, so the run FAILs whatever this one's flip would show"}
        return rec
    rec = _judge(ref, orders, case, rec, tol, conditioning)
    if orders is not None and rec["real_positions"]:
        orders.stood += 1
    return rec


def _judge(ref, orders, case, rec: dict, tol: rule.Tolerances, conditioning) -> dict:
    flagged = rec["real_positions"]
    prompt, tokens = [int(t) for t in case.prompt], [int(t) for t in case.rg.token_ids]
    P, n = len(prompt), len(tokens)
    seq = prompt + tokens[:-1]
    base = ref.score([seq], want_taps=True)[0]
    try:
        moved = _move(orders, seq, base)
    except ModelError as e:
        rec["routing_flip"] = {"run": False, "why": str(e)}
        return rec
    bound = ROUTING_TIE_FACTOR * moved
    margins = np.asarray(base.routing_margins, np.float64)[:P + min(flagged)]  # up to the first flag's token
    at = int(np.argmin(margins))
    out = {"run": False, "bound": bound, "recipe_max_dmargin": moved, "smallest_margin": float(margins[at]),
           "token": at, "position": at - (P - 1)}
    if margins[at] >= bound:
        out["why"] = (f"no routing near-tie at or before the first flag (smallest margin {margins[at]:.3g}, bound "
                      f"{bound:.3g})")
        rec["routing_flip"] = out
        return rec
    layer = int(np.argmin(np.asarray(base.routing_layers)[:, at]))
    experts = np.full((len(base.routing_layers), len(seq), base.routing_experts.shape[-1]), FREE, np.int32)
    experts[layer, at] = OTHER
    other = ref.score([seq], experts=[experts])[0]
    track = Forced.from_logits(other.logits[P - 1:P - 1 + n], tokens, TOP_K)
    again = rule.compare_prompt(tokens, track, case.fo, case.eg, tol, eos_ids=case.eos_ids,
                                conditioning=conditioning, ends=case.ends)
    start = max(at - (P - 1), 0)  # positions before the flipped token are the same on both sides
    cleared = sorted(j for j in flagged if j >= start and j not in again["real_positions"])
    for key in ("real_positions", "token_mismatches", "distribution_mismatches"):
        rec[key] = [j for j in rec[key] if j not in cleared]
    fd = rec.get("first_divergence")
    if fd and fd.get("class") == "real" and fd["position"] in cleared:
        fd["class"] = "routing-flip"
    rec["routing_flip"] = {**out, "run": True, "layer": layer, "cleared": cleared, "real": rec["real_positions"]}
    return rec


def _move(orders, seq, base) -> float:
    """The largest move the reference's float32 rounding makes to a routing margin along seq: each other reduction
    order's margins against base's (routing_move); past the orders' cap, the run's largest so far."""
    if orders is None:
        raise ModelError("no other reduction order was given to this run, so no float32 near-tie bound")
    try:
        scored = orders.tapped(seq)
    except ModelError:
        if not orders.moves:
            raise
        return max(orders.moves)  # measured on other prompts of this run, on the reference alone
    moves = [routing_move(base.routing_layers, base.routing_experts, s.routing_layers, s.routing_experts)
             for s in scored]
    orders.moves.append(max((float(m.max()) for m in moves if m.size), default=0.0))
    return max(orders.moves)
