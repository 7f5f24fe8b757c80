"""Batched greedy and teacher-forced decode loops over an engine's prefill/decode step functions.

Orchestration only (padding, buckets, stop ids, bookkeeping): no model math, so every engine can
share it without sharing anything the comparison judges.

A step function returns (next_ids [B], top_ids [B, k], top_logprobs [B, k], logits [B, V] or
None, state); prefill(tokens [B, Tb], lengths [B], slots, k, want_logits) and
decode(ids [B], positions [B], state, k, want_logits).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engines import compile_cache
from engines.base import Forced, Generation, PathLog, call_groups, next_bucket, next_pow2

MIN_PREFILL_BUCKET = 16  # prefill lengths round up to powers of two from here: few compilations
# Padded prefill tokens (rows x bucketed length) per call. Prefill attention holds [rows, heads, T, T]
# scores: 8 rows of a 2048 bucket took the 24 GiB machine out of memory; 4096 keeps it under 1 GiB.
PREFILL_TOKEN_BUDGET = 4096
# A prefix shared by every prompt of a call (lm-eval's few-shot exemplars) is prefilled once and its
# KV cache copied into each row when it is at least this long; shorter ones are not worth a call.
MIN_SHARED_PREFIX = 32
# A decode step's attention need read only the cache slots up to the furthest row's position (bucketed by
# next_bucket), not all of prompt + max_new: at batch 32 a step took 507 ms over 2,048 slots and 110 ms
# over 32 (smollm2, measured in development; benchmarks/decode.py prints the context figures). Each window
# size is one more compilation, and each batch-cache size (slots) too: both start at 128 slots (one
# megakernel attention tile), so that every short prompt shares one shape. At 64 a mini-llama `diff
# --prompts quick` traced 8 distinct kernel shapes (1.6 s of Pallas tracing each, even from the
# persistent cache); reading 128 slots instead of 64 cost smollm2 little (batch 8 at 256 slots: 154 ms
# per step over a 64-slot window, 201 ms over all 256: 5 timed MegakernelEngine._decode_step calls).
MIN_WINDOW = 128
# Continuous batching: once this share of a batch's rows (1/4) has finished while prompts are waiting,
# the waiting ones are prefilled into the finished rows' places. Refilling one row at a time would
# prefill in many small calls (and compile more shapes); waiting for a quarter keeps calls batched.
REFILL_SHARE = 4


def attention_window(positions, slots: int) -> int:
    """The slots a decode step at these positions (host array [B]) must read: a bucket, at most slots."""
    return cache_slots(int(np.max(positions)) + 1, slots)


def cache_slots(need: int, slots: int) -> int:
    """A cache (or window) size for need slots: next_bucket from MIN_WINDOW, at most slots."""
    return min(next_bucket(need, MIN_WINDOW), slots)


def slots_for(need: int) -> int:
    """Batch-cache slots for need: a power of two, at least MIN_WINDOW (one attention tile)."""
    return next_pow2(need, MIN_WINDOW)


def batches(lengths: Sequence[int], max_rows: int, token_budget: int = PREFILL_TOKEN_BUDGET) -> list[list[int]]:
    """Split rows (in order) into calls of at most max_rows rows and token_budget padded tokens
    (a row longer than the budget runs alone)."""
    return call_groups(lengths, max_rows, token_budget, MIN_PREFILL_BUCKET)


def pad(prompts: Sequence[Sequence[int]], extra: int):
    n = len(prompts)
    B = next_pow2(n)  # pad the batch too: 1..8 rows compile 4 shapes, not 8
    lengths = np.array([len(p) for p in prompts] + [1] * (B - n), np.int32)
    Tb = next_bucket(int(lengths.max()), MIN_PREFILL_BUCKET)
    S = slots_for(max(Tb, int(lengths.max()) + extra))
    tokens = np.zeros((B, Tb), np.int32)
    for r, p in enumerate(prompts):
        tokens[r, :len(p)] = p
    return tokens, lengths, S


def common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix all prompts share, leaving every prompt at least one own token."""
    n = min(len(p) for p in prompts) - 1
    first = np.asarray(prompts[0][:n])
    for p in prompts[1:]:
        same = np.asarray(p[:n]) == first[:n]
        n = int(np.argmin(same)) if not same.all() else n
    return max(n, 0)


def stream_slots(prompts: Sequence[Sequence[int]], max_new: int, prefix_len: int = 0) -> int:
    """Cache slots for a batch of these prompts (of which the first prefix_len tokens are shared)."""
    P = prefix_len
    longest = max(len(p) - P for p in prompts)
    if P:
        return slots_for(max(next_pow2(P, MIN_PREFILL_BUCKET), P + next_bucket(longest, MIN_PREFILL_BUCKET),
                             P + longest + max_new))
    return slots_for(max(next_bucket(longest, MIN_PREFILL_BUCKET), longest + max_new))


def _log_prefix(log: PathLog | None, P: int) -> None:
    if log is not None and P:
        log.hit("shared_prefix")
        log.shape("shared_prefix_length", P)
        if P & (P - 1):
            log.hit("shared_prefix_unaligned")


