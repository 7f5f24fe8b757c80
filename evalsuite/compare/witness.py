"""The conditioning witness (rule.CONDITIONING): a prompt with flagged positions is judged again with the judge's
own error at each position, measured on the judge alone, never on the engine judged.

float32: the reference against its own math in float64 (ReferenceEngine.float64_logits); where flags survive
  that, the float32 reference in ORDER_SEEDS other reduction orders against the same float64 logits as well, the
  witness being the worst of them (the float32 order spread; on a TPU the host's CPU runs the float64 math). Where
  float64 cannot run at all, half the reference's spread over those orders (SPREAD_ONLY). On an MoE model, flags
  that stand are judged once more against the reference on the other side of a routing near-tie (compare/flip.py).
bfloat16: the reference's own bf16 recipe against the float32 reference, from the same teacher-forced pass the
  drift check uses: the quantity the bf16 bounds were set from (rule.py), taken at this position instead of as
  the worst over a calibration set. Where flags survive that, the same recipe in ORDER_SEEDS other reduction
  orders as well (OrderSpread), the witness being the worst of them.
Where the witness cannot run, the flags stand and the prompt is named as unwitnessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engines.base import Forced, Generation
from engines.errors import ModelError
from evalsuite.compare import flip, metrics, rule

# bfloat16: at an ill-conditioned position the recipe's own error depends on its reduction order, which XLA's
# tiling, the batch's shape or another kernel's tiling sets. At the two positions the 1,000-prompt false-alarm run
# left flagged under the one recipe (benchmarks/results/false-alarms-bfloat16.json, prompts 401-500 re-run
# whole): gen-0489-raw-repetition position 0, the recipe 4.36 from float32, the same recipe on weights with
# permuted hidden and MLP dimensions (seeds 1-4) 7.81 / 10.9 / 8.90 / 4.00, the faithful megakernel 7.77;
# gen-0429-raw-json position 9, the recipe's KL 1.6e-3, the worst with the four orders 1.06e-2, the megakernel
# 9.4e-3. One recipe run is one draw from that spread; four more put a correct engine's chance of exceeding all
# five at 1/6 (exchangeability) before the 1.5x factor. (In development, on the forced-decode path and a batch of 3,
# two orders, seeds 1-2, would have cleared gen-0429 by 0.5%, a hair, hence four.)
# float32: the same holds one level down. mini-kimi (Kimi K3's layers) at builtin gen-0135 position 3, the one
# position a faithful megakernel's float32 diff flagged: the reference 1.1e-4 from float64, the same reference on the
# permuted weights 5.5e-5 to 5.3e-4, the megakernel 3.2e-4 (routing near-ties in a latent MoE).
ORDER_SEEDS = (1, 2, 3, 4)
# float32: the other orders run for a prompt only where at most this many flags survive the float64 witness. Every
# float32 flag a faithful engine has raised was one isolated position a prompt (gen-0170, gen-0359, mini-kimi's);
# a bug flags run after run of them and needs no witness, and the orders cost 4 forwards and 4 permuted copies a
# prompt (a CI run went from 17 to 35 minutes with them run on every flagged prompt of the faulted diffs).
F32_ORDER_MAX_FLAGS = 2
# Prompts per run that get the other orders (len(ORDER_SEEDS) full forwards each, one order built at a time: 7-11 s a
# prompt on smollm2 with a GSM8K run on the cores): past it a prompt is judged by the one recipe, which can only
# leave more flags standing. The faithful megakernel had flags left by the one recipe on 2 of 1,000 prompts; a broken
# engine flags every prompt, and needs no witness.
ORDER_PROMPTS = 8
# Host bytes of weights under which the ORDER_SEEDS permuted judges are kept for the run instead of being permuted
# again for every prompt (1.7-2.8 s an order on smollm2, up to ORDER_PROMPTS x 4 times a run): smollm2's float32
# weights are 538 MB, so its four copies (2.2 GB) are kept on this 24 GiB machine; a model past it pays the rebuild.
ORDER_KEEP_BYTES = 3 << 30

WHAT = {"float32": "the reference's float32 math against its float64 math (where flags survive it, the worst of it "
                   f"and the same float32 math in {len(ORDER_SEEDS)} other reduction orders)",
        "bfloat16": "the reference's own bf16 recipe against the float32 reference (where flags survive it, the "
                    f"worst of it and the same recipe in {len(ORDER_SEEDS)} other reduction orders)"}


# float32 where float64 cannot run: the witness is the judge's own spread over ORDER_SEEDS (see _own_error)
SPREAD_ONLY = (f"half the reference's largest float32 |Δlogit| from itself in {len(ORDER_SEEDS)} other reduction "
               "orders (a quarter of the KL; no float64 here)")


def judge_error(ref, prompt, rg, recipe, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(|Δlogit|, KL) per position of the judge's own error in this dtype (see WHAT), and the logits it is measured
    against (float32: the float64 ones; bfloat16: the float32 reference's), which the other orders are measured
    against too. Raises ModelError where it cannot be measured."""
    if dtype == "float32":
        exact = ref.float64_logits(prompt, rg.token_ids)
        return *own_error(rg.logits, exact), exact
    if recipe is None or recipe.logits is None:
        raise ModelError("the reference's bf16 recipe gave no full logits for this prompt")
    return *own_error(recipe.logits, rg.logits), rg.logits


