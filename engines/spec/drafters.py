"""Drafters: what proposes the T-1 tokens a verify step checks. A drafter sees each live row's committed context
(prompt + generated, the last token the anchor) and returns n proposals a row; it never sees the target's logits.

  ngram       prompt lookup: the tokens that followed the latest earlier match of the context's last 3 (then 2,
              then 1) tokens; no weights (vLLM's and SGLang's n-gram / prompt-lookup drafter)
  layers:N    self-speculative: the target's own first N layers and LM head, greedy, over its own cache
  oracle      the target's own greedy continuation, computed first by plain decoding: every draft is accepted
              (acc = T-1 each round) by a correct engine
  random      uniform random ids (seeded): acc is about 0, every round rolls back at row 0
  sweep       round j of a row drafts (j mod T) tokens of the oracle and then wrong ones (oracle + 1): every
              acceptance length 0..T-1, so a rollback at every row
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engines.errors import ModelError

NGRAM_MAX = 3  # the longest suffix prompt lookup matches (vLLM's prompt_lookup_max default is 5; 3 finds more on short
#                contexts and a shorter match is tried next anyway)
KINDS = ("ngram", "layers:N", "oracle", "random", "sweep")


class Drafter:
    name = ""
    needs_oracle = False  # True: the engine computes the target's plain greedy stream first (set_oracle)

    def start(self, row: int, context: Sequence[int]) -> None:
        """A new prompt takes batch row `row`: context is the prompt and its first generated token (the anchor)."""

    def propose(self, rows: Sequence[int], contexts: Sequence[Sequence[int]], n: int) -> np.ndarray:
        """[len(rows), n] draft ids for these live rows."""
        raise NotImplementedError

    def set_oracle(self, streams: dict[tuple[int, ...], list[int]]) -> None:
        """prompt -> the target's greedy continuation (oracle and sweep drafters)."""


class NgramDrafter(Drafter):
    name = "ngram"

    def propose(self, rows, contexts, n):
        out = np.zeros((len(rows), n), np.int64)
        for i, ctx in enumerate(contexts):
            out[i] = lookup(list(ctx), n)
        return out


def lookup(ctx: list[int], n: int) -> list[int]:
    """The n tokens after the latest earlier occurrence of ctx's last g tokens (g = NGRAM_MAX down to 1), padded by
    repeating the last; no match: the last token n times (a proposal the target will mostly reject)."""
    arr = np.asarray(ctx)
    for g in range(min(NGRAM_MAX, len(ctx) - 1), 0, -1):
        tail = arr[-g:]
        # windows ending before the tail itself, latest first
        for start in range(len(ctx) - g - 1, -1, -1):
            if np.array_equal(arr[start:start + g], tail):
                follow = ctx[start + g:start + g + n]
                return (follow + [follow[-1]] * n)[:n]
    return [ctx[-1]] * n


class RandomDrafter(Drafter):
    name = "random"

    def __init__(self, vocab: int, seed: int):
        self.vocab, self.rng = vocab, np.random.default_rng(seed)

    def propose(self, rows, contexts, n):
        return self.rng.integers(0, self.vocab, size=(len(rows), n))


class OracleDrafter(Drafter):
    """Drafts from the target's own greedy stream; sweep=True: the first (round mod (n+1)) of them, then wrong ids."""
    needs_oracle = True

    def __init__(self, vocab: int, sweep: bool = False):
        self.vocab, self.sweep, self.name = vocab, sweep, "sweep" if sweep else "oracle"
        self.streams: dict[tuple[int, ...], list[int]] = {}
        self.prompt_of: dict[int, tuple[int, ...]] = {}
        self.rounds: dict[int, int] = {}

    def set_oracle(self, streams):
        self.streams = streams

    def start(self, row, context):
        self.prompt_of[row] = tuple(int(t) for t in context[:-1])  # the context is the prompt and the anchor
        self.rounds[row] = 0

    def propose(self, rows, contexts, n):
        out = np.zeros((len(rows), n), np.int64)
        for i, (r, ctx) in enumerate(zip(rows, contexts)):
            prompt = self.prompt_of[r]
            g = len(ctx) - len(prompt)  # tokens generated so far, the anchor included
            stream = self.streams[prompt]
            good = [stream[j] if j < len(stream) else 0 for j in range(g, g + n)]
            if self.sweep:
                keep = self.rounds[r] % (n + 1)
                good = good[:keep] + [(t + 1) % self.vocab for t in good[keep:]]
            self.rounds[r] += 1
            out[i] = good
        return out


class ModelDrafter(Drafter):
    """A draft model (engines.spec.target.Runner) decoding greedily over its own batch cache. Its committed state
    covers each row's context up to the anchor; the draft tokens it feeds to propose are never committed to it, so
    a rejection needs no rollback here (the next round feeds the accepted tokens from where it stopped)."""

    def __init__(self, runner, name: str, batch: int, slots: int):
        self.runner, self.name = runner, name
        self.slots = slots
        self.state = runner.empty(batch, slots)
        self.fed = np.zeros(batch, np.int64)  # context tokens this row's committed state holds

    def start(self, row, context):
        ctx = list(context)
        *_, row_state = self.runner.prefill(ctx[:-1], self.slots, 1, False)
        self.state = self.runner.put(self.state, row_state, row)
        self.fed[row] = len(ctx) - 1

    def propose(self, rows, contexts, n):
        B = len(self.fed)
        lag = [len(ctx) - int(self.fed[r]) for r, ctx in zip(rows, contexts)]
        W = 1 << max(0, (max(lag) - 1).bit_length())  # catch-up width, a power of two: few compilations
        tokens, positions = np.zeros((B, W), np.int64), np.zeros((B, W), np.int64)
        lengths = np.ones(B, np.int64)
        for r in range(B):  # rows not asked for are fed a dummy token at their next position and change nothing kept
            positions[r] = self.fed[r] + np.arange(W)
        for r, ctx, m in zip(rows, contexts, lag):
            tokens[r, :m] = ctx[int(self.fed[r]):]
            lengths[r] = m
        nxt, _, _, _, committed = self.runner.feed(self.state, tokens, positions, lengths, 1, False)
        out = np.zeros((len(rows), n), np.int64)
        cur = np.zeros(B, np.int64)
        pos = np.array([self.fed[r] + lengths[r] for r in range(B)], np.int64)
        for i, r in enumerate(rows):
            out[i, 0] = cur[r] = nxt[r, lengths[r] - 1]
        state = committed
        for j in range(1, n):  # the rest of the drafts, one greedy step each, on a state that is then dropped
            nxt, _, _, _, state = self.runner.feed(state, cur[:, None], pos[:, None], np.ones(B, np.int64), 1, False)
            pos += 1
            for i, r in enumerate(rows):
                out[i, j] = cur[r] = nxt[r, 0]
        self.state = committed
        for r, ctx in zip(rows, contexts):
            self.fed[r] = len(ctx)
        return out


def parse(kind: str) -> tuple[str, int]:
    """("layers", N) / (name, 0); a one-line error for anything else."""
    if kind.startswith("layers:"):
        try:
            n = int(kind.split(":", 1)[1])
        except ValueError:
            n = 0
        if n < 1:
            raise ModelError(f"--engine-option drafter={kind!r}: layers:N needs a whole number N >= 1")
        return "layers", n
    if kind not in ("ngram", "oracle", "random", "sweep"):
        raise ModelError(f"--engine-option drafter={kind!r}: expected one of {', '.join(KINDS)}")
    return kind, 0