def _log_finished(log: PathLog | None, finished: int, stopped: int, live_after: int) -> None:
    """finished rows this step (stopped of them by a stop id or check) while live_after rows decode on."""
    if log is not None and finished:
        if stopped:
            log.hit("stop", stopped)
        if live_after:
            log.hit("finish_mid_batch", finished)


@dataclass(frozen=True)
class Steps:
    """An engine's stepped programs, the one bundle the generation loops drive (greedy_all, forced_all,
    engines.stream.greedy_stream). Each returns (next ids, top-k ids, top-k logprobs, logits or None, cache)."""

    prefill: Callable  # (tokens [B, T], lengths, slots, k, want_logits): a fresh cache of B rows
    decode: Callable  # (ids [B], positions [B], cache, k, want_logits): one step of every row
    extend: Callable | None = None  # (prefix ids, suffix tokens, lengths, slots, k, want_logits): rows after a
    #                                 prefix they share, its K/V computed once by the engine
    insert: Callable | None = None  # (cache, rows' cache, where, src, batch, slots): continuous batching's refill
    shrink: Callable | None = None  # (cache, keep): only these rows, in this order


def greedy_batch(steps: Steps, prompts: Sequence[Sequence[int]], max_new: int, stop: set[int], k: int,
                 want_logits: bool, prefix_len: int = 0, stop_check: Callable | None = None,
                 log: PathLog | None = None) -> list[Generation]:
    """Greedy decode of one batch. With extend and prefix_len > 0 (the prompts' shared prefix), only
    each row's own suffix is prefilled: extend(prefix, suffix tokens, suffix lengths, slots, k,
    want_logits) starts from the prefix's cached K/V (computed once by the engine).
    With shrink(state, keep) (the engine's gather of cache rows), the batch halves whenever at most
    half its rows are still generating, so one long answer does not keep 31 finished rows busy."""
    n, prefill, decode, extend, shrink = len(prompts), steps.prefill, steps.decode, steps.extend, steps.shrink
    if extend is not None and prefix_len > 0:
        P = prefix_len
        tokens, lengths, _ = pad([p[P:] for p in prompts], max_new)
        S = stream_slots(prompts, max_new, P)
        nxt, ti, tv, lg, state = extend(tuple(int(t) for t in prompts[0][:P]), tokens, lengths, S, k, want_logits)
        pos = lengths + P
        _log_prefix(log, P)
    else:
        tokens, lengths, S = pad(prompts, max_new)
        nxt, ti, tv, lg, state = prefill(tokens, lengths, S, k, want_logits)
        pos = lengths.copy()
    ids: list[list[int]] = [[] for _ in range(n)]
    tops_i: list[list] = [[] for _ in range(n)]
    tops_v: list[list] = [[] for _ in range(n)]
    logits: list[list] = [[] for _ in range(n)]
    done = [False] * n
    slot_row: list[int | None] = [r if r < n else None for r in range(len(lengths))]  # batch slot -> prompt
    for step in range(max_new):
        nxt_h, ti_h, tv_h = np.asarray(nxt), np.asarray(ti), np.asarray(tv)
        lg_h = np.asarray(lg) if want_logits else None
        was_done = sum(done)
        for s, r in enumerate(slot_row):
            if r is None or done[r]:
                continue
            ids[r].append(int(nxt_h[s]))
            tops_i[r].append(ti_h[s])
            tops_v[r].append(tv_h[s])
            if want_logits:
                logits[r].append(lg_h[s])
            done[r] = int(nxt_h[s]) in stop or bool(stop_check and stop_check(ids[r]))
        if step < max_new - 1:
            _log_finished(log, sum(done) - was_done, sum(done) - was_done, n - sum(done))
        if all(done) or step == max_new - 1:
            break
        live = [s for s, r in enumerate(slot_row) if r is not None and not done[r]]
        if shrink is not None and len(live) <= len(slot_row) // 2:
            if log is not None:
                log.hit("shrink")
            B = next_pow2(len(live))
            keep = np.array(live + [live[0]] * (B - len(live)), np.int32)  # padding repeats a live row
            state = shrink(state, keep)
            nxt_h, pos = nxt_h[keep], pos[keep]
            slot_row = [slot_row[s] for s in live] + [None] * (B - len(live))
            nxt = nxt_h
        nxt, ti, tv, lg, state = decode(nxt, pos.copy(), state, k, want_logits)
        pos += 1
    return [Generation(list(map(int, prompts[r])), ids[r], np.stack(tops_i[r]), np.stack(tops_v[r]),
                       "stop" if done[r] else "length", np.stack(logits[r]) if want_logits else None)
            for r in range(n)]