def _own_error(ref, case: Flagged, dtype: str, orders) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """judge_error's, and what it measured. float32 where float64 cannot run (a sharded or too large judge): the
    judge's own spread instead, SPREAD_ONLY, on a prompt with at most F32_ORDER_MAX_FLAGS flags."""
    try:
        return *judge_error(ref, case.prompt, case.rg, case.recipe, dtype), WHAT[dtype]
    except ModelError as e:
        flags = len(case.rec["real_positions"])
        if dtype != "float32" or orders is None or flags > F32_ORDER_MAX_FLAGS:
            raise
        why = e
    try:
        errs = orders.errors(case.prompt, case.rg.token_ids, case.rg.logits)
    except ModelError as e:
        raise ModelError(f"{why}; and no spread instead: {e}") from None
    # max|Δlogit| between the judge and another order is at most the sum of their distances from float64, so half the
    # largest is at most the larger of those, what the float64 witness with the orders takes: never wider than it
    # (KL, near a squared distance, a quarter: so approximately)
    return (np.maximum.reduce([d for d, _ in errs]) / 2, np.maximum.reduce([k for _, k in errs]) / 4,
            np.asarray(case.rg.logits, np.float64), SPREAD_ONLY)


def own_error(logits, against) -> tuple[np.ndarray, np.ndarray]:
    """(|Δlogit|, KL) per position of logits from `against` (the judge's better answer)."""
    own = np.abs(np.asarray(logits, np.float64) - np.asarray(against, np.float64)).max(-1)
    return own, metrics.kl(against, logits)


