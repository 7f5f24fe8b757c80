"""Batch invariance and run-to-run determinism of an engine's greedy decoding (used by `evalsuite diff`).

The default measurement (reported, blocks nothing): the first INVARIANCE_BATCH prompts decoded together
and alone, and the first decoded twice. `--require batch-invariance` makes it a claim: the first
STRICT_INVARIANCE_PROMPTS prompts alone, then one batch of each size 2..8 in a seeded order, every bit
of tokens and top-k logprobs equal to the prompt's batch-1 run.
"""

from __future__ import annotations

import random

import numpy as np

INVARIANCE_BATCH = 4
STRICT_INVARIANCE_PROMPTS = 8  # --require batch-invariance: batch sizes 1..8 over the first 8 prompts


def strict_batch_invariance(eng, prompts: list[tuple[str, list[int]]], n: int, seed: int) -> dict:
    """Every prompt alone (batch 1), then one batch of each size 2..len(prompts), its prompts drawn in a
    seeded order (so each lands at varying rows): any bit of a row's tokens or top-k logprobs that
    differs from the prompt's batch-1 run is a difference, named by prompt, batch size and row."""
    alone = [eng.generate([p], n)[0] for _, p in prompts]
    rng = random.Random(seed)
    batches, diffs = [], []
    for b in range(2, len(prompts) + 1):
        order = rng.sample(range(len(prompts)), b)
        for row, (i, g) in enumerate(zip(order, eng.generate([prompts[i][1] for i in order], n))):
            d = _first_difference(alone[i], g)
            if d is not None:
                diffs.append({"prompt": prompts[i][0], "batch": b, "row": row, **d})
        batches.append({"batch": b, "order": [prompts[i][0] for i in order]})
    return {"ok": not diffs, "seed": seed, "prompts": [pid for pid, _ in prompts],
            "batch_sizes": [1] + [x["batch"] for x in batches], "batches": batches, "differences": diffs,
            "rule": "tokens and top-k logprobs bitwise equal to the prompt's batch-1 run"}


def _first_difference(a, b) -> dict | None:
    """Where generation b first differs from a in any bit (a token, or a top-k logprob)."""
    for j in range(max(len(a.token_ids), len(b.token_ids))):
        ta = a.token_ids[j] if j < len(a.token_ids) else None
        tb = b.token_ids[j] if j < len(b.token_ids) else None
        if ta != tb:
            return {"step": j, "what": "token", "alone": ta, "batched": tb}
        la, lb = np.asarray(a.top_logprobs[j]), np.asarray(b.top_logprobs[j])
        if not np.array_equal(np.asarray(a.top_ids[j]), np.asarray(b.top_ids[j])) or not np.array_equal(la, lb):
            return {"step": j, "what": "top-k logprobs", "max_abs": float(np.abs(la - lb).max())}
    return None


def batch_invariance(eng, prompts: list[list[int]], n: int) -> dict:
    together = eng.generate(prompts, n)
    alone = [eng.generate([p], n)[0] for p in prompts]
    again = eng.generate(prompts[:1], n)[0]
    same = [a.token_ids == b.token_ids for a, b in zip(together, alone)]
    return {"batch": len(prompts), "invariant": all(same), "rows_identical": int(sum(same)),
            "deterministic": again.token_ids == alone[0].token_ids}
