"""The conditioning witness (rule.CONDITIONING): a flagged position is judged against the judge's own error there
(float32: its distance from float64; bf16: its own bf16 recipe's distance from it), so an ill-conditioned
position no longer false-alarms, a real bug still FAILs, and where the witness cannot run the flags stand and the
report says so."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from engines.base import Forced
from engines.errors import ModelError
from evalsuite.compare.diff import DiffSpec, run_diff
from evalsuite.compare.rule import CONDITIONING_FACTOR, Tolerances, compare_prompt

# The float32 reference's largest |Δlogit| from its float64 math over 64 varied prompts, repetition prompts included
# (`benchmarks/calibrate_f64.py --prompts 64`): a typical position's own error.
F64_FLOOR = 1.93e-4


def _records(shift: float, flip: bool = False):
    """Reference logits over 4 positions and an engine whose position 2 moved by `shift` (a non-top logit), or
    (flip) took a token 3 nats below the reference's top-1 there."""
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 2, (4, 64))
    eng = ref + rng.normal(0, 1e-5, ref.shape)
    low = int(np.argsort(ref[2])[10])
    if flip:
        eng[2, low] = ref[2].max() + 1e-3
        eng[2, np.argmax(ref[2])] -= 3.0
    else:
        eng[2, low] += shift
    toks = ref.argmax(-1)
    return toks, Forced.from_logits(ref, toks, 5), Forced.from_logits(eng, toks, 5)


def _judge(shift, e_at_2, flip=False, dtype="float32", k_at_2=1e-9):
    toks, ref, eng = _records(shift, flip)
    e, k = np.full(4, 1e-4), np.full(4, 1e-9)
    e[2], k[2] = e_at_2 or 0.0, k_at_2
    cond = None if e_at_2 is None else (e, k)
    return compare_prompt(toks, ref, eng, None, Tolerances.for_dtype(dtype), conditioning=cond)["real_positions"]


def test_the_witness_widens_a_position_only_by_the_judges_own_error_there():
    assert _judge(2e-3, None) == [2]  # beyond DLOGIT_TOL (8e-4): flagged without a witness
    assert _judge(2e-3, 5e-3) == []  # the judge itself 5e-3 from float64 there: within 2e
    assert _judge(2e-3, 2e-3 / CONDITIONING_FACTOR["float32"] * 0.9) == [2]  # just short of the engine's move
    assert _judge(2e-3, 1e-4) == [2]  # a well-conditioned position keeps the float32 bound
    assert _judge(0.0, 5e-3, flip=True) == [2]  # a flip to a token 3 nats down is real whatever the conditioning


def test_in_bf16_the_witness_is_the_recipes_own_error_with_the_bf16_factor():
    f = CONDITIONING_FACTOR["bfloat16"]
    assert _judge(2.0, None, dtype="bfloat16") == [2]  # beyond DLOGIT_TOL (1.1): flagged without a witness
    assert _judge(2.0, 2.0 / f * 1.05, dtype="bfloat16", k_at_2=1.0) == []  # the recipe as far off there: cleared
    assert _judge(2.0, 2.0 / f * 0.9, dtype="bfloat16", k_at_2=1.0) == [2]  # |Δlogit| beyond f x the recipe's
    # a move of 4.0 (KL 2.7e-2, beyond KL_TOL 5.8e-3): the recipe as far off in |Δlogit| but not in KL
    assert _judge(4.0, 4.0, dtype="bfloat16", k_at_2=1e-4) == [2]
    assert _judge(4.0, 4.0, dtype="bfloat16", k_at_2=1.0) == []
    assert _judge(0.0, 0.9, flip=True, dtype="bfloat16", k_at_2=1.0) == [2]  # a flip 3 nats down is real


