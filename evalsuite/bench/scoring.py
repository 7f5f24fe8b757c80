"""The judge scores the engine's answers instead of decoding its own, and the parity part of `run`.

Greedy decoding makes the judge's own answer cheap to know: feed the engine's answer (prompt + its generated ids)
through the judge in one teacher-forced pass (Engine.score_topk, the prefill path). Where the judge's argmax is the
engine's token at every position and its stop condition falls where the engine stopped, the judge's greedy answer
is the engine's, by induction, and it decodes nothing; from the first position where they part, the judge decodes
its own continuation. Where the judge's own top-1 and top-2 are too close for its prefill path to speak for its
decode path (TIE_GUARD), one decode step decides the position, as in the judge's own decoding.
`judge_answers` returns the judge's answers with how many tokens it scored and decoded.

The same records give the parity part: the one comparison rule (rule.compare_prompt) on every answer position of
every item, the engine's generation against the judge's greedy track, flagged items judged again with full logits
and the conditioning witness (witness.SecondLook). `parity` summarises it for the result file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engines.base import Forced, Generation
from evalsuite.compare import rule, witness

# Where the judge's top-1 and top-2 logprobs are closer than this, its prefill path does not speak for its decode
# path: the two differ by at most 1.91e-4 per logit (docs/rule.md's float32 floor: the reference's score path against
# its own KV-cache decode, 4,096 positions), so their argmaxes can differ only where the top-2 gap is under twice that
# (3.8e-4); the guard is the rule's float32 NOISE_TOL (1.6e-3, 8.4x the floor's 2x), the gap under which the rule
# itself calls a flip a near-tie. There the judge takes its token from a decode step, as its own decoding does.
TIE_GUARD = rule.NOISE_TOL["float32"]
FIRST_FAILURES = 10  # parity: the first failing items the report names


@dataclass(frozen=True)
class Answer:
    """The engine's answer to one request: prompt ids, generated ids (a stop id, when hit, ends them), its finish
    reason and, where it reported them, its top-k ids and logprobs at each generated position."""

    prompt: list[int]
    tokens: list[int]
    finish: str
    top_ids: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None
    ids_exact: bool = True

    def generation(self) -> Generation:
        n = len(self.tokens)
        ids = np.full((n, 1), -1, np.int64) if self.top_ids is None else np.asarray(self.top_ids, np.int64)
        lps = np.full((n, 1), np.nan) if self.top_logprobs is None else np.asarray(self.top_logprobs, np.float64)
        return Generation(list(self.prompt), list(self.tokens), ids, lps, self.finish, ids_exact=self.ids_exact)


@dataclass(frozen=True)
class Judged:
    """The judge's own greedy answer to a request (its generation: ids, top-k along them, finish), the engine
    positions it scored, the tokens it decoded itself, where it began decoding (None: it did not) and why."""

    generation: Generation
    scored: int
    decoded: int
    decoded_from: int | None
    why: str
    near_ties: int = 0  # positions a decode step decided (their prefill top-2 gap under TIE_GUARD)


def _stops(stop_ids: set[int], check: Callable | None, ids: list[int]) -> bool:
    return bool(ids) and (int(ids[-1]) in stop_ids or bool(check and check(ids)))


class _Walk:
    """One answer walked position by position (see judge_answers): where the judge's answer ends inside the engine's
    (end), or where it decodes from (start) and with which token its own path chose there (first, or None: its
    decoding picks it), its top-k row at each near-tie its decode path decided, and why."""

    def __init__(self, judge, a: Answer, f: Forced, max_new: int, stop_ids: set[int], check, k: int):
        self.end = self.start = self.first = None
        self.rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # position -> the decode path's (ids, logprobs)
        n = len(a.tokens)
        vals = np.asarray(f.top_logprobs, np.float64)
        for j in range(min(n, max_new)):
            top = int(f.top_ids[j, 0])
            if j > 0 and vals.shape[1] > 1 and vals[j, 0] - vals[j, 1] < TIE_GUARD:
                # a near-tie: the judge's own decoding takes position j from a decode step (position 0 from the
                # prompt's prefill, which the scoring pass is), so a decode step decides it here too
                d = judge.forced_topk([list(a.prompt) + list(a.tokens[:j])], [[int(a.tokens[j])]], k)[0]
                self.rows[j] = (np.asarray(d.top_ids)[0], np.asarray(d.top_logprobs, np.float64)[0])
                top = int(d.top_ids[0, 0])
                if top != int(a.tokens[j]):
                    self.start, self.first, self.why = j, top, "near-tie"
                    return
            elif top != int(a.tokens[j]):
                self.start, self.why = j, "disagreed"
                return
            if _stops(stop_ids, check, a.tokens[:j + 1]):
                self.end, self.why = j + 1, "agreed" if j + 1 == n else "engine went past the stop"
                return
        if n >= max_new:
            self.end, self.why = max_new, "agreed" if n == max_new else "engine went past its token budget"
        else:
            self.start, self.why = n, "engine stopped early"

    def track(self, f: Forced, upto: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The judge's top-k rows over the engine's first `upto` positions: the scoring pass's, a decode step's at
        each near-tie."""
        ids = np.asarray(f.top_ids[:upto], np.int64).reshape(upto, k if not upto else -1)[:, :k].copy()
        lps = np.asarray(f.top_logprobs[:upto], np.float64).reshape(upto, k if not upto else -1)[:, :k].copy()
        for j, (i, v) in self.rows.items():
            if j < upto:
                ids[j], lps[j] = i[:k], v[:k]
        return ids, lps


