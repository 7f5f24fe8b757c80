"""Comparison metrics against numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evalsuite.compare import metrics


def test_kl_hand_worked():
    # p = softmax([0, 0]) = [1/2, 1/2]; q = softmax([ln 3, 0]) = [3/4, 1/4].
    # KL(p||q) = 1/2 ln((1/2)/(3/4)) + 1/2 ln((1/2)/(1/4)) = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3).
    got = metrics.kl(np.array([[0.0, 0.0]]), np.array([[math.log(3), 0.0]]))
    assert got[0] == pytest.approx(0.5 * math.log(4 / 3), rel=1e-12)
    assert metrics.kl(np.array([[1.0, 2.0, 3.0]]), np.array([[11.0, 12.0, 13.0]]))[0] == pytest.approx(0, abs=1e-12)


def test_margin_and_rank():
    logits = np.array([[1.0, 5.0, 4.5, -2.0]])
    assert metrics.margin(logits)[0] == pytest.approx(0.5)
    assert metrics.rank_of(1, logits[0]) == 0
    assert metrics.rank_of(2, logits[0]) == 1
    assert metrics.rank_of(3, logits[0]) == 3


def test_topk_overlap_hand_worked():
    ref = np.array([[9.0, 8.0, 7.0, 1.0, 0.0]])  # top-3 = {0, 1, 2}
    eng = np.array([[9.0, 1.0, 7.0, 8.0, 0.0]])  # top-3 = {0, 3, 2}: 2 of 3 shared
    assert metrics.topk_overlap(ref, eng, 3)[0] == pytest.approx(2 / 3)


@pytest.mark.parametrize("gap,cls", [(0.0004, "benign"), (0.00099, "benign"), (0.00101, "real"), (0.002, "real")])
def test_tie_rule_through_the_one_comparator(gap, cls):
    """A flip is benign only where the reference's gap to the engine's token is below the noise
    tolerance (either side of the bound); distribution bounds wide open to isolate the rule."""
    from engines.base import Forced
    from evalsuite.compare.rule import Tolerances, compare_prompt

    ref = np.array([[5.0, 5.0 - gap, 0.0, -1.0]])
    eng = ref.copy()
    eng[0, 1] = 5.0 + 1e-4  # the engine's top-1 is token 1
    tol = Tolerances("float32", dlogit=1.0, kl=1.0, noise=1e-3, logprob=1.0)
    rec = compare_prompt([0], Forced.from_logits(ref, [0], 2), Forced.from_logits(eng, [0], 2), None, tol)
    assert (rec["benign_positions"], rec["token_mismatches"]) == (([0], []) if cls == "benign" else ([], [0]))


def test_summary_percentiles():
    s = metrics.summary(range(1, 101))
    assert s["n"] == 100 and s["max"] == 100 and s["p50"] == pytest.approx(50.5) and s["mean"] == 50.5
