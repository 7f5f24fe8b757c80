"""Paired statistics: hand-computed cases and the verdict's exact operating characteristics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evalsuite.bench import stats


def test_mcnemar_exact_small_cases():
    # b=0, c=5: P(X<=0) = 1/32 under Binomial(5, 1/2); two-sided 2/32 = 0.0625.
    assert stats.mcnemar_exact_p(0, 5) == pytest.approx(0.0625)
    assert stats.mcnemar_exact_p(1, 6) == pytest.approx(0.125)
    assert stats.mcnemar_exact_p(3, 3) == 1.0
    assert stats.mcnemar_exact_p(0, 0) == 1.0
    # one-sided loss p: b=4, c=0 -> 1/16; b=6, c=0 -> 1/64; b=5, c=5 -> P(X>=5 | 10) = 638/1024
    assert stats.loss_p(4, 0) == pytest.approx(1 / 16)
    assert stats.loss_p(6, 0) == pytest.approx(1 / 64)
    assert stats.loss_p(5, 5) == pytest.approx(638 / 1024)


def test_rule_of_three_never_above_one():
    assert stats.rule_of_three(300) == pytest.approx(0.01)
    assert stats.rule_of_three(1319) == pytest.approx(3 / 1319)
    assert [stats.rule_of_three(n) for n in (0, 1, 2, 3)] == [1.0, 1.0, 1.0, 1.0]


def test_wilson_interval_hand_worked():
    lo, hi = stats.wilson_ci(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    assert stats.wilson_ci(0, 10)[0] == 0.0


def test_clopper_pearson_upper_hand_worked():
    # k = 0: 1 - alpha^(1/n) exactly; 0 of 183 at 97.5% -> 0.019957 (<= 0.02), 0 of 182 -> 0.020066
    assert stats.cp_upper(0, 183) == pytest.approx(1 - 0.025 ** (1 / 183))
    assert stats.cp_upper(0, 183) <= 0.02 < stats.cp_upper(0, 182)
    # k = 1, n = 10: solve (1-p)^10 + 10 p (1-p)^9 = 0.025 -> p = 0.44502 (checked by the defining equation)
    p = stats.cp_upper(1, 10)
    assert (1 - p) ** 10 + 10 * p * (1 - p) ** 9 == pytest.approx(0.025, abs=1e-9)
    assert stats.cp_upper(5, 5) == 1.0
    scipy_stats = pytest.importorskip("scipy.stats")
    for k, n in ((3, 60), (10, 198), (25, 1319)):
        assert stats.cp_upper(k, n) == pytest.approx(scipy_stats.beta.ppf(0.975, k + 1, n - k), rel=1e-9)


def test_small_samples_are_inconclusive_not_pass():
    """Regression: b = c = 0 on 2 items was PASS (any n passed with nothing discordant)."""
    same = np.array([True, False])
    v = stats.paired_verdict(same, same)
    assert v.verdict == "INCONCLUSIVE"
    assert v.items_needed == 183 and "PASS needs n >= 183 at margin 0.02" in v.explain()
    for n in (20, 60, 182):
        x = np.ones(n, bool)
        assert stats.paired_verdict(x, x).verdict == "INCONCLUSIVE"
    x = np.ones(183, bool)
    v = stats.paired_verdict(x, x)
    assert v.verdict == "PASS" and v.loss_upper <= 0.02 and v.rule_of_three_upper == pytest.approx(3 / 183)


def test_four_losses_are_not_a_shown_loss():
    """Regression: b = 4, c = 0 was FAIL although the exact one-sided p is 1/16."""
    a = np.ones(40, bool)
    b = a.copy()
    b[:4] = False
    v = stats.paired_verdict(a, b)
    assert v.verdict == "INCONCLUSIVE" and v.loss_p == pytest.approx(1 / 16)
    b[:6] = False
    assert stats.paired_verdict(a, b).verdict == "FAIL"


def test_verdict_paths_and_needed_items():
    a = np.array([True] * 150 + [False] * 50)
    worse = a.copy()
    worse[:30] = False
    v = stats.paired_verdict(a, worse)
    assert v.verdict == "FAIL" and v.b == 30 and v.c == 0 and v.loss_p < 1e-8
    # a few losses on a big set: within the margin -> PASS
    big = np.ones(2000, bool)
    few = big.copy()
    few[:5] = False
    assert stats.paired_verdict(big, few).verdict == "PASS"
    # the items_needed promise holds: at that n with the same b the verdict is PASS, one less is not
    for b in (0, 1, 3):
        n = stats.items_needed(b, 0.02)
        assert stats.verdict_from_counts(n, b, 0) == "PASS"
        assert stats.verdict_from_counts(n - 1, b, 0) != "PASS"
    with pytest.raises(ValueError, match="margin"):
        stats.paired_verdict(a, a, margin=1.5)


def _fail_threshold(m: int, alpha: float) -> int:
    """Smallest b with P(X >= b) <= alpha, X ~ Binomial(m, 1/2) (m + 1 when none)."""
    tail = np.cumsum(stats.binom_pmf(m, 0.5)[::-1])[::-1]  # tail[b] = P(X >= b)
    hits = np.flatnonzero(tail <= alpha * (1 + 1e-12))
    return int(hits[0]) if hits.size else m + 1


@pytest.mark.parametrize("n", [20, 60, 198, 1319])
def test_exact_operating_characteristics(n):
    """Binomial enumeration, no simulation: P(PASS | per-item loss = margin) <= 2.5% and
    P(FAIL | no loss) <= 2.5%, over several discordance rates."""
    margin, alpha = stats.DEFAULT_MARGIN, stats.ALPHA
    t = [_fail_threshold(m, alpha) for m in range(n + 1)]  # FAIL iff b >= t[b + c]
    kstar = -1  # PASS (when not FAIL) iff b <= kstar
    while kstar + 1 <= n and stats.cp_upper(kstar + 1, n, alpha) <= margin:
        kstar += 1
    # the regions are what verdict_from_counts decides
    rng = np.random.default_rng(n)
    for b, c in zip(rng.integers(0, n // 4 + 1, 40), rng.integers(0, n // 4 + 1, 40)):
        if b + c <= n:
            want = "FAIL" if b >= t[b + c] else "PASS" if b <= kstar else "INCONCLUSIVE"
            assert stats.verdict_from_counts(n, int(b), int(c), margin, alpha) == want
    lf = np.array([math.lgamma(i + 1) for i in range(n + 1)])

    def trinomial(pb: float, pc: float, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        rest = n - b - c
        ok = rest >= 0
        rest = np.where(ok, rest, 0)
        with np.errstate(divide="ignore"):
            logp = (lf[n] - lf[b] - lf[c] - lf[rest] + b * np.log(pb) + c * (np.log(pc) if pc > 0 else 0)
                    + rest * np.log1p(-pb - pc))
        if pc == 0:
            logp = np.where(c == 0, logp, -np.inf)
        return np.where(ok, np.exp(logp), 0.0)

    bs, cs = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    is_pass = (bs <= kstar) & (bs < np.asarray(t)[np.minimum(bs + cs, n)]) & (bs + cs <= n)
    is_fail = (bs >= np.asarray(t)[np.minimum(bs + cs, n)]) & (bs + cs <= n)
    for pc in (0.0, 0.01, 0.05, 0.2):
        pr = trinomial(margin + pc, pc, bs, cs)
        assert pr.sum() == pytest.approx(1.0, abs=1e-9)
        p_pass = float(pr[is_pass].sum())
        assert p_pass <= alpha, f"n={n}: P(PASS | loss = margin, p_c={pc}) = {p_pass:.4f}"
    for pd in (0.005, 0.02, 0.1, 0.4, 0.9):
        pr = trinomial(pd / 2, pd / 2, bs, cs)
        p_fail = float(pr[is_fail].sum())
        assert p_fail <= alpha, f"n={n}: P(FAIL | no loss, discordance {pd}) = {p_fail:.4f}"
    # and the old rule's failure is gone: with nothing discordant at n = 20, no PASS
    assert stats.verdict_from_counts(n, 0, 0) == ("PASS" if n >= 183 else "INCONCLUSIVE")
