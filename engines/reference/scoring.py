"""score_topk on the reference: every continuation token scored by the prefill path, one forward pass a row; and a
routing replay's forced experts in the shape its score pass takes."""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from engines.base import Forced, call_groups, check_prompts, next_bucket, next_pow2
from engines.errors import ModelError
from engines.loop import MIN_PREFILL_BUCKET, MIN_SHARED_PREFIX, PREFILL_TOKEN_BUDGET, cache_slots

# score_topk: the scored positions' logits and log-softmax ([rows, positions, vocab] float32 each) of one call stay
# under this; smollm2's 49,152-token vocabulary at 256 answer positions is 100 MB a row, so 4 rows a call.
SCORE_LOGIT_BYTES = 512 << 20


class PrefillScoring:
    """The reference's score_topk, over its programs (_score_at, _seed, prefix_cache, new_cache)."""

    def score_topk(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                   k: int = 5) -> list[Forced]:
        """Every continuation token scored in one forward pass a row (the prefill path): a prefix every prompt shares
        (lm-eval's few-shot exemplars) prefilled once, then each row's rest of prompt + continuation in calls of at
        most PREFILL_TOKEN_BUDGET padded tokens and SCORE_LOGIT_BYTES of scored logits. On a mesh: forced_topk."""
        c = self.config
        seqs = [list(p) + list(x) for p, x in zip(prompts, continuations)]
        check_prompts(seqs, c.vocab_size, c.max_context + 1, 1)
        if not 1 <= k <= c.vocab_size:
            raise ModelError(f"k must be in [1, {c.vocab_size}], got {k}")
        if self.mesh is not None:
            return self.forced_topk(prompts, continuations, k)
        out: list[Forced | None] = [None] * len(seqs)
        rows = [i for i, x in enumerate(continuations) if len(x)]
        for i in set(range(len(seqs))) - set(rows):
            out[i] = Forced(np.zeros(0), np.zeros((0, k), np.int64), np.zeros((0, k)))
        if not rows:
            return out
        P = _shared_prefix([prompts[i] for i in rows])
        P = P if P >= MIN_SHARED_PREFIX else 0
        self._paths.hit("teacher_forced", len(rows))
        longest = next_pow2(max(len(continuations[i]) for i in rows))
        per_call = max(1, min(self.max_batch, SCORE_LOGIT_BYTES // (2 * 4 * longest * c.vocab_size)))
        rows.sort(key=lambda i: -(len(seqs[i]) - 1 - P))
        for group in call_groups([len(seqs[i]) - 1 - P for i in rows], per_call, PREFILL_TOKEN_BUDGET,
                                 MIN_PREFILL_BUCKET):
            idx = [rows[g] for g in group]
            for i, f in zip(idx, self._score_rows([seqs[i] for i in idx], [len(prompts[i]) for i in idx], P, k)):
                out[i] = f
        return out

    def _score_rows(self, seqs: list[list[int]], plens: list[int], P: int, k: int) -> list[Forced]:
        """One call of score_topk: rows seq[P:-1] prefilled (over the shared prefix's cache when P > 0), scored at
        the positions that predict seq[plen:]."""
        T = next_bucket(max(len(s) - 1 - P for s in seqs), MIN_PREFILL_BUCKET)
        S = next_pow2(max(len(s) - n for s, n in zip(seqs, plens)))
        B = next_pow2(len(seqs))
        tokens = np.zeros((B, T), np.int32)
        at = np.zeros((B, S), np.int32)
        nxt = np.zeros((B, S), np.int32)
        for b, (s, n) in enumerate(zip(seqs, plens)):
            m = len(s) - n
            tokens[b, :len(s) - 1 - P] = s[P:-1]
            at[b] = n - 1 - P + np.minimum(np.arange(S), m - 1)  # padding repeats the last scored position
            nxt[b, :m] = s[n:]
        if P:
            pk, pv = self.prefix_cache(tuple(seqs[0][:P]))
            kc, vc = self._seed(pk, pv, batch=B, slots=cache_slots(max(P + T, self.slots(pk)), 1 << 30))
            self._paths.hit("shared_prefix")
            if P & (P - 1):
                self._paths.hit("shared_prefix_unaligned")
        else:
            kc, vc = self.new_cache(B, cache_slots(T, 1 << 30))
        ids, vals, tok = self._score_at(self.params, self._in(tokens), self._in(np.int32(P)), self._in(at),
                                        self._in(nxt), kc, vc, k=k, fresh=not P)
        ids, vals, tok = np.asarray(ids), np.asarray(vals, np.float64), np.asarray(tok, np.float64)
        return [Forced(tok[b, :len(s) - n], ids[b, :len(s) - n].astype(np.int64), vals[b, :len(s) - n])
                for b, (s, n) in enumerate(zip(seqs, plens))]


def _shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """The length of the prefix every prompt shares, short of each one's last token (which a row must prefill)."""
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for p in prompts[1:]:
        n = next((j for j in range(n) if p[j] != first[j]), n)
    return max(n, 0)


def forced_experts(c, e, T: int, Tb: int) -> jnp.ndarray:
    """A routing replay's experts for one sequence ([M, T, k]) as forward takes them: [M, 1, Tb, k], zero-padded."""
    e = np.asarray(e, np.int32)
    if not c.n_moe_layers or e.shape != (c.n_moe_layers, T, c.top_k):
        raise ModelError(f"forced experts for {T} tokens must be [{c.n_moe_layers}, {T}, {c.top_k}] (the model's "
                         f"MoE layers, tokens, top-k), got {list(e.shape)}")
    return jnp.asarray(np.pad(e[:, None], ((0, 0), (0, 0), (0, Tb - T), (0, 0))))
