"""The conditioning witness (rule.CONDITIONING): a prompt with flagged positions is judged again with the judge's
own error at each position, measured on the judge alone, never on the engine judged.

float32: the reference against its own math in float64 (ReferenceEngine.float64_logits).
bfloat16: the reference's own bf16 recipe against the float32 reference, from the same teacher-forced pass the
  drift check uses: the quantity the bf16 bounds were set from (rule.py), taken at this position instead of as
  the worst over a calibration set.
Where the witness cannot run, the flags stand and the prompt is named as unwitnessed.
"""

from __future__ import annotations

import numpy as np

from engines.errors import ModelError
from evalsuite.compare import metrics, rule

WHAT = {"float32": "the reference's float32 math against its float64 math",
        "bfloat16": "the reference's own bf16 recipe against the float32 reference"}


def judge_error(ref, prompt, rg, recipe, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(|Δlogit|, KL) per position of the judge's own error in this dtype (see WHAT). Raises ModelError where it
    cannot be measured."""
    if dtype == "float32":
        exact = ref.float64_logits(prompt, rg.token_ids)
        return np.abs(np.asarray(rg.logits, np.float64) - exact).max(-1), metrics.kl(exact, rg.logits)
    if recipe is None or recipe.logits is None:
        raise ModelError("the reference's bf16 recipe gave no full logits for this prompt")
    own = np.abs(np.asarray(recipe.logits, np.float64) - np.asarray(rg.logits, np.float64)).max(-1)
    return own, metrics.kl(rg.logits, recipe.logits)


def with_witness(ref, prompt, rg, fo, eg, tol, eos_ids, rec: dict, witnessed: list, track=None,
                 recipe=None) -> dict:
    """rec: compare_prompt's record of one prompt with flagged positions; returns it judged again under the
    widened bounds, with what the witness measured at each flagged position under rec["conditioning"]."""
    flagged = rec["real_positions"]
    try:
        own, own_kl = judge_error(ref, prompt, rg, recipe, tol.dtype)
    except ModelError as e:
        witnessed.append({"run": False, "why": str(e), "note": f"conditioning witness: not run ({e}); the flagged "
                          "positions may be ill-conditioned rather than wrong"})
        rec["conditioning"] = {"run": False, "why": str(e)}
        return rec
    again = rule.compare_prompt(rg.token_ids, track or rg.track(), fo, eg, tol, eos_ids=eos_ids,
                                conditioning=(own, own_kl))
    bounds = rule.position_bounds(tol, len(own), (own, own_kl))
    again["conditioning"] = {"run": True, "measured": WHAT[tol.dtype],
                             "cleared": sorted(set(flagged) - set(again["real_positions"])), "at": {
        int(j): {"judge_own_dlogit": float(own[j]), "judge_own_kl": float(own_kl[j]),
                 "dlogit_bound": float(bounds["dlogit"][j]), "kl_bound": float(bounds["kl"][j]),
                 "still_flagged": j in again["real_positions"]} for j in flagged}}
    witnessed.append({"run": True, "flagged": len(flagged), "cleared": len(again["conditioning"]["cleared"]),
                      "max_judge_own_dlogit": float(own[flagged].max())})
    return again


def summary(witnessed: list[dict], dtype: str) -> dict:
    """The run's witness: prompts witnessed, positions flagged and cleared, and the rule applied."""
    if not witnessed:
        return {"run": False, "why": f"no {dtype} position was flagged"}
    ran = [w for w in witnessed if w["run"]]
    f = rule.CONDITIONING_FACTOR[dtype]
    return {"prompts": len(witnessed), "run": len(ran), "not_run": len(witnessed) - len(ran),
            "positions_flagged": sum(w["flagged"] for w in ran),
            "positions_cleared": sum(w["cleared"] for w in ran),
            "max_judge_own_dlogit": max((w["max_judge_own_dlogit"] for w in ran), default=None),
            "measured": WHAT[dtype],
            "rule": f"a flagged {dtype} position is bounded by max(DLOGIT_TOL, {f:g}e) and max(KL_TOL, {f * f:g}k), e "
                    f"and k the judge's own |Δlogit| and KL there ({WHAT[dtype]}; evalsuite/compare/rule.py)"}