@pytest.mark.heavy  # 107 s; CI asserts the same of the same fault in test_float32_build (3 prompts, 6 tokens)
def test_a_bf16_diff_runs_the_witness_on_the_recipe_and_a_real_bug_still_fails(mini_llama):
    """mini-llama, real engines: kv_stale's flagged bf16 positions are judged again with the reference's own
    bf16 recipe's error there, and the bug still FAILs (its errors dwarf the recipe's)."""
    r = run_diff(DiffSpec(model="mini-llama", dtype="bfloat16", fault="kv_stale", prompts="quick", max_new_tokens=8,
                          float32_build=False, batching=False)).to_json()
    w = r["conditioning_witness"]
    assert r["verdict"] == "FAIL" and r["real_mismatches"] > 0
    assert w["run"] == w["prompts"] > 0 and "bf16 recipe" in w["measured"]
    assert w["positions_cleared"] < w["positions_flagged"]
    # the flags the recipe leaves are judged by its other reduction orders too (the permuted weights, real
    # engines), on at most ORDER_PROMPTS prompts, and the bug still FAILs
    from evalsuite.compare.witness import ORDER_PROMPTS

    assert 0 < w["prompts_with_other_orders"] <= ORDER_PROMPTS


@pytest.mark.heavy  # 16 s in CI's run
def test_where_the_witness_cannot_run_the_flags_stand_and_are_named(mini_llama, monkeypatch):
    import engines.reference.engine as ref_engine

    monkeypatch.setattr(ref_engine, "WITNESS_MAX_BYTES", 0)
    r = run_diff(DiffSpec(model="mini-llama", fault="drop_layer", prompts="quick", max_new_tokens=4,
                          batching=False)).to_json()
    assert r["verdict"] == "FAIL" and r["real_mismatches"] > 0
    w = r["conditioning_witness"]
    assert w["run"] == 0 and w["not_run"] == w["prompts"] > 0
    said = [n for n in r["not_checked"] if n.startswith("conditioning witness: not run (float64 weights would take")]
    assert len(said) == 1 and (w["not_run"] == 1 or said[0].endswith(f"({w['not_run']} prompts)")), said  # once


@pytest.mark.heavy  # 90 s: smollm2 on one prompt of the false-alarm set
def test_the_false_alarm_found_in_the_1000_prompts_is_cleared(smollm2, tmp_path):
    """gen-0170-raw-repetition: the faithful megakernel was 2.0e-3 from the reference at its first position
    (bound 8e-4, 1.1e-3 alone) because the reference itself is 5.7e-3 from float64 there. Later code moved
    both (alone: the megakernel 3.4e-4 from the reference, the reference 4.2e-3 from
    float64), so whether the position is flagged depends on the build and the batch: the test asserts the PASS,
    that a flag there is cleared, and that the position is still ill-conditioned."""
    from benchmarks.make_prompts import make
    from evalsuite.compare.witness import judge_error
    from evalsuite.plugins import judge
    from evalsuite.prompts import Prompt

    row = make(171, 0)[170]
    assert row["id"] == "gen-0170-raw-repetition"
    (tmp_path / "p.jsonl").write_text(json.dumps(row) + "\n")
    r = run_diff(DiffSpec(model="smollm2-135m", prompts=str(tmp_path / "p.jsonl"))).to_json()
    assert r["verdict"] == "PASS", r["per_prompt"][0]
    at = r["per_prompt"][0].get("conditioning")
    assert at is None or 0 in at["cleared"]
    ref = judge(smollm2)
    ids = Prompt(row["id"], row["kind"], text=row["text"]).encode(smollm2.tokenizer)
    rg = ref.generate([ids], 32, top_k=5, want_logits=True)[0]
    own = judge_error(ref, ids, rg, None, "float32")[0]
    assert own[0] > 10 * F64_FLOOR  # measured 4.2e-3, and 5.7e-3 with earlier code


@pytest.mark.heavy  # about 60 s: smollm2 bf16 on one prompt of the false-alarm set
def test_the_bf16_false_alarm_found_in_the_1000_prompts_is_cleared(smollm2, tmp_path):
    """gen-0020-raw-repetition: the faithful bf16 megakernel was 5.8-5.9 from the float32 reference at position
    16 (bound 1.1) and took another token there, because the reference's own bf16 recipe is about as far (5.7)."""
    from benchmarks.make_prompts import make

    row = make(21, 0)[20]
    assert row["id"] == "gen-0020-raw-repetition"
    (tmp_path / "p.jsonl").write_text(json.dumps(row) + "\n")
    r = run_diff(DiffSpec(model="smollm2-135m", dtype="bfloat16", prompts=str(tmp_path / "p.jsonl"),
                          float32_build=False)).to_json()
    at = r["per_prompt"][0]["conditioning"]
    assert r["verdict"] != "FAIL" and r["real_mismatches"] == 0, r["per_prompt"][0]
    assert 16 in at["cleared"] and at["at"][16]["judge_own_dlogit"] > Tolerances.for_dtype("bfloat16").dlogit