def judge_answers(judge, answers: Sequence[Answer], max_new: int, stop_ids: Sequence[int], check: Callable | None,
                  k: int = 5) -> list[Judged]:
    """The judge's greedy answer to each request, from the engine's answer: scored in one teacher-forced pass, decoded
    only from where it parts from the engine's (see the module docstring). check: the requests' stop check
    (evalsuite.stops.stop_check), applied to all generated ids as the engines apply it."""
    stop = {int(s) for s in stop_ids}
    forced = judge.score_topk([a.prompt for a in answers], [a.tokens for a in answers], k)
    walks = [_Walk(judge, a, f, max_new, stop, check, k) for a, f in zip(answers, forced)]
    out: list[Judged | None] = [None] * len(answers)
    for i, (a, f, w) in enumerate(zip(answers, forced, walks)):
        if w.start is None:
            ids, lps = w.track(f, w.end, k)
            fin = "stop" if _stops(stop, check, a.tokens[:w.end]) else "length"
            out[i] = Judged(Generation(list(a.prompt), list(a.tokens[:w.end]), ids, lps, fin), len(a.tokens), 0,
                            None, w.why, len(w.rows))
    fresh = [i for i, w in enumerate(walks) if w.start == 0]  # decoded from the prompt: one batched call
    gens: dict[int, Generation] = {}
    if fresh:
        for i, g in zip(fresh, judge.generate([answers[i].prompt for i in fresh], max_new, stop_ids=list(stop),
                                              top_k=k, stop_check=check)):
            gens[i] = g
    for i in [i for i, w in enumerate(walks) if w.start]:  # from inside the answer: one call each
        gens[i] = _decode_from(judge, answers[i], walks[i], max_new, stop, check, k)
    for i, g in gens.items():
        a, w = answers[i], walks[i]
        ids, lps = w.track(forced[i], w.start, k)
        ids = np.concatenate([ids, np.asarray(g.top_ids, np.int64)[:, :k]])
        lps = np.concatenate([lps, np.asarray(g.top_logprobs, np.float64)[:, :k]])
        out[i] = Judged(Generation(list(a.prompt), list(a.tokens[:w.start]) + list(g.token_ids), ids, lps,
                                   g.finish_reason), len(a.tokens), len(g.token_ids), w.start, w.why, len(w.rows))
    return out


def _decode_from(judge, a: Answer, w: _Walk, max_new: int, stop: set[int], check, k: int) -> Generation:
    """The judge's own continuation from position w.start of the engine's answer (its first token w.first where a
    decode step chose it at a near-tie)."""
    head = list(a.tokens[:w.start])
    if w.first is None:
        row_check = (lambda ids: check(head + list(ids))) if check else None
        return judge.generate([list(a.prompt) + head], max_new - w.start, stop_ids=list(stop), top_k=k,
                              stop_check=row_check)[0]
    ids, lps = w.rows[w.start]
    first = [w.first]
    if _stops(stop, check, head + first) or w.start + 1 >= max_new:
        return Generation(list(a.prompt) + head, first, ids[None, :k], lps[None, :k],
                          "stop" if _stops(stop, check, head + first) else "length")
    row_check = (lambda t: check(head + first + list(t))) if check else None
    g = judge.generate([list(a.prompt) + head + first], max_new - w.start - 1, stop_ids=list(stop), top_k=k,
                       stop_check=row_check)[0]
    return Generation(list(a.prompt) + head, first + list(g.token_ids),
                      np.concatenate([ids[None, :k], np.asarray(g.top_ids)[:, :k]]),
                      np.concatenate([lps[None, :k], np.asarray(g.top_logprobs, np.float64)[:, :k]]), g.finish_reason)


