"""The peers' rules as written in evalsuite/compare/peers.py, on hand-made records (each case exact)."""

from __future__ import annotations

import numpy as np

from evalsuite.compare import peers


def _tops(*rows):
    return np.array(rows)


def test_vllm_rule_judges_only_the_first_mismatch_by_top_n_membership():
    ref_top = _tops([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15])
    assert not peers.vllm_rule([1, 6, 11], ref_top, [1, 6, 11], ref_top)["caught"]
    # the engine picks 7 (in the reference's top-5) and the reference's 6 is in the engine's top-5: passes
    eng_top = _tops([1, 2, 3, 4, 5], [7, 6, 8, 9, 10], [99, 98, 97, 96, 95])
    r = peers.vllm_rule([1, 6, 11], ref_top, [1, 7, 99], eng_top)
    assert not r["caught"] and r["position"] == 1  # and nothing after the first mismatch is looked at (99)
    # the engine's token is outside the reference's top-5: caught
    assert peers.vllm_rule([1, 6], ref_top[:2], [1, 42], _tops([1, 2, 3, 4, 5], [42, 6, 1, 2, 3]))["caught"]
    # the reference's token is outside the engine's top-5: caught
    assert peers.vllm_rule([1, 6], ref_top[:2], [1, 7], _tops([1, 2, 3, 4, 5], [7, 8, 9, 10, 11]))["caught"]
    # lengths differ: only the shared prefix is compared
    assert not peers.vllm_rule([1, 6, 11], ref_top, [1, 6], ref_top[:2])["caught"]


def test_maxtext_rule_fails_when_any_position_reaches_the_kl_threshold():
    ref = np.array([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0]])
    same = peers.maxtext_rule(ref, ref.copy())
    assert not same["caught"] and same["max_kl"] == 0
    moved = ref.copy()
    moved[1] = [0.0, 4.0, 0.0]  # KL of the second position: 0.0093, under 0.015
    assert not peers.maxtext_rule(ref, moved)["caught"]
    moved[1] = [0.0, 3.0, 0.0]  # 0.055: over
    r = peers.maxtext_rule(ref, moved)
    assert r["caught"] and r["position"] == 1
    assert peers.maxtext_rule(ref, None)["caught"] is None


def test_sglang_rule_compares_top5_values_rank_by_rank_and_needs_identical_text():
    ref = np.log(np.array([[0.5, 0.2, 0.1, 0.1, 0.05]]))
    assert not peers.sglang_rule(ref, ref + 0.059, "a", "a")["caught"]  # under 6e-2 at every rank
    r = peers.sglang_rule(ref, ref + np.array([[0, 0, 0, 0, 0.061]]), "a", "a")
    assert r["caught"] and r["position"] == 0
    text = peers.sglang_rule(ref, ref, "Paris.", "Paris!")
    assert text["caught"] and not text["texts_identical"]  # ROUGE-L tolerance 1: the outputs must be identical
