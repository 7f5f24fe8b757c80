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


def summary(values) -> dict:
    """n, mean, quantiles and max of the values; NaN (a value a server did not give) is left out."""
    v = np.asarray(list(values), np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {"n": 0}
    return {"n": int(v.size), "mean": float(v.mean()), "p50": float(np.percentile(v, 50)),
            "p90": float(np.percentile(v, 90)), "p99": float(np.percentile(v, 99)), "max": float(v.max())}
