"""The judge scoring the engine's answers (bench.scoring): its answer is its own greedy answer whatever the engine
answered, the prefill path it scores with agrees with its decode path, and the parity part's verdict paths."""

from __future__ import annotations

import numpy as np
import pytest

from engines.base import Generation
from evalsuite.bench.scoring import TIE_GUARD, Answer, judge_answers, judge_item
from evalsuite.compare import rule

N = 12


@pytest.fixture(scope="module")
def judge(mini_llama):
    from evalsuite.plugins import judge

    return judge(mini_llama)


@pytest.fixture(scope="module")
def prompts(mini_llama):
    rng = np.random.default_rng(7)
    V = mini_llama.config.vocab_size
    head = [int(t) for t in rng.integers(0, V, 40)]  # a shared prefix, as lm-eval's few-shot exemplars
    return [head + [int(t) for t in rng.integers(0, V, n)] for n in (3, 11, 6, 25)] + \
        [[int(t) for t in rng.integers(0, V, 9)]]


def test_score_topk_agrees_with_the_decode_path(judge, prompts, mini_llama):
    rng = np.random.default_rng(1)
    conts = [[int(t) for t in rng.integers(0, mini_llama.config.vocab_size, n)] for n in (1, 9, 30, 4, 0)]
    before = judge.path_log().snapshot()["counts"].get("shared_prefix", 0)
    a = judge.score_topk(prompts[:4], conts[:4], 5)  # the four rows sharing a 40-token prefix
    assert judge.path_log().snapshot()["counts"]["shared_prefix"] == before + 1
    b = judge.forced_topk(prompts[:4], conts[:4], 5)
    for x, y, c in zip(a, b, conts):
        assert x.top_ids.shape == (len(c), 5)
        # the float32 floor between the reference's two paths (docs/rule.md) is 1.91e-4; the rule's bound is 8e-4
        assert np.abs(x.top_logprobs - y.top_logprobs).max() < rule.DLOGIT_TOL["float32"]
        assert np.abs(x.token_logprobs - y.token_logprobs).max() < rule.DLOGIT_TOL["float32"]
        clear = x.top_logprobs[:, 0] - x.top_logprobs[:, 1] > TIE_GUARD
        assert (x.top_ids[clear, 0] == y.top_ids[clear, 0]).all()
    mixed = judge.score_topk(prompts, conts, 5)  # no prefix shared by all five: each row prefilled whole
    assert len(mixed[4].token_logprobs) == 0
    for x, y in zip(mixed[:4], a):
        assert np.abs(x.top_logprobs - y.top_logprobs).max() < rule.DLOGIT_TOL["float32"]


def _answers(prompts, gens, edit) -> list[Answer]:
    return [Answer(p, edit(list(g.token_ids)), g.finish_reason) for p, g in zip(prompts, gens)]


@pytest.mark.parametrize("case", ["own", "one token changed", "stopped early", "went on", "empty"])
def test_the_judges_answer_is_its_own_greedy_answer(judge, prompts, mini_llama, case):
    """Whatever the engine answered, judge_answers returns exactly what the judge's own greedy decoding gives, and
    decodes only from where the engine's answer parts from it."""
    V = mini_llama.config.vocab_size
    own = judge.generate(prompts, N, top_k=5)
    edits = {"own": lambda t: t, "one token changed": lambda t: t[:5] + [(t[5] + 1) % V] + t[6:],
             "stopped early": lambda t: t[:4], "went on": lambda t: t, "empty": lambda t: []}
    stop_ids, check = (), None
    if case == "went on":  # the judge stops at the 3rd token's text; the engine did not
        stop_ids = ()
        check = lambda ids: len(ids) >= 3  # noqa: E731 (a stop check as engines take it)
    want = judge.generate(prompts, N, top_k=5, stop_ids=stop_ids, stop_check=check)
    got = judge_answers(judge, _answers(prompts, own, edits[case]), N, stop_ids, check, 5)
    for g, w in zip(got, want):
        assert g.generation.token_ids == w.token_ids and g.generation.finish_reason == w.finish_reason
        if case == "own":
            assert g.decoded_from is None or g.why == "near-tie"
        if case == "one token changed":
            assert g.decoded_from is not None and g.decoded_from <= 5 and g.decoded <= N - g.decoded_from
        if case == "stopped early":
            assert g.decoded_from is not None and g.decoded_from <= 4
        if case == "went on":
            assert len(g.generation.token_ids) == 3
            assert g.why == "engine went past the stop" or g.decoded_from is not None
        if case == "empty":
            assert g.decoded_from == 0 and g.decoded == N


@pytest.mark.parametrize("case", ["own", "one token changed"])
def test_every_position_decided_by_a_decode_step(judge, prompts, mini_llama, monkeypatch, case):
    """With TIE_GUARD past every gap, every position after the first is a near-tie a decode step decides: the judge's
    answers are still exactly its own greedy answers, and it decodes no more than where the engine's answer parts."""
    from evalsuite.bench import scoring

    monkeypatch.setattr(scoring, "TIE_GUARD", 1e9)
    V = mini_llama.config.vocab_size
    own = judge.generate(prompts, N, top_k=5)
    edit = (lambda t: t) if case == "own" else (lambda t: t[:5] + [(t[5] + 1) % V] + t[6:])
    got = judge_answers(judge, _answers(prompts, own, edit), N, (), None, 5)
    for g, w in zip(got, own):
        assert g.generation.token_ids == w.token_ids
        assert g.near_ties == (N - 1 if case == "own" else 5)  # positions 1..N-1, or 1..5 where it parted
        assert (g.decoded, g.decoded_from) == ((0, None) if case == "own" else (N - 5, 5))


