"""The batching workers of `evalsuite serve`: requests queue; one worker batches those that arrive within
BATCH_WAIT_S and share (max_tokens, stop strings, logprobs k, ignore_eos) into engine calls of at most
the engine's max_batch rows; a second batches the teacher-forced (echo) scoring of concurrent requests
into one forced_topk call the same way. Both run the engine on one thread, so calls never overlap."""

from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from engines.base import Forced
from evalsuite.serve.parse import MAX_QUEUE, APIError
from evalsuite.stops import stop_check

BATCH_WAIT_S = 0.01  # how long the worker waits for more requests to batch with the first


@dataclass
class Job:
    prompts: list[list[int]]
    max_tokens: int
    stops: tuple[str, ...]
    k: int  # logprobs asked (0: none)
    ignore_eos: bool = False  # vLLM's extension: run past the end-of-turn id
    future: asyncio.Future = field(default=None)
    batched_with: int = 0  # rows of the engine batch this job ran in (reported as evalsuite.batch_rows)


@dataclass
class ForcedJob:
    """One echo request's decode-path part: the engine teacher-forced along cont after prefix."""
    prefix: list[int]
    cont: list[int]
    k: int
    future: asyncio.Future = field(default=None)
    batched_with: int = 0  # rows of the forced_topk call it ran in (reported as evalsuite.echo_batch_rows)


def _enqueue(queue: asyncio.Queue, job) -> None:
    try:
        queue.put_nowait(job)
    except asyncio.QueueFull:
        raise APIError(503, f"server busy: {MAX_QUEUE} requests queued; retry later", "server_busy") from None


def _fail(jobs: list, e: Exception) -> None:
    for j in jobs:
        if not j.future.done():
            j.future.set_exception(e)


async def _arrived_together(queue: asyncio.Queue) -> list:
    """The next job, and every job queued within BATCH_WAIT_S of it."""
    jobs = [await queue.get()]
    await asyncio.sleep(BATCH_WAIT_S)
    while not queue.empty():
        jobs.append(queue.get_nowait())
    return jobs


