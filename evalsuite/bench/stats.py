"""Paired statistics for "did engine B lose accuracy against engine A on the same items".

Items are paired (same prompt to both engines), so the evidence is in the discordant items:
b = A right and B wrong, c = A wrong and B right. Unpaired comparisons of two accuracies (what
lm-eval's comparator does) throw that pairing away and are about 3x less sensitive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_MARGIN = 0.02  # non-inferiority margin: B may be at most 2 points below A
Z95 = 1.959963984540054


def wilson_ci(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval for a proportion (well-behaved at 0 and n)."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p: under H0 the b+c discordant items split Binomial(b+c, 1/2).
    p = min(1, 2 * P(X <= min(b, c)))."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def rule_of_three(n: int) -> float:
    """With 0 events in n trials, the 95% upper bound on the event rate is about 3/n."""
    return 3.0 / n if n else 1.0


def paired_bootstrap_ci(a: np.ndarray, b: np.ndarray, seed: int, n_boot: int = 10_000,
                        level: float = 0.95) -> tuple[float, float]:
    """Percentile CI of mean(b) - mean(a), resampling items (pairs kept together). Seeded."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError("paired_bootstrap_ci needs two equal-length, non-empty 1-D arrays")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(n_boot, a.size))
    diffs = (b[idx] - a[idx]).mean(axis=1)
    lo, hi = np.percentile(diffs, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return (float(lo), float(hi))


@dataclass(frozen=True)
class PairedVerdict:
    n: int
    acc_a: float
    acc_b: float
    b: int  # A right, B wrong
    c: int  # A wrong, B right
    mcnemar_p: float
    diff_ci: tuple[float, float]  # of acc_b - acc_a
    margin: float
    verdict: str  # PASS (non-inferior), FAIL (loss shown), INCONCLUSIVE
    rule_of_three_upper: float | None  # when nothing is discordant: upper bound on the flip rate
    seed: int


def paired_verdict(correct_a, correct_b, margin: float = DEFAULT_MARGIN, seed: int = 0,
                   n_boot: int = 10_000) -> PairedVerdict:
    """Non-inferiority of B against A: PASS when the lower end of the paired 95% CI of
    acc_b - acc_a is above -margin, or when no item is discordant at all (no observed loss; the
    rule-of-three bound 3/n on the flip rate is reported); FAIL when the CI's upper end is below 0
    (a loss is shown); otherwise INCONCLUSIVE (more items needed)."""
    if not 0 < margin < 1:
        raise ValueError(f"margin must be in (0, 1), got {margin}")
    a = np.asarray(correct_a, bool)
    bb = np.asarray(correct_b, bool)
    if a.shape != bb.shape or a.size == 0:
        raise ValueError("correct_a and correct_b must be equal-length and non-empty")
    b = int((a & ~bb).sum())
    c = int((~a & bb).sum())
    if b + c == 0:
        # No discordant item: the bootstrap collapses to (0, 0). The discordance rate, and so any
        # accuracy difference, is still only bounded by the rule of three: |diff| <= 3/n at 95%.
        r3 = rule_of_three(a.size)
        ci = (-r3, r3)
    else:
        ci = paired_bootstrap_ci(a, bb, seed, n_boot)
    if ci[1] < 0:
        verdict = "FAIL"
    elif ci[0] > -margin or b + c == 0:
        # No discordant item means no observed loss on these items; the rule-of-three bound
        # (reported with the verdict) says how strongly that generalises.
        verdict = "PASS"
    else:
        verdict = "INCONCLUSIVE"
    return PairedVerdict(n=int(a.size), acc_a=float(a.mean()), acc_b=float(bb.mean()), b=b, c=c,
                         mcnemar_p=mcnemar_exact_p(b, c), diff_ci=ci, margin=margin, verdict=verdict,
                         rule_of_three_upper=rule_of_three(a.size) if b + c == 0 else None, seed=seed)