class OrderSpread:
    """The bf16 recipe in other reduction orders: build(seed) gives the reference's recipe on
    engines.weights.permuted(weights, seed) (evalsuite.plugins.judge), one at a time, for a teacher-forced full
    forward (Engine.score); run on at most ORDER_PROMPTS prompts of a run. weight_bytes: the model's; when the
    orders together take at most ORDER_KEEP_BYTES, each is built once and kept for the run, else dropped after
    its pass and built again for the next prompt."""

    def __init__(self, build, weight_bytes: int | None = None):
        self.build, self.prompts, self.kept = build, 0, {}
        self.moves: list[float] = []  # float32 routing moves measured on this run's prompts (compare/flip.py)
        self.stood = 0  # prompts whose flags stood after compare/flip.py was tried
        self.keep = weight_bytes is not None and weight_bytes * len(ORDER_SEEDS) <= ORDER_KEEP_BYTES

    def judge(self, seed: int):
        """The recipe in order `seed`: kept for the run when the orders fit ORDER_KEEP_BYTES, else built anew."""
        eng = self.kept.get(seed) or self.build(seed)
        if self.keep:
            self.kept[seed] = eng
        return eng

    def _count(self) -> None:
        if self.prompts >= ORDER_PROMPTS:
            raise ModelError(f"the other reduction orders run on at most {ORDER_PROMPTS} flagged prompts a run")
        self.prompts += 1

    def tapped(self, seq) -> list:
        """Each order's teacher-forced forward over seq with taps (its routing margins: compare/flip.py's float32
        near-tie bound). Raises ModelError past the cap."""
        self._count()
        return [self.judge(seed).score([list(seq)], want_taps=True)[0] for seed in ORDER_SEEDS]

    def errors(self, prompt, tokens, against, experts=None) -> list[tuple[np.ndarray, np.ndarray]]:
        """(|Δlogit|, KL) per position from `against` (judge_error's) for each seed of ORDER_SEEDS, along tokens
        (the reference's). experts (the routing replay): each MoE layer's expert choice forced,
        [M, len(prompt) + n - 1, k], as ReferenceEngine.score takes it. Raises ModelError past the cap."""
        self._count()
        n = len(tokens)
        seq = list(prompt) + [int(t) for t in (tokens if experts is None else tokens[:-1])]
        out = []
        for seed in ORDER_SEEDS:
            eng = self.judge(seed)
            # one full forward over prompt + the reference's tokens, the logits that predict each token (the score
            # path, a third order again: 0.1-1 s on smollm2 against 12-14 s decoding the 32 tokens forced; the
            # permuting, 1.7-2.8 s an order, is most of the cost; all with a GSM8K run on the cores)
            scored = eng.score([seq])[0] if experts is None else eng.score([seq], experts=[experts])[0]
            out.append(own_error(scored.logits[len(prompt) - 1:len(prompt) - 1 + n], against))
            del eng
        return out


@dataclass(frozen=True)
class Flagged:
    """One prompt with flagged positions, as the judge saw it: its prompt ids, the reference's generation rg, the
    engine teacher-forced (fo) and free-running (eg), compare_prompt's record of it, and how it was compared."""

    prompt: Sequence[int]
    rg: Generation
    fo: Forced | None
    eg: Generation | None
    rec: dict
    eos_ids: tuple = ()
    track: Forced | None = None  # the reference's record along rg (rg.track() when None)
    recipe: Forced | None = None  # bf16: the recipe teacher-forced along rg's tokens
    ends: bool = False