def judge_item(judge, a: Answer, rg: Generation, tol: rule.Tolerances, witnessed: list,
               visible: Callable[[list[int]], str] | None = None) -> dict:
    """The parity record of one item: the engine's answer against the judge's greedy track by the one rule; a flagged
    item judged again along the same tokens with the judge's full logits and the conditioning witness. visible(ids):
    the answer's text cut at the request's stop strings (a server that ends at a stop string drops it from its ids)."""
    eg = a.generation()
    track_ids = list(rg.token_ids)
    ends = rg.finish_reason == "stop"
    note = None
    if (visible is not None and a.finish == "stop" and len(a.tokens) < len(track_ids)
            and track_ids[:len(a.tokens)] == list(a.tokens) and visible(a.tokens) == visible(track_ids)):
        track_ids, ends = track_ids[:len(a.tokens)], False  # the same text: the server cut its stop string
        note = "the engine ended at a stop string its server cut from the ids; the text is the judge's"
    n = len(track_ids)
    track = Generation(rg.prompt_ids, track_ids, np.asarray(rg.top_ids)[:n], np.asarray(rg.top_logprobs)[:n],
                       rg.finish_reason).track()
    rec = rule.compare_prompt(track_ids, track, None, eg, tol, ends=ends)
    if rec["real_positions"] and n:  # the second look: full logits along the same tokens, then the witness
        prompt = list(a.prompt)
        logits = judge.score([prompt + track_ids[:-1]])[0].logits[len(prompt) - 1:]
        full = Forced.from_logits(logits, track_ids, np.asarray(rg.top_ids).shape[-1])
        rec = rule.compare_prompt(track_ids, full, None, eg, tol, ends=ends)
        if rec["real_positions"]:
            rec = witness.SecondLook(judge, None, None, tol, witnessed, None)(prompt, track_ids, full, eg, rec)
    if note:
        rec["note"] = note
    return rec


def parity(items: list[dict], judged: bool, why_not: str | None, tol: rule.Tolerances, witnessed: list,
           not_checked: list[str]) -> dict:
    """The run's parity part from per-item records ({"doc_id", "record": judge_item's, "positions"}). judged: a real
    mismatch FAILs the run (the engine claims the judge's model and numerics); else it is reported (why_not)."""
    real = [it for it in items if it["record"]["real_positions"]]
    first = []
    for it in real[:FIRST_FAILURES]:
        r = it["record"]
        fd = r.get("first_divergence") or {}
        at = min(r["real_positions"])
        first.append({"doc_id": it["doc_id"], "position": at,
                      "kind": "token" if at in r["token_mismatches"] else "distribution",
                      "token_mismatches": len(r["token_mismatches"]),
                      "distribution_mismatches": len(r["distribution_mismatches"]),
                      **{k: fd[k] for k in ("engine_token", "reference_token", "reference_gap", "note") if k in fd}})
    benign = sum(len(it["record"]["benign_positions"]) for it in items)
    return {"judged": judged, "why_not_judged": why_not, "items": len(items),
            "positions": sum(it["positions"] for it in items),
            "items_identical": sum(it["record"]["first_divergence"] is None for it in items),
            "items_failing": len(real), "real_mismatches": sum(len(it["record"]["real_positions"]) for it in real),
            "benign_divergences": benign, "first_failures": first, "not_checked": list(not_checked),
            "tolerances": {"logprob": tol.logprob, "noise": tol.noise, "dtype": tol.dtype},
            "conditioning_witness": witness.summary(witnessed, tol.dtype),
            "ok": not real and not not_checked,
            "rule": "the engine's greedy answer against the judge's greedy track, position by position, by the one "
                    "comparison rule (evalsuite/compare/rule.py): every rank of its reported top-k within LOGPROB_TOL "
                    "up to the first divergence, a divergence benign only at a near-tie, a stop where the judge stops"}
