"""The batching part of `diff` (evalsuite/compare/batching.py) and the comparator's every-rank and stop rules:
units on synthetic records, then the engine faults only the batching part sees, on mini-llama."""

from __future__ import annotations

import numpy as np
import pytest

from engines.base import Forced, Generation
from evalsuite.compare import batching, rule

F32 = rule.Tolerances.for_dtype("float32")


def test_prefix_groups_find_shared_prefixes_of_any_length():
    head = list(range(100, 126))  # 26 tokens: not a power of two
    prompts = [head + [1, 2], [7, 8, 9], head + [3], head[:20] + [5, 5], [7, 8, 10], head + [4, 4, 4]]
    groups = batching.prefix_groups(prompts)
    assert groups == [([0, 2, 3, 5], 20)]  # neighbours in token order: prompt 3 shares 20 with the others
    assert batching.prefix_groups(prompts[:3] + prompts[4:]) == [([0, 2, 4], 26)]
    assert batching.prefix_groups([[1, 2, 3], [4, 5, 6]]) == []
    # every prompt keeps one token of its own: a prompt that is the others' prefix shares one token less
    assert batching.prefix_groups([head, head + [9]]) == [([0, 1], 25)]


def test_plan_sends_the_longest_first_and_staggers_the_stops_in_pairs():
    prompts = [[1] * 5, [2] * 40, [3] * 7, [4] * 9]
    calls = batching.plan(prompts, 8, rows=2)
    assert calls[0].order == (1, 0, 2, 3, 1, 0) and calls[0].stops == (2, 2, 4, 4, 6, 6)  # cycled past 2 x 2 rows
    assert len(calls) == 1  # no shared prefix
    assert len(batching.plan(prompts, 8, rows=8)[0].order) == 18  # a small set still makes 8 rows refill


def test_expected_end_is_where_the_reference_itself_stops():
    track = [5, 6, 2, 7, 8]
    assert batching.expected_end(track, 4, {2}, set()) == 3  # its end-of-turn first
    assert batching.expected_end(track, 2, {2}, set()) == 2  # its staggered stop first
    assert batching.expected_end(track, 5, set(), {(5,)}) == 1  # another prompt's stop target matches its start


def _gen(ids, top_ids, top_lp):
    return Generation([], list(ids), np.asarray(top_ids), np.asarray(top_lp, np.float64), "length")


def _ref(logits):
    toks = logits.argmax(-1)
    return toks, Forced.from_logits(logits, toks, 5)


def test_every_rank_is_judged():
    """A renormalised top-k and ranks 2/3 with swapped ids are real even where rank 1 (and the token) are right;
    a near-tie at the k-th place is not."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (6, 40))
    toks, ref = _ref(logits)
    lp = rule.metrics.log_softmax(logits)
    ids = np.argsort(-lp, axis=-1)[:, :5]
    vals = np.take_along_axis(lp, ids, -1)
    ok = rule.compare_prompt(toks, ref, None, _gen(toks, ids, vals), F32)
    assert ok["real_positions"] == []
    swapped = ids.copy()
    swapped[:, [1, 2]] = ids[:, [2, 1]]
    bad = rule.compare_prompt(toks, ref, None, _gen(toks, swapped, vals), F32)
    assert bad["real_positions"] == list(range(6)) and bad["token_mismatches"] == []
    renorm = vals - np.log(np.exp(vals).sum(-1, keepdims=True))
    assert rule.compare_prompt(toks, ref, None, _gen(toks, ids, renorm), F32)["real_positions"] == list(range(6))
    # a near-tie between ranks 5 and 6: an engine reporting the 6th id at rank 5 is fine
    logits[0, ids[0, 4]] = logits[0, np.argsort(-lp[0])[5]] + 1e-6
    toks, ref = _ref(logits)
    lp = rule.metrics.log_softmax(logits)
    six = np.argsort(-lp, axis=-1)[:, :6]
    alt = six[:, :5].copy()
    alt[0, 4] = six[0, 5]
    rec = rule.compare_prompt(toks, ref, None, _gen(toks, alt, np.take_along_axis(lp, alt, -1)), F32)
    assert rec["real_positions"] == []


def test_an_engine_that_runs_past_the_references_end_is_real():
    rng = np.random.default_rng(1)
    toks, ref = _ref(rng.normal(0, 3, (5, 30)))
    lp = rule.metrics.log_softmax(ref.logits)
    ids = np.argsort(-lp, axis=-1)[:, :1]
    g = _gen(toks, ids, np.take_along_axis(lp, ids, -1))
    cut = batching.cut(ref, 3)
    rec = rule.compare_prompt(toks[:3], cut, None, g, F32, ends=True)
    assert rec["real_positions"] == [2] and "went on" in rec["first_divergence"]["note"]
    assert rule.compare_prompt(toks[:3], cut, None, g, F32)["real_positions"] == []  # without ends: a prefix is fine


# ---- the faults only the batching part drives, on mini-llama ---------------------------------------------------
@pytest.fixture(scope="module")
def workload(mini_llama):
    """quick's prompts through the reference (8 tokens, full logits): what diff's main part leaves behind."""
    from evalsuite.plugins import judge
    from evalsuite.prompts import load_prompts

    pset = load_prompts("quick")
    prompts = [p.encode(mini_llama.tokenizer) for p in pset.prompts]
    rg = judge(mini_llama).generate(prompts, 8, want_logits=True)
    return [p.id for p in pset.prompts], prompts, [g.token_ids for g in rg], [g.track() for g in rg]


@pytest.mark.parametrize("fault", [None, "refill_wrong_row", "shrink_wrong_rows", "prefix_padded",
                                   "topk_renormalized", "topk_ids_swapped"])
def test_batching_part_catches_what_fixed_batches_cannot(mini_llama, workload, fault):
    """The loop faults leave every fixed batch of diff's main part right (one prefill, one budget, no stop); the
    batching part FAILs them, and passes the faithful engine with every declared path driven."""
    from evalsuite.plugins import make_engine

    ids, prompts, tracks, refs = workload
    eng = make_engine("megakernel", mini_llama, "float32", fault)
    if fault in ("refill_wrong_row", "shrink_wrong_rows"):  # the main part's fixed batches: untouched
        assert [g.token_ids for g in eng.generate(prompts[:8], 8)] == tracks[:8]
    rec = batching.run(eng, prompts, ids, tracks, refs, [None] * len(ids), 8, mini_llama.tokenizer.eos_ids, F32)
    if fault is None:
        assert rec["real_mismatches"] == 0, rec["per_prompt"]
        ran = eng.path_log().snapshot()["counts"]
        assert set(eng.paths) - {"teacher_forced"} <= set(ran), ran  # everything but teacher forcing, driven here
    else:
        assert rec["real_mismatches"] > 0