def with_witness(ref, case: Flagged, tol, witnessed: list, orders: OrderSpread | None = None) -> dict:
    """case.rec judged again under bounds widened by the judge's own error at each position (the conditioning
    witness), with what the witness measured under "conditioning"; a new record, case.rec unchanged. orders (bf16):
    the recipe's other reduction orders, run where flags survive the one recipe. witnessed: the run's log, one
    entry appended per call."""
    prompt, rg, fo, eg, rec, eos_ids, ends = case.prompt, case.rg, case.fo, case.eg, case.rec, case.eos_ids, case.ends
    flagged = rec["real_positions"]
    try:
        own, own_kl, against, measured = _own_error(ref, case, tol.dtype, orders)
    except ModelError as e:
        witnessed.append({"run": False, "why": str(e), "note": f"conditioning witness: not run ({e}); the flagged "
                          "positions may be ill-conditioned rather than wrong"})
        out = rule.PromptRecord(rec, rec.matched, rec.drift) if isinstance(rec, rule.PromptRecord) else dict(rec)
        out["conditioning"] = {"run": False, "why": str(e)}
        return out
    track = case.track or rg.track()
    again = rule.compare_prompt(rg.token_ids, track, fo, eg, tol, eos_ids=eos_ids, conditioning=(own, own_kl),
                                ends=ends)
    spread: dict = {"run": False, "why": "the judge's own error cleared every flagged position"}
    if again["real_positions"] and measured == SPREAD_ONLY:
        spread = {"run": False, "why": "the other orders are the witness itself here (no float64)"}
    elif again["real_positions"]:
        try:
            if orders is None:
                raise ModelError("no other reduction order was given to this run")
            if tol.dtype == "float32" and len(again["real_positions"]) > F32_ORDER_MAX_FLAGS:
                raise ModelError(f"{len(again['real_positions'])} float32 positions stay flagged, more than the "
                                 f"{F32_ORDER_MAX_FLAGS} isolated ones an ill-conditioned prompt has")
            errs = orders.errors(prompt, rg.token_ids, against)
        except ModelError as e:
            spread = {"run": False, "why": str(e)}
        else:
            spread = {"run": True, "seeds": list(ORDER_SEEDS), "dlogit": [e[0] for e in errs]}
            own = np.maximum.reduce([own, *(e[0] for e in errs)])
            own_kl = np.maximum.reduce([own_kl, *(e[1] for e in errs)])
            again = rule.compare_prompt(rg.token_ids, track, fo, eg, tol, eos_ids=eos_ids,
                                        conditioning=(own, own_kl), ends=ends)
    if tol.dtype == "float32" and again["real_positions"] and ref.config.n_moe_layers:
        again = flip.judge(ref, orders, case, again, tol, (own, own_kl))  # the other side of a routing near-tie
    bounds = rule.position_bounds(tol, len(own), (own, own_kl))
    at = {int(j): {"judge_own_dlogit": float(own[j]), "judge_own_kl": float(own_kl[j]),
                   "dlogit_bound": float(bounds["dlogit"][j]), "kl_bound": float(bounds["kl"][j]),
                   "still_flagged": j in again["real_positions"]} for j in flagged}
    for j in at if spread["run"] else ():  # each order's own |Δlogit| there
        at[j]["orders_dlogit"] = [float(d[j]) for d in spread["dlogit"]]
    again["conditioning"] = {"run": True, "measured": measured,
                             "cleared": sorted(set(flagged) - set(again["real_positions"])), "at": at,
                             "other_orders": {k: v for k, v in spread.items() if k != "dlogit"}}
    witnessed.append({"run": True, "flagged": len(flagged), "cleared": len(again["conditioning"]["cleared"]),
                      "max_judge_own_dlogit": float(own[flagged].max()), "other_orders": spread["run"],
                      "measured": measured,
                      "routing_flip": len((again.get("routing_flip") or {}).get("cleared", ()))})
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
            "prompts_with_other_orders": sum(w["other_orders"] for w in ran),
            "routing_flip_cleared": sum(w["routing_flip"] for w in ran),  # compare/flip.py
            "measured": "; ".join(dict.fromkeys(w.get("measured", WHAT[dtype]) for w in ran)) or WHAT[dtype],
            "rule": f"a flagged {dtype} position is bounded by max(DLOGIT_TOL, {f:g}e) and max(KL_TOL, {f * f:g}k), e "
                    f"and k the judge's own |Δlogit| and KL there ({WHAT[dtype]}; evalsuite/compare/rule.py)"}


class SecondLook:
    """A prompt the batching part flags, judged again as diff's main part judges its flagged prompts: the
    conditioning witness (the judge's own error at each position; in bf16 the recipe's, then its other orders),
    then, on a bf16 MoE model, real positions at the reference's routing near-ties taken out (routing.py; the
    bound from the main part's largest rounding move). What the recipe needs is computed here, on the reference."""

    def __init__(self, ref, recipe, orders: OrderSpread | None, tol, witnessed: list, moved: float | None):
        self.ref, self.recipe, self.orders, self.tol = ref, recipe, orders, tol
        self.witnessed, self.moved = witnessed, moved

    def __call__(self, prompt, tokens, track, eg, rec: dict) -> dict:
        from evalsuite.compare import routing

        rg = Generation(list(prompt), list(tokens), track.top_ids, track.top_logprobs, "stop", track.logits)
        rl = self.recipe.forced_topk([prompt], [list(tokens)], 5, want_logits=True)[0] if self.recipe else None
        rec = with_witness(self.ref, Flagged(prompt, rg, None, eg, rec, track=track, recipe=rl, ends=True), self.tol,
                           self.witnessed, self.orders)
        if rec["real_positions"] and self.moved is not None and len(tokens):
            margins = routing.routing_margins(self.ref, self.recipe, prompt, tokens)
            own = rule.compare_prompt(tokens, track, rl, None, self.tol)["real_positions"]
            ties = routing.routing_ties([rec], {0: margins}, self.moved, {0: own})
            if ties["positions_not_judged"]:
                rec["routing_note"] = ties["note"]
        return rec
