"""Paired statistics for "did engine B lose accuracy against engine A on the same items".

Items are paired (same prompt to both engines), so the evidence is in the discordant items:
b = A right and B wrong, c = A wrong and B right. The per-item loss is L = p_b - p_c (p_b, p_c:
the chances that an item is of kind b or c), and acc_a - acc_b = (b - c)/n estimates it.

The verdict (alpha = 2.5% one-sided for each error, both exact; docs/verdicts.md, "The rules, command by command"):
- FAIL: the exact one-sided McNemar test shows a loss: P(X >= b) <= alpha for X ~ Binomial(b+c, 1/2)
  (conditional on the b+c discordant items, which under no loss split evenly or favour B).
  P(FAIL | no loss) <= alpha for every n and every discordance rate.
- PASS: the one-sided (1 - alpha) Clopper-Pearson upper bound on p_b is at most the margin. Since
  L = p_b - p_c <= p_b, it bounds the loss too: P(PASS | L >= margin) <= alpha for every n.
  (Conservative: c is not credited. With nothing discordant at margin 0.02, PASS needs n >= 183.)
- INCONCLUSIVE otherwise, with the number of items a PASS would need at the observed b.
FAIL is checked first: a loss shown at the stated level is a FAIL even when it is below the margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

DEFAULT_MARGIN = 0.02  # non-inferiority margin: B may be at most 2 points below A
ALPHA = 0.025  # one-sided error rate of each verdict (PASS when lost, FAIL when not lost)
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


def binom_pmf(n: int, p: float) -> np.ndarray:
    """P(X = k) for k = 0..n, X ~ Binomial(n, p), computed in log space (stable at n in the thousands)."""
    k = np.arange(n + 1)
    if p <= 0.0 or p >= 1.0:
        out = np.zeros(n + 1)
        out[0 if p <= 0.0 else n] = 1.0
        return out
    lg = _log_factorials(n)
    log = lg[n] - lg - lg[::-1] + k * math.log(p) + (n - k) * math.log1p(-p)
    return np.exp(log)


@lru_cache(maxsize=64)
def _log_factorials(n: int) -> np.ndarray:
    return np.array([math.lgamma(i + 1) for i in range(n + 1)])


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k), X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return float(min(1.0, binom_pmf(n, p)[:k + 1].sum()))


def cp_upper(k: int, n: int, alpha: float = ALPHA) -> float:
    """One-sided (1 - alpha) Clopper-Pearson upper bound on p from k events in n trials: the p at
    which P(X <= k) = alpha (exact; 1 when k = n). Bisection to 1e-12."""
    if n <= 0:
        return 1.0
    if k >= n:
        return 1.0
    if k == 0:
        return 1.0 - alpha ** (1.0 / n)
    lo, hi = k / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if binom_cdf(k, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p: under H0 the b+c discordant items split Binomial(b+c, 1/2).
    p = min(1, 2 * P(X <= min(b, c))). Reported for reference; the verdict uses the one-sided p."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def loss_p(b: int, c: int) -> float:
    """One-sided exact McNemar p for a loss: P(X >= b), X ~ Binomial(b + c, 1/2)."""
    m = b + c
    if m == 0:
        return 1.0
    return sum(math.comb(m, i) for i in range(b, m + 1)) / 2 ** m


def rule_of_three(n: int) -> float:
    """With 0 events in n trials, the 95% upper bound on the event rate is about 3/n (never above 1)."""
    return min(1.0, 3.0 / n) if n > 0 else 1.0


def items_needed(b: int, margin: float, alpha: float = ALPHA) -> int:
    """Smallest n at which b discordant-against items still give cp_upper(b, n) <= margin."""
    if b == 0:
        return math.ceil(math.log(alpha) / math.log1p(-margin))
    lo, hi = b + 1, max(b + 2, math.ceil(b / margin))
    while cp_upper(b, hi, alpha) > margin:
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if cp_upper(b, mid, alpha) <= margin:
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True)
class PairedVerdict:
    n: int
    acc_a: float
    acc_b: float
    b: int  # A right, B wrong
    c: int  # A wrong, B right
    mcnemar_p: float  # two-sided exact, for reference
    loss_p: float  # one-sided exact McNemar p for "B loses": FAIL when <= alpha
    loss_upper: float  # one-sided (1 - alpha) upper bound on the per-item loss (Clopper-Pearson on b/n)
    diff_ci: tuple[float, float]  # of acc_b - acc_a: [-loss_upper, cp_upper(c/n)], conservative 95%
    margin: float
    alpha: float
    verdict: str  # PASS (non-inferior), FAIL (loss shown), INCONCLUSIVE
    rule_of_three_upper: float | None  # when nothing is discordant: approximate 95% bound on the flip rate
    items_needed: int | None  # INCONCLUSIVE: n a PASS would need with the same b
    rule: str

    def explain(self) -> str:
        """One sentence a person can act on."""
        if self.verdict == "PASS":
            return (f"PASS: the loss is at most {self.loss_upper:.4f} at {100 * (1 - self.alpha):.1f}% "
                    f"confidence (b={self.b} of n={self.n}), within the margin {self.margin}")
        if self.verdict == "FAIL":
            return (f"FAIL: a loss is shown (b={self.b} items lost, c={self.c} gained, one-sided exact "
                    f"McNemar p={self.loss_p:.3g} <= {self.alpha})")
        return (f"INCONCLUSIVE: with {self.b} discordant item{'s' if self.b != 1 else ''} lost "
                f"(b={self.b}, c={self.c}) of n={self.n}, the loss is bounded only by {self.loss_upper:.4f} "
                f"> margin {self.margin}; PASS needs n >= {self.items_needed} at margin {self.margin}")


RULE = ("FAIL when the one-sided exact McNemar test shows a loss (P(X >= b | b+c, 1/2) <= {alpha}); "
        "PASS when the one-sided {conf}% Clopper-Pearson upper bound on b/n (which bounds the per-item "
        "loss) is <= the margin {margin}; otherwise INCONCLUSIVE. Each wrong verdict has probability "
        "<= {alpha} (exact, for every n).")


def paired_verdict(correct_a, correct_b, margin: float = DEFAULT_MARGIN, alpha: float = ALPHA) -> PairedVerdict:
    """Non-inferiority of B against A on paired items (see the module docstring for the rule)."""
    if not 0 < margin < 1:
        raise ValueError(f"margin must be in (0, 1), got {margin}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    a = np.asarray(correct_a, bool)
    bb = np.asarray(correct_b, bool)
    if a.shape != bb.shape or a.ndim != 1 or a.size == 0:
        raise ValueError("correct_a and correct_b must be equal-length and non-empty")
    n = int(a.size)
    b = int((a & ~bb).sum())
    c = int((~a & bb).sum())
    v = verdict_from_counts(n, b, c, margin, alpha)
    return PairedVerdict(n=n, acc_a=float(a.mean()), acc_b=float(bb.mean()), b=b, c=c,
                         mcnemar_p=mcnemar_exact_p(b, c), loss_p=loss_p(b, c), loss_upper=cp_upper(b, n, alpha),
                         diff_ci=(-cp_upper(b, n, alpha), cp_upper(c, n, alpha)), margin=margin, alpha=alpha,
                         verdict=v, rule_of_three_upper=rule_of_three(n) if b + c == 0 else None,
                         items_needed=items_needed(b, margin, alpha) if v == "INCONCLUSIVE" else None,
                         rule=RULE.format(alpha=alpha, conf=100 * (1 - alpha), margin=margin))


def verdict_from_counts(n: int, b: int, c: int, margin: float = DEFAULT_MARGIN, alpha: float = ALPHA) -> str:
    """The verdict from n items of which b were lost and c gained (the whole rule, nothing else)."""
    if loss_p(b, c) <= alpha:
        return "FAIL"
    if cp_upper(b, n, alpha) <= margin:
        return "PASS"
    return "INCONCLUSIVE"
