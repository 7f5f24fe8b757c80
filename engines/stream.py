"""Continuous batching: every prompt decoded greedily with up to max_rows rows at once, a finished row's place
going to the next waiting prompt (engines.loop.greedy_all calls it for an engine with an insert step)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from engines import compile_cache
from engines.base import Generation, PathLog, next_pow2
from engines.loop import REFILL_SHARE, Steps, _log_finished, _log_prefix, batches, pad, stream_slots


class _Stream:
    """greedy_stream's state: the batch's rows (which prompt each holds, its next token and position), the
    prompts waiting, and each prompt's tokens so far."""

    def __init__(self, steps: Steps, prompts, max_new: int, stop: set[int], k: int, want_logits: bool, B: int, S: int,
                 P: int, stop_check, on_result, invariant: bool, log: PathLog | None):
        self.steps, self.prompts, self.max_new, self.stop, self.k = steps, prompts, max_new, stop, k
        self.want_logits, self.B, self.S, self.P = want_logits, B, S, P
        self.stop_check, self.on_result, self.invariant, self.log = stop_check, on_result, invariant, log
        n = len(prompts)
        self.pending = deque(range(n))
        self.state = None
        self.nxt = np.zeros(B, np.int32)
        self.pos = np.zeros(B, np.int32)  # a free row decodes token 0 at position 0: overwritten on refill
        self.slot_row: list[int | None] = [None] * B
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.tops_i: list[list] = [[] for _ in range(n)]
        self.tops_v: list[list] = [[] for _ in range(n)]
        self.logits: list[list] = [[] for _ in range(n)]
        self.stopped = [False] * n
        self.out: list[Generation | None] = [None] * n

    def record(self, s: int, tok: int, ti, tv, lg) -> None:
        """Row s's next token; a prompt that stops or reaches max_new frees its row."""
        r = self.slot_row[s]
        self.ids[r].append(int(tok))
        self.tops_i[r].append(ti)
        self.tops_v[r].append(tv)
        if self.want_logits:
            self.logits[r].append(lg)
        self.stopped[r] = int(tok) in self.stop or bool(self.stop_check and self.stop_check(self.ids[r]))
        if self.stopped[r] or len(self.ids[r]) >= self.max_new:
            self.out[r] = Generation(list(map(int, self.prompts[r])), self.ids[r], np.stack(self.tops_i[r]),
                                     np.stack(self.tops_v[r]), "stop" if self.stopped[r] else "length",
                                     np.stack(self.logits[r]) if self.want_logits else None)
            self.slot_row[s], self.nxt[s], self.pos[s] = None, 0, 0
            if self.on_result is not None:
                self.on_result(r, self.out[r])

    def admit(self) -> None:
        """Prefill waiting prompts into the free rows (split into calls by the prefill budget)."""
        P, log, prompts = self.P, self.log, self.prompts
        free = [s for s in range(self.B) if self.slot_row[s] is None]
        take = [self.pending.popleft() for _ in range(min(len(free), len(self.pending)))]
        calls = batches([len(prompts[i]) - P for i in take], 1 if self.invariant else len(take))
        if log is not None and len(calls) > 1:
            log.hit("prefill_split")
        for idx in calls:
            rows = [take[j] for j in idx]
            if P:
                tokens, lengths, _ = pad([prompts[i][P:] for i in rows], self.max_new)
                nx, ti, tv, lg, rows_state = self.steps.extend(tuple(int(t) for t in prompts[0][:P]), tokens,
                                                                  lengths, self.S, self.k, self.want_logits)
            else:
                tokens, lengths, _ = pad([prompts[i] for i in rows], self.max_new)
                nx, ti, tv, lg, rows_state = self.steps.prefill(tokens, lengths, self.S, self.k, self.want_logits)
            m, R = len(rows), len(lengths)
            where, free = free[:m], free[m:]
            if log is not None:
                log.shape("prefill_bucket", tokens.shape[1])
                if self.state is not None:  # into a batch that has run: a refill
                    log.hit("refill", m)
                    if m >= 2:
                        log.hit("refill_group")
            self.state = self.steps.insert(self.state, rows_state, np.array(where + [where[-1]] * (R - m), np.int32),
                                              np.array(list(range(m)) + [m - 1] * (R - m), np.int32), self.B, self.S)
            nx_h, ti_h, tv_h = np.asarray(nx), np.asarray(ti), np.asarray(tv)
            lg_h = np.asarray(lg) if self.want_logits else None
            for j, (s, r) in enumerate(zip(where, rows)):
                self.slot_row[s], self.nxt[s], self.pos[s] = r, nx_h[j], lengths[j] + P
                self.record(s, nx_h[j], ti_h[j], tv_h[j], lg_h[j] if self.want_logits else None)

    def shrink(self, live: list[int]) -> list[int]:
        """Keep only the live rows (the batch to the next power of two); returns their new slots."""
        if self.log is not None:
            self.log.hit("shrink")
        self.B = next_pow2(len(live))
        keep = np.array(live + [live[0]] * (self.B - len(live)), np.int32)  # padding repeats a live row
        self.state = self.steps.shrink(self.state, keep)
        self.nxt, self.pos = self.nxt[keep], self.pos[keep]
        self.slot_row = [self.slot_row[s] for s in live] + [None] * (self.B - len(live))
        self.nxt[len(live):], self.pos[len(live):] = 0, 0
        return list(range(len(live)))

    def step(self, live: list[int]) -> None:
        """One decode step of every row; the live ones' tokens recorded."""
        nx, ti, tv, lg, self.state = self.steps.decode(self.nxt.copy(), self.pos.copy(), self.state, self.k,
                                                          self.want_logits)
        self.pos[live] += 1
        nx_h, ti_h, tv_h = np.asarray(nx), np.asarray(ti), np.asarray(tv)
        lg_h = np.asarray(lg) if self.want_logits else None
        was = sum(self.stopped), sum(o is not None for o in self.out)
        for s in live:
            self.nxt[s] = nx_h[s]
            self.record(s, nx_h[s], ti_h[s], tv_h[s], lg_h[s] if self.want_logits else None)
        _log_finished(self.log, sum(o is not None for o in self.out) - was[1], sum(self.stopped) - was[0],
                      sum(r is not None for r in self.slot_row) + len(self.pending))


