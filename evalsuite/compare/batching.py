"""The batching part of `diff`: the engine driven the way a benchmark drives it.

diff's main part sends at most --batch prompts per call, with one token budget and no stop ids, so no row of
an engine ever finishes early, is refilled or dropped. Here every prompt goes into one generate call (more
prompts than the engine's max_batch, so a continuously batching engine must refill), with the tokenizer's
end-of-turn ids as stop ids and a staggered stop per prompt, so rows finish at different steps, refill in
groups and the batch shrinks; the longest prompt goes first, so the first admission is the largest prefill.
Then each group of prompts that share a prefix (SHARED_PREFIX_MIN tokens or more) goes as a call of its own,
so an engine that prefills a shared prefix once runs that path.

A staggered stop is a stop_check that ends prompt i once it has generated the first STAGGER[i] tokens of the
reference's own greedy track (or at an end-of-turn id on the way): where the engine agrees with the reference,
the row ends exactly there; where it does not, the row runs on and the divergence is judged. Each prompt's
tokens and every rank of its top-k are judged against the reference's track cut where the reference itself
stops (the one comparator, rule.compare_prompt, with ends=True), and compared with the engine's own output for
that prompt in the main part (its fixed batches).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engines.base import Forced, Generation
from evalsuite.compare import rule, text

# Shares of the token budget at which the staggered stops fall, two prompts at each (in the order sent): rows end
# in pairs, so a continuously batching engine refills two or more rows at once (a single-row refill hides a
# refill that scatters rows by the wrong index), and the last rows end alone, so the batch shrinks.
STAGGER = (0.25, 0.25, 0.5, 0.5, 0.75, 0.75, 1.0, 1.0, 0.375, 0.375, 0.625, 0.625, 0.875, 0.875)
# Prompts sharing at least this many leading tokens (each keeping one own token) are sent together once more:
# an engine may prefill the shared part once (engines/loop.py does from 32 tokens). Below it a shared prefix is
# a chat template's header, not worth a call.
SHARED_PREFIX_MIN = 16
# Where the prompts hold no prompt this long, a synthetic one is added, made of the set's own tokens: past the
# 512-slot window, and long enough that a full admission of it (8 rows of its 1,024 bucket) passes a 4,096-token
# prefill budget, so an engine splits its prefill (engines/loop.py does from 513 tokens).
LONG_PROMPT = 600
# Where no group shares LONG_PREFIX tokens, SYNTH_ROWS synthetic prompts are added that share SYNTH_PREFIX tokens
# (the set's own, then each of its shortest prompts): not a power of two, so a prefix kept at its bucket shows,
# and past the 32-token threshold engines/loop.py shares from.
LONG_PREFIX = 32
MIN_ROWS_FACTOR = 2  # the first call holds at least 2 x the engine's rows + 2 prompts (the set cycled to that)
SYNTH_PREFIX = 100
SYNTH_ROWS = 4


@dataclass(frozen=True)
class Call:
    """One generate call of the batching part: prompts (indices into the run's prompts) in the order sent, and
    the staggered stop of each (tokens of the reference's track after which its stop_check holds)."""

    name: str
    order: tuple[int, ...]
    stops: tuple[int, ...]
    shared_prefix: int = 0


def _stops(n_calls: int, budget: int) -> list[int]:
    return [max(1, round(budget * STAGGER[k % len(STAGGER)])) for k in range(n_calls)]


def prefix_groups(prompts: Sequence[Sequence[int]]) -> list[tuple[list[int], int]]:
    """Groups of 2+ prompts (indices, ascending) sharing >= SHARED_PREFIX_MIN leading tokens, each with the length
    they share, every prompt keeping one token of its own: neighbours in token order, a group grown while its
    common prefix stays long enough."""

    def lcp(a, b) -> int:
        n = min(len(a), len(b))
        d = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
        return int(d[0]) if d.size else n

    order = sorted(range(len(prompts)), key=lambda i: list(prompts[i]))
    groups: list[tuple[list[int], int]] = []
    cur, shared = [order[0]], len(prompts[order[0]]) - 1
    for i in order[1:]:
        c = min(shared, lcp(prompts[cur[0]], prompts[i]), len(prompts[i]) - 1)
        if c >= SHARED_PREFIX_MIN:
            cur, shared = cur + [i], c
            continue
        if len(cur) > 1:
            groups.append((sorted(cur), shared))
        cur, shared = [i], len(prompts[i]) - 1
    if len(cur) > 1:
        groups.append((sorted(cur), shared))
    return groups


def synthetic(prompts: Sequence[Sequence[int]], budget: int, max_context: int) -> list[tuple[str, list[int]]]:
    """(id, tokens) of the prompts added where the set lacks a long prompt or a long shared prefix (see
    LONG_PROMPT, SYNTH_PREFIX), each made of the set's own tokens; none where they would not fit the context."""
    pool = [int(t) for p in prompts for t in p]
    out: list[tuple[str, list[int]]] = []
    if max(len(p) for p in prompts) < LONG_PROMPT and LONG_PROMPT + budget <= max_context:
        out.append(("synthetic-long", (pool * (LONG_PROMPT // len(pool) + 1))[:LONG_PROMPT]))
    if not any(shared >= LONG_PREFIX for _, shared in prefix_groups(prompts)):
        head = (pool * (SYNTH_PREFIX // len(pool) + 1))[:SYNTH_PREFIX]
        short = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))[:SYNTH_ROWS]
        out += [(f"synthetic-prefix-{k + 1}", head + [int(t) for t in prompts[i]]) for k, i in enumerate(short)
                if SYNTH_PREFIX + len(prompts[i]) + budget <= max_context]
    return out


def plan(prompts: Sequence[Sequence[int]], budget: int, rows: int = 8, own: int | None = None,
         synthetic_prefix: Sequence[int] = ()) -> list[Call]:
    """The calls: every prompt at once, longest first, the list cycled until it holds more than twice the
    engine's rows (so a small set still makes it refill, in groups, and shrink); then each prefix group of the
    set's own prompts (the first `own`; prefix_groups), and the synthetic prefix prompts after them, if any, as a
    group of their own (indices synthetic_prefix: they share SYNTH_PREFIX tokens by construction, whatever else
    they share with the set)."""
    own = len(prompts) if own is None else own
    longest = int(np.argmax([len(p) for p in prompts]))
    order = [longest] + [i for i in range(len(prompts)) if i != longest]
    order = (order * (MIN_ROWS_FACTOR * rows // len(order) + 1))[:max(len(order), MIN_ROWS_FACTOR * rows + 2)]
    calls = [Call("all prompts", tuple(order), tuple(_stops(len(order), budget)))]
    groups = prefix_groups(prompts[:own])
    if len(synthetic_prefix) > 1:
        groups.append((list(synthetic_prefix), SYNTH_PREFIX))
    for k, (idx, shared) in enumerate(groups):
        calls.append(Call(f"shared prefix {k + 1} ({shared} tokens)", tuple(idx), tuple(_stops(len(idx), budget)),
                          shared))
    return calls


def expected_end(track: Sequence[int], stop: int, stop_ids: set[int], targets: set[tuple]) -> int:
    """Where the reference's own greedy run of this prompt ends under the call's stops: at its first stop id,
    or where its tokens so far are one of the call's stop_check targets (another prompt's may come first), or
    at its stop."""
    for j, t in enumerate(track[:stop]):
        if int(t) in stop_ids or tuple(track[:j + 1]) in targets:
            return j + 1
    return min(stop, len(track))


def cut(ref: Forced, n: int) -> Forced:
    """ref's first n positions."""
    return Forced(ref.token_logprobs[:n], np.asarray(ref.top_ids)[:n], np.asarray(ref.top_logprobs)[:n],
                  None if ref.logits is None else ref.logits[:n])


def _versus_main(eg: Generation, main: Generation | None) -> dict | None:
    """The engine's output for this prompt here against its output in the main part (fixed batches, no stop)."""
    if main is None:
        return None
    n = len(eg.token_ids)
    same = list(main.token_ids[:n]) == list(eg.token_ids)
    a, b = np.asarray(eg.top_logprobs, np.float64), np.asarray(main.top_logprobs, np.float64)[:n]
    both = ~(np.isnan(a) | np.isnan(b)) if same and a.size and a.shape == b.shape else None
    d = float(np.max(np.abs(a - b)[both])) if both is not None and both.any() else None
    return {"tokens_identical": same, "max_dlogprob": d}


def _judge_row(i: int, eg: Generation, n: int, call: str, lists, tol, tok, second_look) -> dict:
    """Prompt i's generation in a call, against the reference's track cut at n (where it stops); a flagged one
    judged again by second_look (the main part's witnesses)."""
    prompts, ids, tracks, refs, mains = lists
    how = text.resolve(tok, tracks[i][:n], eg, prefix=True)
    if how == "unresolved":
        return {"id": ids[i], "call": call, "compared_as": how, "real_positions": [],
                "note": "no token ids, and text that differs from the reference's and cannot be turned back into "
                        "ids: not judged"}
    rec = rule.compare_prompt(tracks[i][:n], cut(refs[i], n), None, eg, tol, ends=True)
    if rec["real_positions"] and second_look is not None:
        rec = second_look(prompts[i], tracks[i][:n], cut(refs[i], n), eg, rec)
    return {"id": ids[i], "call": call, "reference_end": n, "engine_end": len(eg.token_ids),
            "engine_finish": eg.finish_reason, "real_positions": rec["real_positions"],
            "first_divergence": rec["first_divergence"], "max_dlogprob": rec["tf"]["max_dlogprob"],
            "versus_main_part": _versus_main(eg, mains[i]),
            **{k: rec[k] for k in ("conditioning", "routing_flip", "routing_note") if k in rec}}


def run(eng, prompts: Sequence[Sequence[int]], ids: Sequence[str], tracks: Sequence[list[int]],
        refs: Sequence[Forced], mains: Sequence[Generation | None], budget: int, stop_ids: Sequence[int],
        tol: rule.Tolerances, tok=None, progress: Callable[[str], None] = lambda s: None, reference=None,
        max_context: int = 0, second_look: Callable | None = None) -> dict:
    """The batching part over one engine. tracks: the reference's greedy tokens per prompt (budget long), refs
    its records along them (full logits); mains: the engine's main-part generations; tok: the model's tokenizer, for
    an engine whose ids are rebuilt from text (text.resolve). reference (the float32 judge) and max_context: synthetic
    prompts are added where the set lacks a long prompt or a long shared prefix (synthetic()), their tracks
    from the reference. second_look(prompt, tokens, track, generation, record): a flagged row judged again as
    the main part judges its flagged prompts (witness.SecondLook). Returns the part's record: per call and per
    prompt, the judgement, and real mismatches."""
    t0 = time.time()
    added = synthetic(prompts, budget, max_context) if reference is not None else []
    if added:
        names = ", ".join(a for a, _ in added)
        progress(f"diff: batching part, the reference on {len(added)} synthetic prompts ({names})")
        gens = reference.generate([p for _, p in added], budget, top_k=5, want_logits=True)
        prompts, ids = list(prompts) + [p for _, p in added], list(ids) + [a for a, _ in added]
        tracks = list(tracks) + [g.token_ids for g in gens]
        refs, mains = list(refs) + [g.track() for g in gens], list(mains) + [None] * len(added)
    stop_set = {int(s) for s in stop_ids}
    calls, rows, real = [], [], 0
    own = len(prompts) - len(added)
    synth_prefix = [own + k for k, (a, _) in enumerate(added) if a.startswith("synthetic-prefix")]
    for call in plan(prompts, budget, eng.max_batch, own, synth_prefix):
        targets = {tuple(tracks[i][:s]) for i, s in zip(call.order, call.stops)}
        ends = [expected_end(tracks[i], s, stop_set, targets) for i, s in zip(call.order, call.stops)]
        progress(f"diff: batching part, {call.name}: {len(call.order)} prompts in one call, staggered stops")
        gens = eng.generate([prompts[i] for i in call.order], budget, stop_ids=sorted(stop_set), top_k=5,
                            stop_check=lambda got, t=targets: tuple(got) in t)
        lists = (prompts, ids, tracks, refs, mains)
        judged = [_judge_row(i, eg, n, call.name, lists, tol, tok, second_look)
                  for i, eg, n in zip(call.order, gens, ends)]
        rows += judged
        real += sum(len(r["real_positions"]) for r in judged)
        calls.append({"name": call.name, "prompts": len(call.order), "distinct": len(set(call.order)),
                      "shared_prefix": call.shared_prefix, "stops": sorted(set(call.stops)),
                      "flagged": sorted({r["id"] for r in judged if r["real_positions"]})})
    unresolved = [r["id"] for r in rows if r.get("compared_as") == "unresolved"]
    return {"calls": calls, "prompts": len(rows), "real_mismatches": real, "unresolved": unresolved,
            "synthetic": [{"id": a, "tokens": len(p)} for a, p in added], "per_prompt": rows,
            "stop_ids": sorted(stop_set), "stagger": list(STAGGER), "seconds": round(time.time() - t0, 1)}
