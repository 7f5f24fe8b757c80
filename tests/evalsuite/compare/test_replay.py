"""The routing replay (evalsuite/compare/replay.py): positions at the reference's routing near-ties judged with the
engine's own expert choice replayed in the reference. PASS where the megakernel's choice and logits are explained
by bf16 rounding, FAIL where its reported choice is beyond a near-tie or its logits are off under its own routing,
and not judged (INCONCLUSIVE) where the engine reports no routing."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engines.errors import ModelError
from evalsuite.compare import replay, rule
from evalsuite.models import load_model
from evalsuite.plugins import judge, make_engine

GOLDEN = Path(__file__).resolve().parents[3] / "golden"
# mini-kimi-linear's golden arith-add: the faithful bf16 megakernel (as the reference's own recipe) flips an expert
# upstream of positions 10 and 18, where its KL from the float32 reference is 1.98 and 1.97 (measured; 8e-4 and
# 2.8e-3 with its routing replayed)
TIED = (10, 18)


@pytest.fixture(scope="module")
def parts():
    model = load_model("mini-kimi-linear")
    ent = json.loads((GOLDEN / "mini-kimi-linear.json").read_text())["entries"]["arith-add"]
    eng = make_engine("megakernel", model, "bfloat16", None, {})
    ref, recipe = judge(model), judge(model, "bfloat16", recipe=eng.recipe)
    got = eng.forced_routing([ent["prompt_token_ids"]], [ent["token_ids"]], 5, want_logits=True)[0]
    return model, ent, ref, recipe, got


class _Reports:
    """An engine that reports the given forced_routing records (a real run's, edited to stand for a bug)."""

    def __init__(self, records, routing=True):
        self.records = records
        self.capabilities = type("Caps", (), {"routing": routing})()

    def forced_routing(self, prompts, continuations, k, want_logits):
        return self.records


def _rec():
    return {"routing_ties": list(TIED), "real_positions": [], "token_mismatches": [], "first_divergence": None}


def _run(parts, got, routing=True, orders=None):
    model, ent, ref, recipe, _ = parts
    rec = _rec()
    ties = {"bound": 0.03, "positions_not_judged": len(TIED)}  # routing.py's on this golden file: 0.0338
    left = replay.judge_ties(ref, recipe, _Reports([got], routing), [ent["prompt_token_ids"]], [ent["token_ids"]],
                             [rec], rule.Tolerances.for_dtype("bfloat16"), ties, orders)
    return rec, ties, left


def test_the_reference_replays_its_own_choice_exactly(parts):
    model, ent, ref, _, got = parts
    seq = list(ent["prompt_token_ids"]) + list(ent["token_ids"][:-1])
    own = ref.score([seq], want_taps=True)[0]
    again = ref.score([seq], experts=[own.routing_experts])[0]
    assert np.array_equal(own.logits, again.logits) and (again.routing_gaps <= 0).all()
    assert got.routing.shape == (model.config.n_moe_layers, len(seq), model.config.top_k)
    assert (got.routing != own.routing_experts).any(), "the engine's bf16 run should flip an expert here"
    with pytest.raises(ModelError, match=r"must be \[3, 32, 2\]"):
        ref.score([seq], experts=[own.routing_experts[:, :5]])


def test_pass_the_faithful_engines_flips_are_explained_by_its_routing(parts):
    rec, ties, left = _run(parts, parts[4])
    assert rec["routing_replay"]["cleared"] == list(TIED) and rec["real_positions"] == [] and left is None
    assert ties["replay"]["run"] and ties["replay"]["engine_flips"] >= 1


def test_fail_logits_off_under_the_engines_own_routing(parts):
    got = parts[4]
    logits = got.logits.copy()
    logits[TIED[0], np.argsort(logits[TIED[0]])[-2]] += 2.0  # the runner-up moved at the first tied position
    rec, ties, left = _run(parts, replace(got, logits=logits))
    assert rec["real_positions"] == [TIED[0]] and rec["routing_replay"]["beyond_tie"] == [] and left is None


def test_fail_a_reported_choice_no_rounding_could_make(parts):
    model, ent, ref, _, got = parts
    seq = list(ent["prompt_token_ids"]) + list(ent["token_ids"][:-1])
    t = len(ent["prompt_token_ids"]) - 1 + 2  # a token before both tied positions
    own = ref.score([seq], experts=[got.routing])[0]
    # the engine reports, at MoE layer 0 and token t, the pair of experts its replayed router likes least
    pairs = [(a, b) for a in range(model.config.n_experts) for b in range(a + 1, model.config.n_experts)]
    gaps = []
    for pair in pairs:
        r = got.routing.copy()
        r[0, t] = pair
        gaps.append(ref.score([seq], experts=[r])[0].routing_gaps[0, t])
    routing = got.routing.copy()
    routing[0, t] = pairs[int(np.argmax(gaps))]
    rec, ties, left = _run(parts, replace(got, routing=routing))
    assert own.routing_gaps.max() < ties["replay"]["tie_bound"] < max(gaps)  # its real choice within, this beyond
    assert rec["routing_replay"]["beyond_tie"] == list(TIED) and rec["real_positions"] == list(TIED)
    assert rec["routing_replay"]["neither_choice"] >= 1


def test_inconclusive_without_a_routing_report(parts):
    rec, ties, left = _run(parts, parts[4], routing=False)
    assert "routing_replay" not in rec and rec["real_positions"] == []
    assert left is not None and "does not report its expert choices" in left and not ties["replay"]["run"]
    err = ModelError("the server gives no routing")
    rec, ties, left = _run(parts, err)  # a report that failed: said, not judged
    assert rec["routing_replay"] == {"run": False, "why": str(err), "positions": list(TIED)}
    assert "the server gives no routing" in left


def test_the_recipes_other_orders_widen_the_replay_as_they_widen_the_witness(parts):
    """Where the engine's logits stay beyond the one replayed recipe's error, the recipe in other reduction orders
    (witness.OrderSpread), each with the engine's experts forced, is the witness as well: an order as far off as
    the engine clears the position; orders no farther off than the recipe leave it real."""
    from types import SimpleNamespace

    from evalsuite.compare.witness import ORDER_SEEDS, OrderSpread

    _, ent, _, recipe, got = parts
    j, P = TIED[0], len(ent["prompt_token_ids"])
    logits = got.logits.copy()
    logits[j, np.argsort(logits[j])[-2]] += 2.0  # the runner-up moved at the first tied position
    seq = list(ent["prompt_token_ids"]) + list(ent["token_ids"][:-1])
    seen = []

    class Order:
        def __init__(self, shift):
            self.shift = shift

        def score(self, seqs, want_taps=False, experts=None):
            seen.append(experts is not None and np.array_equal(experts[0], got.routing))
            x = np.array(recipe.score(seqs, experts=experts)[0].logits, np.float64)
            x[P - 1 + j, np.argsort(x[P - 1 + j])[-2]] += self.shift
            return [SimpleNamespace(logits=x)]

    for shift, real in ((2.5, []), (0.0, [j])):
        rec, _, _ = _run(parts, replace(got, logits=logits), orders=OrderSpread(lambda seed, s=shift: Order(s)))
        assert rec["real_positions"] == real and rec["routing_replay"]["other_orders"]["run"], (shift, rec)
    assert len(seen) == 2 * len(ORDER_SEEDS) and all(seen)
    assert len(seq) == got.routing.shape[1]