def greedy_stream(steps: Steps, prompts: Sequence[Sequence[int]], max_new: int, stop: set[int], k: int,
                  want_logits: bool, max_rows: int, prefix_len: int = 0, stop_check: Callable | None = None,
                  on_result: Callable | None = None, invariant: bool = False,
                  log: PathLog | None = None) -> list[Generation]:
    """Greedy decode of every prompt with continuous batching: up to max_rows rows decode together and a
    finished row's place goes to the next waiting prompt, so one long answer holds up one row, not a
    batch. Waiting prompts are prefilled (their shared prefix_len tokens through extend, as in
    greedy_batch) and insert(state, rows_state, where, src, batch, slots) writes row src[j] of their
    cache into batch row where[j] (state None: an empty cache of batch rows first). Once nothing waits,
    the batch shrinks as in greedy_batch. on_result(i, Generation) is called as prompt i finishes.
    invariant (a batch-invariant engine mode): every call has the same shape whatever the batch: always
    max_rows rows (no shrink), every prompt prefilled alone, no shared prefix."""
    n, P = len(prompts), prefix_len
    S = stream_slots(prompts, max_new, P)  # at least MIN_WINDOW: every window a multiple of one attention tile
    B = max_rows if invariant else min(next_pow2(min(n, max_rows)), max_rows)
    st = _Stream(steps, prompts, max_new, stop, k, want_logits, B, S, P, stop_check, on_result, invariant, log)
    _log_prefix(log, P)
    while True:
        free = sum(r is None for r in st.slot_row)
        if st.pending and (free == st.B or free * REFILL_SHARE >= st.B):
            compile_cache.relieve_maps()  # a long run of many shapes: its programs' memory maps kept under the limit
            st.admit()
        live = [s for s in range(st.B) if st.slot_row[s] is not None]
        if not live:
            if not st.pending:
                break
            continue
        if not st.pending and steps.shrink is not None and not invariant and len(live) <= st.B // 2:
            live = st.shrink(live)
        st.step(live)
    return st.out  # type: ignore[return-value]
