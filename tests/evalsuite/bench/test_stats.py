"""Paired statistics against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from evalsuite.bench import stats


def test_mcnemar_exact_small_cases():
    # b=0, c=5: P(X<=0) = 1/32 under Binomial(5, 1/2); two-sided 2/32 = 0.0625.
    assert stats.mcnemar_exact_p(0, 5) == pytest.approx(0.0625)
    # b=1, c=6: P(X<=1) = (1 + 7)/128 = 1/16; two-sided 0.125.
    assert stats.mcnemar_exact_p(1, 6) == pytest.approx(0.125)
    # b=3, c=3: symmetric, p = min(1, 2 * P(X<=3)) = min(1, 2 * 42/64) = 1.
    assert stats.mcnemar_exact_p(3, 3) == 1.0
    assert stats.mcnemar_exact_p(0, 0) == 1.0
    # b=0, c=10: 2/1024.
    assert stats.mcnemar_exact_p(10, 0) == pytest.approx(2 / 1024)


def test_rule_of_three():
    assert stats.rule_of_three(300) == pytest.approx(0.01)
    assert stats.rule_of_three(1319) == pytest.approx(3 / 1319)


def test_wilson_interval_hand_worked():
    # 8/10: centre (0.8 + 1.92/10)/(1 + 3.84/10) = 0.7167; half 1.96*sqrt(0.016+0.0096)/1.384 = 0.2262
    lo, hi = stats.wilson_ci(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    assert stats.wilson_ci(0, 10)[0] == 0.0


def test_bootstrap_reproducible_by_seed_and_sensible():
    rng = np.random.default_rng(0)
    a = rng.random(200) < 0.6
    b = a.copy()
    b[:10] = False  # B loses 10 items A had right (some of which A may have had wrong already)
    ci1 = stats.paired_bootstrap_ci(a, b, seed=7)
    ci2 = stats.paired_bootstrap_ci(a, b, seed=7)
    assert ci1 == ci2
    # another seed resamples differently (few resamples, so the percentiles visibly move)
    few = {stats.paired_bootstrap_ci(a, b, seed=s, n_boot=20) for s in range(5)}
    assert len(few) > 1
    true = b.mean() - a.mean()
    assert ci1[0] <= true <= ci1[1] and ci1[1] <= 0.0


def test_paired_verdicts():
    same = np.array([True] * 150 + [False] * 50)
    v = stats.paired_verdict(same, same, margin=0.02, seed=1)
    assert v.verdict == "PASS" and v.b == v.c == 0 and v.rule_of_three_upper == pytest.approx(3 / 200)
    worse = same.copy()
    worse[:30] = False
    v = stats.paired_verdict(same, worse, seed=1)
    assert v.verdict == "FAIL" and v.b == 30 and v.c == 0 and v.mcnemar_p < 1e-8
    # nothing discordant in 50 items: PASS (no observed loss), the difference bounded by 3/50 only
    v = stats.paired_verdict(same[:50], same[:50], margin=0.02, seed=1)
    assert v.verdict == "PASS" and v.diff_ci == (-0.06, 0.06) and v.rule_of_three_upper == 0.06
    few = same.copy()
    few[:2] = False
    v = stats.paired_verdict(same[:40], few[:40], seed=1)
    assert v.verdict == "INCONCLUSIVE"
    with pytest.raises(ValueError, match="margin"):
        stats.paired_verdict(same, same, margin=1.5)
