"""What kind of difference a float32 FAIL is: a lower-precision recipe (the reference's own bf16
recipe, a real one) reads "numeric-recipe"; a logic fault of the megakernel reads "beyond-noise"."""

from __future__ import annotations

import pytest

from engines.megakernel import MegakernelEngine
from engines.reference import ReferenceEngine
from evalsuite.compare import rule

N = 12


def _judge(model, engine) -> dict:
    ref = ReferenceEngine(model.weights, "float32")
    ps = [model.tokenizer.encode(t) for t in ("Hello there, friend.", "1 2 3 4 5", "The cat sat on")]
    rgen = ref.generate(ps, N, top_k=5, want_logits=True)
    egen = engine.generate(ps, N, top_k=5)
    forced = engine.forced_topk(ps, [g.token_ids for g in rgen], 5, want_logits=True)
    t32, t16 = rule.Tolerances.for_dtype("float32"), rule.Tolerances.for_dtype("bfloat16")
    recs, real16 = [], 0
    for rg, eg, fo in zip(rgen, egen, forced):
        recs.append(rule.compare_prompt(rg.token_ids, rg.track(), fo, eg, t32))
        real16 += len(rule.compare_prompt(rg.token_ids, rg.track(), fo, eg, t16)["real_positions"])
    real = sum(len(r["real_positions"]) for r in recs)
    return rule.character(recs, real, real16, t16)


def test_a_lower_precision_recipe_reads_as_numeric_recipe(mini_llama):
    c = _judge(mini_llama, ReferenceEngine(mini_llama.weights, "bfloat16"))
    assert c["kind"] == "numeric-recipe" and c["real_under_bfloat16_bounds"] == 0
    assert "not of a logic bug" in c["explanation"]


@pytest.mark.parametrize("fault", ["drop_layer", "rope_off_by_one"])
def test_a_logic_fault_reads_as_beyond_noise(mini_llama, fault):
    c = _judge(mini_llama, MegakernelEngine(mini_llama.weights, "float32", fault=fault))
    assert c["kind"] == "beyond-noise" and c["real_under_bfloat16_bounds"] > 0


def test_the_faithful_engine_reads_as_none(mini_llama):
    assert _judge(mini_llama, MegakernelEngine(mini_llama.weights, "float32"))["kind"] == "none"
