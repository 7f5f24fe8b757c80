"""bf16 on an MoE model: where rounding alone can change a token's experts. A correct bf16 engine may route a
near-tied token to other experts, and the output then moves far (another expert's MLP), so real positions at the
reference's routing near-ties are reported as not judged rather than failed (docs/calibration.md, "Routing
near-ties"). Everything here is measured on the reference alone, never on the engine judged."""

from __future__ import annotations

import numpy as np

# bf16 on an MoE model: a position is at a routing near-tie when the float32 reference's routing margin there
# (the smallest gap over the MoE layers between the k-th and (k+1)-th router choice scores) is below this factor
# times the largest move the reference's own bf16 recipe makes to that margin in the same run (measured on the
# reference alone). benchmarks/calibrate_routing.py, 32 prompts x 32 tokens: the recipe moves the
# margin by up to 0.016 (mini-moe) and 0.045 (mini-gptoss), and its own token flips sat at margins <= 0.0041
# (mini-moe) and <= 0.06 (mini-gptoss). 1.5x, as the per-position bf16 bounds: another bf16 engine rounds
# differently from the recipe. float32 (compare/flip.py) takes the same factor over the reference's own float32 move
# (its other reduction orders against it): mini-kimi's synthetic-prefix-4, the order move up to 4.7e-5, the token
# the reference in another batch routed the other way at a margin of 1.5e-6; mini-moe's quick set, 1.4e-6 to 7.4e-6.
ROUTING_TIE_FACTOR = 1.5


def routing_move(margins_a: np.ndarray, experts_a: np.ndarray, margins_b: np.ndarray,
                 experts_b: np.ndarray) -> np.ndarray:
    """How far rounding alone moves the router: run b's change of each MoE layer's k-th to (k+1)-th gap from run
    a's, largest over the layers, at the positions before b first chose other experts than a anywhere
    (margins [M, T], experts [M, T, k]). From that position on the two runs' states differ by a changed
    expert mix, not by rounding (on mini-moe's quick set, counting crossed gaps, the move reached 0.11 after a
    flip; before any flip rounding moved the gaps by at most 0.036), so those positions are left out."""
    same = (np.asarray(experts_a) == np.asarray(experts_b)).all(axis=-1).all(axis=0)  # [T]
    first = int(np.argmin(same)) if not same.all() else same.size
    d = np.abs(np.asarray(margins_a, np.float64) - np.asarray(margins_b, np.float64))
    return d[:, :first].max(axis=0) if first else np.zeros(0)


def routing_ties(per_prompt: list[dict], margins: dict[int, tuple[np.ndarray, np.ndarray]],
                 moved: float | None = None, witness: dict[int, list[int]] | None = None) -> dict:
    """bf16 on an MoE model: real positions where the reference's routing is near-tied are taken out of the
    real ones (per_prompt records are edited: "routing_ties" lists them) and reported as not judged: a correct
    bf16 engine may pick other experts there, and the output then moves far (a different expert's MLP), so
    neither a PASS nor a FAIL can rest on them. margins: prompt index -> (float32 margins at each compared
    position, the bf16 recipe's routing_move on that prompt's sequence). The bound is ROUTING_TIE_FACTOR x the
    recipe's largest move, here or over a larger set the caller measured (moved: benchmarks/detection.py
    judges prompt by prompt). A flip also moves every later position through attention, so witness (prompt
    index -> positions where the reference's own bf16 recipe is beyond the bounds) names positions taken out
    too: there bf16 rounding of the reference itself, measured without the engine, already fails."""
    if moved is None:
        moved = max((float(np.max(mv)) for _, mv in margins.values() if len(mv)), default=0.0)
    bound = ROUTING_TIE_FACTOR * moved
    tied = {i: np.asarray(a) < bound for i, (a, _) in margins.items()}
    witness = witness or {}
    out, prompts, witnessed = 0, 0, 0
    for i, t in tied.items():
        r = per_prompt[i]
        near = {j for j in r["real_positions"] if j < len(t) and t[j]}
        ex = near | (set(r["real_positions"]) & set(witness.get(i, ())))
        witnessed += len(ex - near)
        r["routing_ties"] = sorted(ex)
        if not ex:
            continue
        out, prompts = out + len(ex), prompts + 1
        for key in ("real_positions", "token_mismatches", "distribution_mismatches"):
            r[key] = [j for j in r[key] if j not in ex]
        fd = r["first_divergence"]
        if fd and fd["position"] in ex and fd["class"] == "real":
            fd["class"] = "routing-tie"
    positions = sum(len(t) for t in tied.values())
    share = sum(int(t.sum()) for t in tied.values()) / max(positions, 1)
    note = (f"{out} positions in {prompts} prompts differ beyond the bounds where the reference's expert choice is "
            f"near-tied (k-th vs (k+1)-th router score within {bound:.3g}, {ROUTING_TIE_FACTOR}x the largest move "
            f"its own bf16 recipe makes to that gap here; {share:.0%} of positions are that close)"
            + (f" or, for {witnessed} of them, where the reference's own bf16 recipe is beyond the bounds too (after "
               "an expert flip upstream)" if witnessed else "")
            + ": a correct bf16 engine may route them to other experts, so they are not judged")
    return {"bound": bound, "recipe_max_dmargin": moved, "factor": ROUTING_TIE_FACTOR, "tied_share": share,
            "positions_not_judged": out, "witnessed": witnessed, "prompts": prompts, "note": note, "tied": tied}


def routing_margins(ref, recipe, prompt, track) -> tuple[np.ndarray, np.ndarray]:
    """(margins, moves): the float32 reference's routing margin (engines.reference.model.routing_margin,
    smallest over the MoE layers) at each position that predicts a token of track, and how far its bf16
    recipe's rounding moves the router on the whole sequence, prompt included (routing_move); one
    teacher-forced forward each."""
    seq = list(prompt) + list(track[:-1])
    a, b = ref.score([seq], want_taps=True)[0], recipe.score([seq], want_taps=True)[0]
    return (a.routing_margins[len(prompt) - 1:],
            routing_move(a.routing_layers, a.routing_experts, b.routing_layers, b.routing_experts))


def largest_move(margins: dict) -> float | None:
    """bf16 on an MoE model: the largest move the reference's bf16 recipe made to a routing margin (margins: prompt
    -> (margins, moves), as routing_margins gives them); None where there are none (no MoE, or float32)."""
    if not margins:
        return None
    return max((float(np.max(mv)) for _, mv in margins.values() if len(mv)), default=0.0)
