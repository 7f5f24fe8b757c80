"""The speculative loop: draft, verify, accept greedily, roll back; rows refilled from a queue as they finish.

A row's state: its committed context (prompt + generated; the last token is the anchor, not yet in the cache)
and `start`, the anchor's position (the tokens the cache holds). A round feeds [anchor, d1..d(T-1)] at
start..start+T-1; row i of the verify step predicts the token after block token i, so `acc` = the leading drafts
equal to rows 0..acc-1's argmax; the committed tokens are those drafts and the bonus token (row acc's argmax),
and the cache keeps start..start+acc (the anchor and the accepted drafts).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from engines.base import Generation


def _block_offsets(T: int, fault: str | None) -> np.ndarray:
    off = np.arange(T)
    if fault == "draft_offset":  # the drafts one position too far: a gap after the anchor
        off[1:] += 1
    return off


class _Rows:
    """Per-prompt outputs and per-batch-row bookkeeping."""

    def __init__(self, n: int, B: int):
        self.ids = [[] for _ in range(n)]
        self.ti, self.tv, self.lg = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
        self.done = [False] * n
        self.stopped = [False] * n
        self.prompt_of: list[int | None] = [None] * B  # batch row -> prompt index
        self.ctx: list[list[int]] = [[] for _ in range(B)]
        self.start = np.zeros(B, np.int64)


def speculate(eng, draft, prompts, max_new: int, stop: set[int], k: int, want_logits: bool, stop_check, on_result,
              B: int, slots: int) -> list[Generation]:
    T, run, fault, st, log = eng.block, eng._run, eng.fault, eng.stats, eng._paths
    n = len(prompts)
    rows = _Rows(n, B)
    queue = deque(range(n))
    results: list[Generation | None] = [None] * n
    state = run.empty(B, slots)
    offsets = _block_offsets(T, fault)

    def commit(i: int, tok: int, ti, tv, lg) -> bool:
        """Append one token to prompt i's output; True when that ends it."""
        rows.ids[i].append(int(tok))
        rows.ti[i].append(ti)
        rows.tv[i].append(tv)
        if want_logits:
            rows.lg[i].append(lg)
        rows.stopped[i] = int(tok) in stop or bool(stop_check and stop_check(rows.ids[i]))
        rows.done[i] = rows.stopped[i] or len(rows.ids[i]) >= max_new
        return rows.done[i]

    def finish(r: int) -> None:
        i = rows.prompt_of[r]
        rows.prompt_of[r] = None
        g = Generation(list(map(int, prompts[i])), rows.ids[i], np.stack(rows.ti[i]), np.stack(rows.tv[i]),
                       "stop" if rows.stopped[i] else "length", np.stack(rows.lg[i]) if want_logits else None)
        results[i] = g
        if rows.stopped[i]:
            log.hit("stop")
        if on_result is not None:
            on_result(i, g)

    def admit(r: int) -> None:
        nonlocal state
        while queue:
            i = queue.popleft()
            nxt, ti, tv, lg, row_state = run.prefill(list(prompts[i]), slots, k, want_logits)
            state = run.put(state, row_state, r)
            rows.prompt_of[r] = i
            rows.start[r] = len(prompts[i])
            rows.ctx[r] = [int(t) for t in prompts[i]] + [nxt]
            if not commit(i, nxt, ti, tv, lg):
                draft.start(r, rows.ctx[r])
                return
            finish(r)  # its first token ended it; the row takes the next prompt

    for r in range(min(B, n)):
        admit(r)
    while any(i is not None for i in rows.prompt_of):
        live = [r for r in range(B) if rows.prompt_of[r] is not None]
        proposals = draft.propose(live, [rows.ctx[r] for r in live], T - 1)
        tokens = np.zeros((B, T), np.int64)
        for j, r in enumerate(live):
            tokens[r, 0], tokens[r, 1:] = rows.ctx[r][-1], proposals[j]
        positions = rows.start[:, None] + offsets[None, :]
        nxt, ti, tv, lg, after = run.feed(state, tokens, positions, np.full(B, T), k, want_logits)
        takes, ended = {}, []
        for j, r in enumerate(live):
            takes[r], new = _accept(nxt[r], proposals[j], T, fault, st, log)
            for tok, m in new:
                st.committed += 1
                if commit(rows.prompt_of[r], tok, ti[r, m], tv[r, m], None if lg is None else lg[r, m]):
                    ended.append(r)
                    break
            rows.ctx[r].extend(tok for tok, _ in new)
        state = _rolled_back(run, state, after, tokens, positions, takes, T, fault, st, B)
        for r, take in takes.items():
            rows.start[r] += T if fault == "no_rollback" else take + 1
        for r in ended:
            if len(ended) < len(live):
                log.hit("finish_mid_batch")
            finish(r)
            if queue:
                log.hit("refill")
                admit(r)
    return results


def _accept(nxt, drafts, T: int, fault, st, log) -> tuple[int, list[tuple[int, int]]]:
    """One row's greedy acceptance: (drafts kept, [(token, verify row it came from)] to commit: the kept drafts and
    the bonus token)."""
    acc = 0
    while acc < T - 1 and nxt[acc] == drafts[acc]:
        acc += 1
    _count(st, log, acc, T)
    take = min(acc + 1, T - 1) if fault == "accept_extra" else acc
    bonus = min(take + 1, T - 1) if fault == "bonus_row" else take
    return take, [(int(drafts[m]), m) for m in range(take)] + [(int(nxt[bonus]), bonus)]


def _count(st, log, acc: int, T: int) -> None:
    st.rounds += 1
    st.acc_hist[acc] += 1
    for m in range(acc):
        st.accepted_at[m] += 1
    log.hit("spec_accept_all" if acc == T - 1 else "spec_reject_first" if acc == 0 else "spec_partial")


def _rolled_back(run, before, after, tokens, positions, takes: dict, T: int, fault, st, B: int):
    """The state after each row's anchor and accepted drafts. A position-indexed cache is `after` as it is (the
    rejected drafts' slots lie past the next anchor and are overwritten before a query reaches them); a recurrent
    state is rolled back by the target (run.rolled_back: a replay or a snapshot), where any row rejected a draft."""
    if not run.recurrent or fault == "no_rollback" or all(t == T - 1 for t in takes.values()):
        return after
    lengths = np.ones(B, np.int64)
    for r, take in takes.items():
        lengths[r] = take + 1
    st.rollbacks += sum(1 for t in takes.values() if t < T - 1)
    return run.rolled_back(before, after, tokens, positions, lengths)
