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


def test_classification_rule():
    assert metrics.classify(0.0004, 1e-3) == "benign"
    assert metrics.classify(0.002, 1e-3) == "real"
    assert metrics.classify(1e-3, 1e-3) == "real"  # the bound itself is not a near-tie


def test_summary_percentiles():
    s = metrics.summary(range(1, 101))
    assert s["n"] == 100 and s["max"] == 100 and s["p50"] == pytest.approx(50.5) and s["mean"] == 50.5