class Server:
    """The engine, its tokenizer, and the batching workers."""

    def __init__(self, engine, model, served_name: str):
        self.engine, self.model, self.name = engine, model, served_name
        self.tok = model.tokenizer
        self.ctx = model.config.max_context
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.queue: asyncio.Queue | None = None
        self.worker: asyncio.Task | None = None
        self.forced_queue: asyncio.Queue | None = None
        self.forced_worker: asyncio.Task | None = None
        self.created = int(time.time())

    # ---- the worker --------------------------------------------------------------------------
    async def start(self) -> None:
        self.queue = asyncio.Queue(maxsize=MAX_QUEUE)
        self.worker = asyncio.create_task(self._work())
        self.forced_queue = asyncio.Queue(maxsize=MAX_QUEUE)
        self.forced_worker = asyncio.create_task(self._work_forced())

    def stop(self) -> None:
        for t in (self.worker, self.forced_worker):
            if t is not None:
                t.cancel()

    async def submit(self, job: Job):
        job.future = asyncio.get_running_loop().create_future()
        _enqueue(self.queue, job)
        return await job.future

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = await _arrived_together(self.queue)
            groups: dict[tuple, list[Job]] = {}
            for j in jobs:
                groups.setdefault((j.max_tokens, j.stops, j.k, j.ignore_eos), []).append(j)
            for (max_tokens, stops, k, ignore_eos), group in groups.items():
                rows = [p for j in group for p in j.prompts]
                cap = self.engine.max_batch
                try:
                    gens = []
                    for s in range(0, len(rows), cap):
                        gens += await loop.run_in_executor(self.pool, self._generate, rows[s:s + cap], max_tokens,
                                                           stops, k, ignore_eos)
                except Exception as e:  # one bad group must not stop the server
                    _fail(group, e)
                    continue
                for j in group:
                    n = len(j.prompts)
                    j.batched_with = min(len(rows), cap)
                    if not j.future.done():
                        j.future.set_result(gens[:n])
                    gens = gens[n:]

    async def _forced(self, prefix: list[int], cont: list[int], k: int) -> tuple[Forced, int]:
        """The engine teacher-forced along cont after prefix, and the rows of the call it ran in."""
        job = ForcedJob(prefix, cont, k, asyncio.get_running_loop().create_future())
        _enqueue(self.forced_queue, job)
        return await job.future, job.batched_with

    async def _work_forced(self) -> None:
        """Echo scoring of the requests that arrive together, in one forced_topk call per k (rows of
        different lengths are the engine's to pad; a faithful engine scores a row the same in any batch)."""
        loop = asyncio.get_running_loop()
        while True:
            jobs = await _arrived_together(self.forced_queue)
            by_k: dict[int, list[ForcedJob]] = {}
            for j in jobs:
                by_k.setdefault(j.k, []).append(j)
            cap = self.engine.max_batch
            for k, group in by_k.items():
                for s in range(0, len(group), cap):
                    part = group[s:s + cap]
                    try:
                        out = await loop.run_in_executor(self.pool, self.engine.forced_topk,
                                                         [j.prefix for j in part], [j.cont for j in part], k)
                    except Exception as e:  # one bad batch must not stop the server
                        _fail(part, e)
                        continue
                    for j, f in zip(part, out):
                        j.batched_with = len(part)
                        if not j.future.done():
                            j.future.set_result(f)

    def _generate(self, prompts, max_tokens, stops, k, ignore_eos):
        return self.engine.generate(prompts, max_tokens, stop_ids=() if ignore_eos else self.tok.eos_ids,
                                    top_k=max(k, 1), stop_check=stop_check(self.tok, stops))

    async def prompt_logprobs(self, ids: list[int], k: int, decode_from: int = 1,
                              first: int = 1) -> tuple[list[tuple[float, list] | None], int]:
        """Per prompt position t >= 1 (entry t - 1): (logprob of ids[t], top-k [(id, logprob)]), None before
        first (not computed), and the rows of the engine call that scored the decode-path part. Positions
        from decode_from on come from the engine's decode path (forced_topk); those before it from a
        forward pass (score) where the engine has full logits, else from its decode path too."""
        if len(ids) < 2:
            return [], 0
        first = min(max(1, first), len(ids) - 1)
        s = min(max(first, decode_from), len(ids) - 1)  # nothing before first is computed
        loop = asyncio.get_running_loop()
        kk = max(k, 1)
        parts = []
        if s > first and self.engine.capabilities.logits:
            scored = await loop.run_in_executor(self.pool, self.engine.score, [ids[:s - 1]])
            f = Forced.from_logits(scored[0].logits[first - 1:], ids[first:s], kk, keep_logits=False)
            parts.append(f)
        elif s > first:
            parts.append((await self._forced(ids[:first], ids[first:s], kk))[0])
        f, rows = await self._forced(ids[:s], ids[s:], kk)  # batched with concurrent requests
        parts.append(f)
        out: list = [None] * (first - 1)
        for f in parts:
            for j in range(len(f.token_logprobs)):
                out.append((float(f.token_logprobs[j]),
                            [(int(a), float(b)) for a, b in zip(f.top_ids[j][:kk], f.top_logprobs[j][:kk])]))
        return out, rows


SELF_CHECK_PROMPT = "The capital of France is"
SELF_CHECK_TOKENS = 8


def self_check(engine, tok) -> dict:
    """Before serving: the engine's free-running generation of a fixed prompt against its own
    teacher-forced scoring of the same tokens (forced_topk, what echo serves), through the one comparator
    (evalsuite/compare/rule.py) at the engine dtype's bounds. They must agree: echo logprobs that do not
    match what decoding produced (a decode-only or generation-loop bug, a misaligned echo) are caught
    here. INCONCLUSIVE where the engine offers no logprobs or no teacher-forced path."""
    from evalsuite.compare.rule import Tolerances, compare_prompt

    caps = engine.capabilities
    if not (caps.forced and caps.gen_logprobs):
        return {"verdict": "INCONCLUSIVE", "detail": "not checked: the engine offers no "
                + ("teacher-forced path" if not caps.forced else "generated-token logprobs")}
    ids = tok.encode(SELF_CHECK_PROMPT)
    g = engine.generate([ids], SELF_CHECK_TOKENS, top_k=5)[0]
    f = engine.forced_topk([ids], [g.token_ids], 5)[0]
    rec = compare_prompt(g.token_ids, g.track(), f, None, Tolerances.for_dtype(engine.dtype))
    bad = rec["real_positions"]
    d = rec["tf"]["max_dlogprob"]
    d = d if d is not None and math.isfinite(d) else None  # strict JSON in /v1/models: no inf, no NaN
    return {"verdict": "FAIL" if bad else "PASS", "positions": len(g.token_ids), "real_positions": bad,
            "max_dlogprob": d, "detail": (f"generation and teacher-forced scoring of {len(g.token_ids)} tokens "
                                          f"{'disagree at positions ' + str(bad) if bad else 'agree'} "
                                          f"(max |Δlogprob| {'not finite' if d is None else f'{d:.3g}'})")}