def forced_batch(steps: Steps, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                 log: PathLog | None = None) -> list[np.ndarray]:
    """Per row logits [N, V]: row j predicts continuation[j] from prompt + continuation[:j].
    With shrink(state, keep) (the engine's gather of cache rows), a prompt that several rows share (a
    multiple-choice question's context, once per choice) is prefilled once and its cache row copied."""
    n, prefill, decode, shrink = len(prompts), steps.prefill, steps.decode, steps.shrink
    n_max = max(len(x) for x in continuations)
    if log is not None:
        log.hit("teacher_forced")
    first: dict[tuple, int] = {}
    owner = [first.setdefault(tuple(p), len(first)) for p in prompts]  # row -> its unique prompt
    if shrink is not None and len(first) < n:
        unique = [list(p) for p in first]
        tokens, lengths, S = pad(unique, n_max)
        *_, lg, state = prefill(tokens, lengths, S, 1, True)
        keep = np.array(owner + [owner[0]] * (next_pow2(n) - n), np.int32)  # padding repeats row 0
        state, lg, lengths = shrink(state, keep), np.asarray(lg)[keep], lengths[keep]
    else:
        tokens, lengths, S = pad(prompts, n_max)
        *_, lg, state = prefill(tokens, lengths, S, 1, True)
    forced = np.zeros((len(lengths), n_max), np.int32)
    for r, x in enumerate(continuations):
        forced[r, :len(x)] = x
    steps = [np.asarray(lg)]
    for j in range(n_max - 1):
        *_, lg, state = decode(forced[:, j], lengths + j, state, 1, True)
        steps.append(np.asarray(lg))
    stacked = np.stack(steps, axis=1)  # [B, n_max, V]
    return [stacked[r, :len(continuations[r])] for r in range(n)]


def greedy_all(steps: Steps, prompts: Sequence[Sequence[int]], max_new: int, stop_ids: Sequence[int], k: int,
               want_logits: bool, max_rows: int, stop_check: Callable | None = None,
               on_result: Callable | None = None, invariant: bool = False,
               log: PathLog | None = None) -> list[Generation]:
    """Every prompt, greedily: with insert (the engine's cache-row write), by greedy_stream's continuous
    batching; without, by greedy_batch in calls bounded by max_rows and the prefill token budget
    (on_result then called per call). When the engine offers extend and the prompts share a prefix of
    MIN_SHARED_PREFIX tokens or more, the prefix is not recomputed per row. invariant: see greedy_stream
    (it needs insert)."""
    if invariant and steps.insert is None:
        raise ValueError("a batch-invariant greedy_all needs the engine's insert hook")
    P = common_prefix(prompts) if steps.extend is not None and len(prompts) > 1 and not invariant else 0
    P = P if P >= MIN_SHARED_PREFIX else 0
    stop = {int(s) for s in stop_ids}
    if steps.insert is not None:
        from engines.stream import greedy_stream  # continuous batching; it builds on this module

        return greedy_stream(steps, prompts, max_new, stop, k, want_logits, max_rows, P, stop_check, on_result,
                             invariant, log)
    out: list[Generation] = []
    for idx in batches([len(p) - P for p in prompts], max_rows):
        compile_cache.relieve_maps()  # a long run of many shapes: its programs' memory maps kept under the limit
        gens = greedy_batch(steps, [prompts[i] for i in idx], max_new, stop, k, want_logits, P, stop_check, log)
        out.extend(gens)
        for i, g in zip(idx, gens):
            if on_result is not None:
                on_result(i, g)
    return out


def forced_all(steps: Steps, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
               max_rows: int, log: PathLog | None = None) -> list[np.ndarray]:
    """forced_batch over every prompt, in calls bounded by max_rows and the prefill token budget (steps: prefill,
    decode, and shrink where a context several rows share is prefilled once)."""
    out: list[np.ndarray] = []
    for idx in batches([len(p) for p in prompts], max_rows):
        compile_cache.relieve_maps()
        out.extend(forced_batch(steps, [prompts[i] for i in idx], [continuations[i] for i in idx], log))
    return out


def forced_split(prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> tuple[list, list, list]:
    """forced_from_decode's rows: (what is prefilled, what decode steps feed, leading logit rows to drop) per row."""
    pre, cont, drop = [], [], []
    for p, x in zip(prompts, continuations):
        two = len(p) >= 2
        pre.append(list(p[:-1]) if two else list(p))
        cont.append(([int(p[-1])] if two else []) + [int(t) for t in x])
        drop.append(1 if two else 0)
    return pre, cont, drop


def forced_from_decode(decode_forced: Callable, prompts: Sequence[Sequence[int]],
                       continuations: Sequence[Sequence[int]], k: int, want_logits: bool) -> list[Forced]:
    """engines.base.Engine.forced_topk for an engine with a teacher-forced decode loop
    (decode_forced(prompts, continuations) -> logits [N, V] per row): each prompt but its last token is
    prefilled, then that token and the continuation are fed by decode steps, so every continuation token
    is scored by the decode path (for a megakernel: by the kernel). A one-token prompt is prefilled as
    it is (its first continuation token then comes from the prefill)."""
    pre, cont, drop = forced_split(prompts, continuations)
    logits = decode_forced(pre, cont)
    return [Forced.from_logits(lg[d:], x, k, want_logits) for lg, d, x in zip(logits, drop, continuations)]