def test_the_bf16_logit_scale_check_passes_noise_fails_a_scale_error_and_says_when_it_cannot_run():
    """rule.scale_check on per-prompt slopes: the recipe's own spread sets the effect bound, so a shift that is
    significant but far under it (a large prompt set, a tiny legitimate bias) is not a FAIL."""
    from evalsuite.compare.rule import MIN_SCALE_PROMPTS, scale_check

    rng = np.random.default_rng(1)
    recipe = rng.normal(-2e-5, 8e-5, 32)  # mini-llama's recipe: mean -2.0e-5, sd 7.8e-5 (measured)
    faithful = recipe + rng.normal(0, 5e-6, 32)
    assert scale_check(faithful, recipe, "bfloat16")["ok"]
    bad = scale_check(faithful - 3.7e-3, recipe, "bfloat16")  # final_norm_eps's shift on mini-llama
    assert not bad["ok"] and bad["t"] < -6
    assert not scale_check(recipe - 3.7e-3, recipe, "bfloat16")["ok"]  # no spread at all: t is -inf, still FAIL
    tiny = scale_check(recipe + 2e-5 + rng.normal(0, 1e-7, 32), recipe, "bfloat16")  # significant, under the bound
    assert abs(tiny["t"]) > 6 and tiny["ok"]
    few = scale_check(faithful[:MIN_SCALE_PROMPTS - 1], recipe[:MIN_SCALE_PROMPTS - 1], "bfloat16")
    assert not few["checked"] and "needs full logits" in few["why"]
    assert not scale_check(faithful, recipe, "float32")["checked"]


class _Order:
    """A stand-in for the recipe in one other reduction order: its logits along the reference's tokens are given
    (the real ones come from engines.weights.permuted; test_a_bf16_diff_runs_the_witness... runs them)."""

    def __init__(self, logits, built):
        self.logits, self.built = logits, built

    def score(self, seqs):  # Engine.score: logits at every position of prompt + tokens (the prompt is 1 token here)
        self.built.append(1)
        assert len(seqs[0]) == len(self.logits) + 1
        return [type("Scored", (), {"logits": np.vstack([self.logits, self.logits[-1:]])})]


def test_in_bf16_flags_the_recipe_leaves_are_judged_by_its_other_reduction_orders():
    """witness.with_witness: where the one recipe leaves a flag, the worst of it and the other orders bounds the
    position; the orders are not built where the recipe clears everything, and past the cap the flags stand."""
    from engines.base import Forced as F
    from evalsuite.compare import witness

    toks, ref, eng = _records(2.0)  # the engine moved position 2 by 2.0 (bound 1.1)
    tol = Tolerances.for_dtype("bfloat16")

    class Gen:  # the reference's generation: tokens, full logits, its track
        token_ids, logits = list(toks), ref.logits

        def track(self):
            return ref

    def judged(recipe_shift, order_shift, spread):
        rec = compare_prompt(toks, ref, eng, None, tol)
        assert rec["real_positions"] == [2]
        recipe, order = np.array(ref.logits, float), np.array(ref.logits, float)
        low = int(np.argsort(ref.logits[2])[10])
        recipe[2, low] += recipe_shift
        order[2, low] += order_shift
        built: list = []
        spread.build = lambda seed: _Order(order, built)
        case = witness.Flagged([1], Gen(), eng, None, rec, recipe=F.from_logits(recipe, toks, 5))
        out = witness.with_witness(None, case, tol, [], spread)
        return out["real_positions"], out["conditioning"]["other_orders"], len(built)

    spread = witness.OrderSpread(None)
    # the recipe 0.5 off, another order 1.9 off: the engine's 2.0 is within 1.5 x 1.9 (KL alike): cleared
    assert judged(0.5, 1.9, spread) == ([], {"run": True, "seeds": list(witness.ORDER_SEEDS)},
                                        len(witness.ORDER_SEEDS))
    # every order as close as the recipe: the flag stands
    assert judged(0.5, 0.5, spread)[0] == [2]
    # the recipe itself 1.9 off: cleared without building any other order
    cleared = {"run": False, "why": "the judge's own error cleared every flagged position"}
    assert judged(1.9, 0.5, spread)[1:] == (cleared, 0)
    # past the cap (ORDER_PROMPTS prompts a run) the other orders are not run, and the flag stands
    spread.prompts = witness.ORDER_PROMPTS
    pos, other, built = judged(0.5, 1.9, spread)
    assert pos == [2] and not other["run"] and "at most" in other["why"] and built == 0


