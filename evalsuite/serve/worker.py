"""The batching worker of `evalsuite serve`: requests queue; one worker batches those that arrive within
BATCH_WAIT_S and share (max_tokens, stop strings, logprobs k, ignore_eos) into engine calls of at most
the engine's max_batch rows, all on one thread, so rows never mix."""

from __future__ import annotations

import asyncio
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


class Server:
    """The engine, its tokenizer, and the batching worker."""

    def __init__(self, engine, model, served_name: str):
        self.engine, self.model, self.name = engine, model, served_name
        self.tok = model.tokenizer
        self.ctx = model.config.max_context
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.queue: asyncio.Queue | None = None
        self.worker: asyncio.Task | None = None
        self.batches_run = 0
        self.created = int(time.time())

    # ---- the worker --------------------------------------------------------------------------
    async def start(self) -> None:
        self.queue = asyncio.Queue(maxsize=MAX_QUEUE)
        self.worker = asyncio.create_task(self._work())

    async def submit(self, job: Job):
        job.future = asyncio.get_running_loop().create_future()
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            raise APIError(503, f"server busy: {MAX_QUEUE} requests queued; retry later", "server_busy") from None
        return await job.future

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = [await self.queue.get()]
            await asyncio.sleep(BATCH_WAIT_S)
            while not self.queue.empty():
                jobs.append(self.queue.get_nowait())
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
                    self.batches_run += 1
                except Exception as e:  # one bad group must not stop the server
                    for j in group:
                        if not j.future.done():
                            j.future.set_exception(e)
                    continue
                for j in group:
                    n = len(j.prompts)
                    j.batched_with = min(len(rows), cap)
                    if not j.future.done():
                        j.future.set_result(gens[:n])
                    gens = gens[n:]

    def _generate(self, prompts, max_tokens, stops, k, ignore_eos):
        return self.engine.generate(prompts, max_tokens, stop_ids=() if ignore_eos else self.tok.eos_ids,
                                    top_k=max(k, 1), stop_check=stop_check(self.tok, stops))

    async def prompt_logprobs(self, ids: list[int], k: int, decode_from: int = 1):
        """Per prompt position t >= 1: (logprob of ids[t], top-k [(id, logprob)]). Positions from
        decode_from on come from the engine's decode path (forced_topk); those before it from a forward
        pass (score) where the engine has full logits, else from its decode path too."""
        if len(ids) < 2:
            return []
        s = min(max(1, decode_from), len(ids) - 1)
        loop = asyncio.get_running_loop()
        kk = max(k, 1)
        parts = []
        if s > 1 and self.engine.capabilities.logits:
            scored = await loop.run_in_executor(self.pool, self.engine.score, [ids[:s - 1]])
            parts.append(Forced.from_logits(scored[0].logits, ids[1:s], kk, keep_logits=False))
        elif s > 1:
            parts += await loop.run_in_executor(self.pool, self.engine.forced_topk, [ids[:1]], [ids[1:s]], kk)
        parts += await loop.run_in_executor(self.pool, self.engine.forced_topk, [ids[:s]], [ids[s:]], kk)
        out = []
        for f in parts:
            for j in range(len(f.token_logprobs)):
                out.append((float(f.token_logprobs[j]),
                            [(int(a), float(b)) for a, b in zip(f.top_ids[j][:kk], f.top_logprobs[j][:kk])]))
        return out


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
    return {"verdict": "FAIL" if bad else "PASS", "positions": len(g.token_ids), "real_positions": bad,
            "max_dlogprob": d, "detail": (f"generation and teacher-forced scoring of {len(g.token_ids)} tokens "
                                          f"{'disagree at positions ' + str(bad) if bad else 'agree'} "
                                          f"(max |Δlogprob| {d:.3g})")}
