"""Per-position comparison metrics on logits (numpy, float64 inside)."""

from __future__ import annotations

import numpy as np

from engines.base import log_softmax, top_k  # noqa: F401  (one definition of each)


def kl(ref_logits: np.ndarray, eng_logits: np.ndarray) -> np.ndarray:
    """KL(reference || engine) in nats, per position: sum p_ref (log p_ref - log p_eng)."""
    lr, le = log_softmax(ref_logits), log_softmax(eng_logits)
    return np.maximum((np.exp(lr) * (lr - le)).sum(axis=-1), 0.0)


def margin(logits: np.ndarray) -> np.ndarray:
    """Top-1 minus top-2 logit, per position (equal to the log-prob gap)."""
    top2 = -np.sort(-np.asarray(logits, np.float64), axis=-1)[..., :2]
    return top2[..., 0] - top2[..., 1]


def topk_overlap(ref_logits: np.ndarray, eng_logits: np.ndarray, k: int = 5) -> np.ndarray:
    """Share of the reference's top-k ids that are also in the engine's top-k, per position."""
    tr, te = top_k(ref_logits, k)[0], top_k(eng_logits, k)[0]
    return np.array([len(set(a) & set(b)) / k for a, b in zip(tr.reshape(-1, k), te.reshape(-1, k))]
                    ).reshape(tr.shape[:-1])


def rank_of(token: int, logits: np.ndarray) -> int:
    """0 for the argmax: how many ids have a strictly larger logit than `token`."""
    return int((np.asarray(logits) > logits[token]).sum())


def mean_of(values) -> float | None:
    """The mean of the values measured; None (not measured) when there are none."""
    v = [x for x in values if x is not None]
    return float(np.mean(v)) if v else None


def summary(values) -> dict:
    """n, mean, quantiles and max of the values; NaN (a value a server did not give) is left out."""
    v = np.asarray(list(values), np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {"n": 0}
    return {"n": int(v.size), "mean": float(v.mean()), "p50": float(np.percentile(v, 50)),
            "p90": float(np.percentile(v, 90)), "p99": float(np.percentile(v, 99)), "max": float(v.max())}


def rank_errors(lp_at, ref_vals: np.ndarray, ids: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """Per position, the largest error over every rank an engine reported (ids, vals [n, k]; -1 / NaN where it gave
    fewer): its logprob for each id against the judge's logprob of that id (lp_at(j, id)), and its r-th value
    against the judge's r-th largest (ref_vals [n, k'], sorted); an id outside a top-k judge's record is judged by
    its rank only. An id swapped with another's value, values
    renormalised over the top-k, or ids that are not the top-k all show; a near-tie at the k-th place moves
    neither by more than the tie. NaN where nothing was reported."""
    ids, vals = np.asarray(ids), np.asarray(vals, np.float64)
    n, k = vals.shape if vals.ndim == 2 else (len(vals), 0)
    out = np.full(n, np.nan)
    for j in range(n):
        given = np.flatnonzero((ids[j] >= 0) & ~np.isnan(vals[j]))
        if not given.size:
            continue
        judged = [lp_at(j, int(ids[j, r])) for r in given]  # -inf: outside a top-k judge's record, unknown
        own = max((abs(vals[j, r] - v) for r, v in zip(given, judged) if np.isfinite(v)), default=0.0)
        m = [r for r in given if r < ref_vals.shape[1] and np.isfinite(ref_vals[j, r])]
        by_rank = max((abs(vals[j, r] - ref_vals[j, r]) for r in m), default=0.0)
        out[j] = max(own, by_rank)
    return out