def test_the_other_orders_are_built_once_a_run_when_the_weights_are_small_enough():
    """witness.OrderSpread: under ORDER_KEEP_BYTES for all orders the permuted judges are kept across prompts
    (each seed built once); past it each prompt builds them again (memory over time)."""
    from evalsuite.compare import witness

    toks, ref, _ = _records(2.0)

    def builds(weight_bytes) -> list[int]:
        seeds: list[int] = []
        spread = witness.OrderSpread(lambda seed: seeds.append(seed) or _Order(np.array(ref.logits), []),
                                     weight_bytes)
        for _ in range(3):
            assert len(spread.errors([1], list(toks), ref.logits)) == len(witness.ORDER_SEEDS)
        return seeds

    assert builds(witness.ORDER_KEEP_BYTES // len(witness.ORDER_SEEDS)) == list(witness.ORDER_SEEDS)
    assert builds(witness.ORDER_KEEP_BYTES // len(witness.ORDER_SEEDS) + 1) == list(witness.ORDER_SEEDS) * 3
    assert builds(None) == list(witness.ORDER_SEEDS) * 3


def test_in_float32_flags_the_float64_witness_leaves_are_judged_by_other_reduction_orders():
    """float32: the reference's distance from its float64 math is one draw (its own order); where a flag survives
    it, the same float32 reference in other orders, each measured against the same float64 logits, bounds the
    position as well (mini-qwen-hybrid's gen-0359 position 3: the reference 1.3e-5 from float64, other orders up to
    2.1e-4)."""
    from evalsuite.compare import witness

    toks, ref, eng = _records(2e-3)  # the engine moved position 2 by 2e-3 (bound 8e-4)
    tol = Tolerances.for_dtype("float32")
    low = int(np.argsort(ref.logits[2])[10])
    exact = np.array(ref.logits, float)
    exact[2, low] += 1e-5  # the reference itself 1e-5 from float64 there: the f64 witness alone clears nothing

    class Judge:
        config = SimpleNamespace(n_moe_layers=0)  # a dense model: no routing near-tie to flip

        def float64_logits(self, prompt, tokens):
            return exact

    class Gen:
        token_ids, logits = list(toks), ref.logits

        def track(self):
            return ref

    def judged(order_shift):
        rec = compare_prompt(toks, ref, eng, None, tol)
        assert rec["real_positions"] == [2]
        order = exact.copy()
        order[2, low] += order_shift
        spread = witness.OrderSpread(lambda seed: _Order(order, []))
        out = witness.with_witness(Judge(), witness.Flagged([1], Gen(), eng, None, rec), tol, [], spread)
        return out["real_positions"], out["conditioning"]["other_orders"]["run"]

    assert judged(1.5e-3) == ([], True)  # another order 1.5e-3 from float64: 2 x 1.5e-3 covers the engine's 2e-3
    assert judged(1e-5) == ([2], True)  # every order as close as the reference: the flag stands


def test_in_float32_a_prompt_with_many_flags_gets_no_other_orders():
    """A bug flags run after run of positions; the float32 orders (4 forwards a prompt) run only where at most
    witness.F32_ORDER_MAX_FLAGS isolated flags survive the float64 witness."""
    from evalsuite.compare import witness

    toks, ref, _ = _records(0.0)
    moved = np.array(ref.logits, float)
    moved[:, int(np.argsort(ref.logits[0])[10])] += 2e-3  # every position moved past the bound
    eng = Forced.from_logits(moved, toks, 5)
    tol = Tolerances.for_dtype("float32")

    class Judge:
        config = SimpleNamespace(n_moe_layers=0)  # a dense model: no routing near-tie to flip

        def float64_logits(self, prompt, tokens):
            return np.array(ref.logits, float)

    class Gen:
        token_ids, logits = list(toks), ref.logits

        def track(self):
            return ref

    built: list = []
    rec = compare_prompt(toks, ref, eng, None, tol)
    assert len(rec["real_positions"]) > witness.F32_ORDER_MAX_FLAGS
    spread = witness.OrderSpread(lambda seed: _Order(np.array(ref.logits, float), built))
    out = witness.with_witness(Judge(), witness.Flagged([1], Gen(), eng, None, rec), tol, [], spread)
    assert out["real_positions"] == rec["real_positions"] and not built
    assert not out["conditioning"]["other_orders"]["run"] and "isolated" in out["conditioning"]["other_orders"]["why"]


def test_the_float32_factor_covers_correct_implementations_that_are_not_the_engine():
    """CONDITIONING_FACTOR["float32"] is set on correct float32 engines other than the one judged, at the positions
    where faithful engines were flagged (benchmarks/f32_paths.py): every path of the reference itself and each peer
    (transformers' own float32 code, where it was measured) must be within the factor of the witness from the
    judge's record, in |Δlogit| and in √KL; the old factor, 2, is not enough for them."""
    from pathlib import Path

    from evalsuite.roles import JUDGE

    root = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
    docs = [json.loads(f.read_text()) for f in sorted(root.glob("f32-paths-*.json"))]
    assert docs and any(d["peers"] for d in docs)
    worst = 0.0
    for d in docs:
        w = d["witness"]
        for r in d["rows"]:
            if r["engine"] == JUDGE or r["engine"] in d["peers"]:
                ratio = max(r["from_record_dlogit"] / w["dlogit"], (r["from_record_kl"] / w["kl"]) ** 0.5)
                assert ratio <= CONDITIONING_FACTOR["float32"], (d["model"], r)
                worst = max(worst, ratio)
    assert worst > 2.0  # measured 2.22 (transformers on mini-qwen-hybrid)


def test_where_float64_cannot_run_half_the_judges_own_order_spread_is_the_float32_witness():
    """On a TPU (no float64 matmul) the float32 witness is the reference's spread over its other reduction orders,
    halved (never wider than the float64 witness with the orders: the triangle inequality). PASS where an order is
    far enough off, FAIL where every order is as close as the reference, and the flags stand, said, on a prompt with
    more flags than an ill-conditioned one has."""
    from evalsuite.compare import witness

    toks, ref, eng = _records(2e-3)  # the engine moved position 2 by 2e-3 (bound 8e-4)
    tol = Tolerances.for_dtype("float32")
    low = int(np.argsort(ref.logits[2])[10])

    class Judge:
        config = SimpleNamespace(n_moe_layers=0)

        def float64_logits(self, prompt, tokens):
            raise ModelError("TPUs have no float64 matmul")

    class Gen:
        token_ids, logits = list(toks), ref.logits

        def track(self):
            return ref

    def judged(order_shift, rec=None):
        rec = rec or compare_prompt(toks, ref, eng, None, tol)
        order = np.array(ref.logits, float)
        order[2, low] += order_shift
        out = witness.with_witness(Judge(), witness.Flagged([1], Gen(), eng, None, rec), tol, [],
                                   witness.OrderSpread(lambda seed: _Order(order, [])))
        return out["real_positions"], out["conditioning"]

    got, cond = judged(1.5e-3)  # half of it, 7.5e-4, x 3 covers the engine's 2e-3
    assert got == [] and cond["measured"] == witness.SPREAD_ONLY
    assert judged(1e-3)[0] == [2]  # 3 x 5e-4 does not
    moved = np.array(ref.logits, float)
    moved[:, low] += 2e-3  # every position moved: a bug, not an ill-conditioned position
    rec = compare_prompt(toks, ref, Forced.from_logits(moved, toks, 5), None, tol)
    got, cond = judged(1.5e-3, rec)
    assert got == rec["real_positions"] and not cond["run"] and "float64" in cond["why"]