def _judge_gen(judge, prompt, n=N, **kw) -> Generation:
    return judge.generate([prompt], n, top_k=5, **kw)[0]


def _clear_position(g: Generation) -> int:
    """A position where the judge's top-1 leads its top-2 by more than the rule's noise bound (a flip there is real)."""
    gaps = g.top_logprobs[:, 0] - g.top_logprobs[:, 1]
    return int(np.flatnonzero(gaps > 10 * rule.NOISE_TOL["float32"])[0])


def test_parity_of_one_item(judge, prompts):
    tol = rule.Tolerances.for_dtype("float32")
    g = _judge_gen(judge, prompts[1])
    same = Answer(g.prompt_ids, list(g.token_ids), g.finish_reason, g.top_ids, g.top_logprobs)
    rec = judge_item(judge, same, g, tol, [])
    assert rec["real_positions"] == [] and rec["first_divergence"] is None
    j = _clear_position(g)
    flipped = list(g.token_ids)
    flipped[j] = int(g.top_ids[j, 1])  # the judge's runner-up, far from a tie: a real token mismatch at j
    rec = judge_item(judge, Answer(g.prompt_ids, flipped, "length", g.top_ids, g.top_logprobs), g, tol, [])
    assert j in rec["token_mismatches"] and rec["first_divergence"]["position"] == j
    lps = np.array(g.top_logprobs)
    lps[2, 0] += 0.01  # the same tokens, one logprob off by 6x the bound: a distribution mismatch at 2
    witnessed: list = []
    rec = judge_item(judge, Answer(g.prompt_ids, list(g.token_ids), "length", g.top_ids, lps), g, tol, witnessed)
    assert rec["distribution_mismatches"] == [2] and witnessed and witnessed[0]["run"]  # the float64 witness ran
    stopped = _judge_gen(judge, prompts[1], stop_check=lambda ids: len(ids) >= 4)
    went_on = Answer(g.prompt_ids, list(g.token_ids), "length", g.top_ids, g.top_logprobs)
    assert 3 in judge_item(judge, went_on, stopped, tol, [])["token_mismatches"]  # no stop where the judge stops
    short = Answer(g.prompt_ids, list(g.token_ids[:5]), "stop", g.top_ids[:5], g.top_logprobs[:5])
    assert judge_item(judge, short, g, tol, [])["real_positions"] == [5]  # ended where the judge went on
    cut = judge_item(judge, short, g, tol, [], visible=lambda ids: "same text")  # its server cut a stop string
    assert cut["real_positions"] == [] and "stop string" in cut["note"]


def _records(n: int, real_at: int | None = None, missing_at: int | None = None) -> tuple[list, list]:
    judge, eng = [], []
    for i in range(n):
        base = {"doc_id": i, "correct": True, "response": "4", "extracted": "4", "generated_tokens": 8,
                "finish_reason": "stop"}
        judge.append(base | {"scored_tokens": 8, "decoded_tokens": 0, "decoded_from": None, "scoring": "agreed"})
        par = {"positions": 8, "real_positions": [], "token_mismatches": [], "distribution_mismatches": [],
               "benign_positions": [], "first_divergence": None, "max_dlogprob": 1e-5, "witness": None}
        if i == real_at:
            par |= {"real_positions": [3], "token_mismatches": [3],
                    "first_divergence": {"position": 3, "engine_token": 7, "reference_token": 9, "class": "real"}}
        if i == missing_at:
            par = {"not_checked": "the server returned text whose ids could not be recovered exactly"}
        eng.append(base | {"parity": par})
    return judge, eng


@pytest.mark.parametrize("case,judged,want", [("clean", True, "PASS"), ("real", True, "FAIL"),
                                              ("missing", True, "INCONCLUSIVE"), ("real", False, "PASS")])
def test_parity_enters_the_verdict(case, judged, want):
    """The accuracy verdict alone would PASS (200 items, nothing discordant); the parity part makes a real mismatch a
    FAIL and an item it could not compare an INCONCLUSIVE, where the engine claims the judge's numerics; an engine
    declaring its own has its parity reported, not judged."""
    from evalsuite.bench.run import RunSpec, assemble

    j, e = _records(200, real_at=17 if case == "real" else None, missing_at=4 if case == "missing" else None)
    spec = RunSpec(task="gsm8k")
    ctx = {"dataset": {}, "weights_sha256": "x", "bundled": False, "n_items": 200,
           "api": {"not_checked": [], "parity": {"judged": judged, "why_not": None if judged else "Q8_0 weights"}}}
    r = assemble(spec, {"reference": {"records": j, "live_accuracy": None, "primary_filter": "x",
                                      "lm_eval_results": "x", "fingerprint": "a"},
                        "megakernel": {"records": e, "live_accuracy": None, "primary_filter": "x",
                                       "lm_eval_results": "x", "fingerprint": "b"}}, ctx, 1.0)
    assert r["paired"]["b"] == 0 and r["verdict"] == want
    pa = r["parity"]
    assert pa["judged"] == judged and pa["items"] == (199 if case == "missing" else 200)
    if case == "real":
        assert pa["items_failing"] == 1 and pa["first_failures"][0]["doc_id"] == 17
        assert pa["first_failures"][0]["position"] == 3 and ("parity" in r["failed_by"]) == judged
    if case == "missing":
        assert any("item 4" in n for n in r["not_checked"])
    assert r["judge_work"]["mode"] == "scores" and r["judge_work"]["judge_decoded"] == 0
