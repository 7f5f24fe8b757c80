"""float32 routing near-ties (evalsuite/compare/flip.py): a flagged prompt whose first flag is at or after a token the
reference routes on a near-tie is judged again against the reference run on the other side of that tie. PASS where
the engine is that other side (a correct engine that rounded the other way), FAIL where it flipped a token no rounding
could (or flags stand on a prompt with no near-tie), and the flags stand, said, where the bound cannot be measured."""

from __future__ import annotations

import numpy as np
import pytest

from engines.base import FREE_EXPERTS as FREE
from engines.base import OTHER_EXPERTS as OTHER
from engines.base import Forced
from engines.errors import ModelError
from evalsuite.compare import flip, rule, witness
from evalsuite.models import load_model
from evalsuite.plugins import judge

TOL = rule.Tolerances.for_dtype("float32")
N = 12


@pytest.fixture(scope="module")
def parts():
    model = load_model("mini-moe")
    ref = judge(model)
    prompt = model.tokenizer.encode("The three primary colors are")
    rg = ref.generate([prompt], N, top_k=5, want_logits=True)[0]
    seq = list(prompt) + list(rg.token_ids[:-1])
    base = ref.score([seq], want_taps=True)[0]
    return model, ref, prompt, rg, seq, base


def _flipped(parts, token: int) -> Forced:
    """The reference with `token`'s most tied MoE layer on the other side of its near-tie: an engine's record."""
    _, ref, prompt, rg, seq, base = parts
    layers = np.asarray(base.routing_layers)
    experts = np.full((*layers.shape, base.routing_experts.shape[-1]), FREE, np.int32)
    experts[int(np.argmin(layers[:, token])), token] = OTHER
    got = ref.score([seq], experts=[experts])[0]
    P = len(prompt)
    return Forced.from_logits(got.logits[P - 1:P - 1 + N], rg.token_ids, 5), got


class _Moves:
    """The orders' cap reached, the run's largest move so far given: flip.py's bound without 4 permuted copies."""

    def __init__(self, moved):
        self.moves, self.stood = [moved], 0

    def tapped(self, seq):
        raise ModelError("past the cap")


def _judged(parts, fo, orders):
    _, ref, prompt, rg, _, _ = parts
    rec = rule.compare_prompt(rg.token_ids, rg.track(), fo, None, TOL)
    assert rec["real_positions"], "the flip moved nothing past the float32 bounds: the test would show nothing"
    return witness.with_witness(ref, witness.Flagged(prompt, rg, fo, None, rec), TOL, [], orders)


def test_free_and_other_forced_rows_are_the_routers_own_choice_and_the_other_side_of_its_tie(parts):
    _, ref, prompt, rg, seq, base = parts
    layers = np.asarray(base.routing_layers)
    free = ref.score([seq], experts=[np.full((*layers.shape, base.routing_experts.shape[-1]), FREE, np.int32)])[0]
    assert np.array_equal(free.logits, base.logits)  # every token routed freely: the reference itself, bit for bit
    assert (np.asarray(free.routing_gaps) <= 0).all()
    t = len(prompt) + 2
    _, got = _flipped(parts, t)
    m = int(np.argmin(layers[:, t]))
    gaps = np.asarray(got.routing_gaps)
    # the forced set is the other side: its gap is the margin it crossed, and every other choice is the router's own
    assert gaps[m, t] == pytest.approx(layers[m, t], rel=1e-5) and gaps[m, t] > 0
    assert (np.delete(gaps.reshape(-1), m * gaps.shape[1] + t) <= 0).all()


def test_an_engine_on_the_other_side_of_the_smallest_tie_passes_and_one_flipped_elsewhere_fails(parts):
    _, _, prompt, rg, _, base = parts
    P = len(prompt)
    margins = np.asarray(base.routing_margins, np.float64)[P - 1:P - 1 + N]
    tie = P - 1 + int(np.argmin(margins))  # the generation's most tied token
    fo, _ = _flipped(parts, tie)
    moved = 1.0 * base.routing_margins[tie]  # bound 1.5x the smallest margin: within it
    out = _judged(parts, fo, _Moves(moved))
    assert out["real_positions"] == [] and out["routing_flip"]["run"] and out["routing_flip"]["token"] == tie
    # the same engine where the reference's own rounding moves a margin less: no near-tie there, the flags stand
    orders = _Moves(0.5 * base.routing_margins[tie])
    out = _judged(parts, fo, orders)
    assert out["real_positions"] and not out["routing_flip"]["run"] and "no routing near-tie" in out["routing_flip"][
        "why"] and orders.stood == 1
    # a later prompt of a run whose flags stood is not tried
    out = _judged(parts, fo, orders)
    assert out["real_positions"] and "not tried" in out["routing_flip"]["why"]
    # the engine flipped at the generation's least tied token (no rounding makes that): the witness flips the most
    # tied token at or before its first flag, which does not explain it
    far = P - 1 + int(np.argmax(margins))
    fo, _ = _flipped(parts, far)
    out = _judged(parts, fo, _Moves(10.0 * float(margins.max())))  # even with a bound that admits every token
    assert out["real_positions"] and out["routing_flip"]["token"] != far


def test_without_other_orders_the_bound_is_not_measured_and_the_flags_stand(parts):
    _, _, prompt, _, _, base = parts
    P = len(prompt)
    tie = P - 1 + int(np.argmin(np.asarray(base.routing_margins)[P - 1:P - 1 + N]))
    fo, _ = _flipped(parts, tie)
    out = _judged(parts, fo, None)
    assert out["real_positions"] and not out["routing_flip"]["run"]
    assert "no other reduction order" in out["routing_flip"]["why"]


def test_the_bound_is_measured_on_the_reference_in_other_orders(parts):
    model, _, prompt, _, _, base = parts
    P = len(prompt)
    tie = P - 1 + int(np.argmin(np.asarray(base.routing_margins)[P - 1:P - 1 + N]))
    fo, _ = _flipped(parts, tie)
    orders = witness.OrderSpread(lambda seed: judge(model, "float32", order_seed=seed), model.weights.nbytes)
    out = _judged(parts, fo, orders)["routing_flip"]
    assert out["recipe_max_dmargin"] > 0 and orders.moves == [out["recipe_max_dmargin"]]
    assert out["bound"] == pytest.approx(flip.ROUTING_TIE_FACTOR * out["recipe_max_dmargin"])
    assert out["run"] == (out["smallest_margin"] < out["bound"])
