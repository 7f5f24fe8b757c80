"""How fast a server is and how many requests it overlaps (measured at the probe), each request's deadline from
that, and requests fanned out at that concurrency with a console line while they wait."""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from engines.errors import ModelError
from engines.openai import parse
from engines.openai.probe import CANARY_TOKENS, Finding

# ---- pace: how many requests at once, how long each may take ------------------------------------------------
# Two identical requests sent together take at least this many times one alone on a server that runs one
# request at a time (2.0 ideally; measured with smollm2 here: transformers serve 2.0x, llama-cpp-python 0.3.36
# 1.8x), and about 1.0 on one that batches them (evalsuite serve on mini-llama: 1.1x); in between, a server is not
# treated as overlapping requests.
SERIAL_RATIO = 1.5
# Below this a pair is too quick for the ratio to mean anything (timer and loopback noise); such a server is fast
# enough that a few queued requests cost nothing.
PACE_MIN_S = 0.2
# Pairs sent, the fastest kept: evalsuite serve compiles on a new batch shape, and its first pair of a mini model
# measured 88x one request, the second 1.1x.
PACE_PAIRS = 2
PACE_PROMPT_REPEAT = 24  # the canary prompt this many times over: a prefill pace on about 200 tokens
# A request's deadline: this many times the time the server's measured pace says it needs (prefill + decode of
# every prompt in it), plus PACE_SLACK_S, and never under the client's TIMEOUT_S. Generous on purpose: a request
# that passes it is not sent again, so a deadline that is too short loses work; one too long only waits.
DEADLINE_FACTOR = 4.0
PACE_SLACK_S = 30.0
CHARS_PER_TOKEN = 3.0  # a text prompt's token count, estimated on the long side (English BPE: about 4)


def probe_pace(eng, f: dict, canary: dict) -> None:
    """The server's decode and prefill pace and whether it overlaps requests: the canary again (warm), a long
    prompt for one token, then the canary twice at once. Sets eng.tokens_per_s, eng.prefill_per_s and
    eng.concurrency."""
    body = eng.body(canary["prompt"], CANARY_TOKENS)
    t = time.monotonic()
    r = eng.completion_raw(body)
    one = time.monotonic() - t
    made = parse.counted(r, 1) or len(canary["ids"]) or CANARY_TOKENS
    eng.tokens_per_s = made / max(one, 1e-3)
    long_ids = list(canary["prompt"]) * PACE_PROMPT_REPEAT
    try:
        t = time.monotonic()
        eng.completion_raw(eng.body(long_ids, 1))
        eng.prefill_per_s = len(long_ids) / max(time.monotonic() - t, 1e-3)
    except ModelError:  # a server with a short context, or a prompt that does not survive as text
        eng.prefill_per_s = None
    two = float("inf")
    for _ in range(PACE_PAIRS):  # the fastest pair: the first may pay for a new batch shape (a JIT compile)
        t = time.monotonic()
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(lambda _: eng.completion_raw(body), range(2)))
        two = min(two, time.monotonic() - t)
    from engines.openai.client import CONCURRENT_REQUESTS

    serial = two >= PACE_MIN_S and two >= SERIAL_RATIO * one
    eng.concurrency = 1 if serial else CONCURRENT_REQUESTS
    pre = f", prefill about {eng.prefill_per_s:.0f} tokens/s" if eng.prefill_per_s else ""
    f["pace"] = Finding(True, f"about {eng.tokens_per_s:.1f} tokens/s decoding one request{pre}; two requests at once "
                              f"took {two / max(one, 1e-3):.1f}x one: "
                        + ("it runs one at a time, so the client sends one at a time" if serial else
                           f"it overlaps them, so the client sends up to {eng.concurrency} at once"))


def _prompt_tokens(p) -> int:
    if isinstance(p, str):
        return int(len(p) / CHARS_PER_TOKEN) + 1
    if isinstance(p, list) and p and isinstance(p[0], (list, str)):
        return sum(_prompt_tokens(x) for x in p)
    return len(p) if isinstance(p, list) else 1


def deadline(eng, body: dict) -> float:
    """Seconds a completion may take before it is given up (never sent again): from the pace measured at the
    probe; the client's TIMEOUT_S until the pace is known."""
    from engines.openai.client import TIMEOUT_S

    if not getattr(eng, "tokens_per_s", None):
        return TIMEOUT_S
    p = body.get("prompt")
    rows = len(p) if isinstance(p, list) and p and isinstance(p[0], (list, str)) else 1
    prefill = getattr(eng, "prefill_per_s", None) or eng.tokens_per_s
    need = _prompt_tokens(p) / prefill + rows * max(int(body.get("max_tokens") or 0), 1) / eng.tokens_per_s
    return max(TIMEOUT_S, DEADLINE_FACTOR * need + PACE_SLACK_S)


def _dur(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min"


def busy_line(eng, answered: int, total: int, running: int, queued: int, slowest: float, tokens_each: int) -> str:
    """The console's line while requests wait: "server busy: 2 of 5 answered, 1 running, 2 queued here; slowest
    4.1 min (about 40 s each at the probe's pace)"."""
    pace = (f" (about {_dur(tokens_each / eng.tokens_per_s)} each at the probe's {eng.tokens_per_s:.1f} tokens/s)"
            if getattr(eng, "tokens_per_s", None) else "")
    return (f"server busy: {answered} of {total} requests answered, {running} running, {queued} queued here; "
            f"slowest running for {_dur(slowest)}{pace}")


def fan_out(eng, fn, items: list, workers: int, tokens_each: int) -> list:
    """fn over items, `workers` requests in flight; every client.WAIT_REPORT_S while some are outstanding the console
    hears how many are answered, running and queued, and how long the slowest has run. The first error stops
    the rest (those not yet sent are never sent) and is raised."""
    from engines.openai import client  # its WAIT_REPORT_S, read at call time

    if len(items) <= 1:
        return [fn(x) for x in items]
    started: dict[int, float] = {}
    lock = threading.Lock()

    def job(i):
        with lock:
            started[i] = time.monotonic()
        try:
            return fn(items[i])
        finally:
            with lock:
                started.pop(i, None)

    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    futs = {pool.submit(job, i): i for i in range(len(items))}
    results: list = [None] * len(items)
    pending, last = set(futs), time.monotonic()
    try:
        while pending:
            done, pending = wait(pending, timeout=client.WAIT_REPORT_S, return_when=FIRST_COMPLETED)
            for f in done:
                results[futs[f]] = f.result()
            if pending and time.monotonic() - last >= client.WAIT_REPORT_S:
                last = time.monotonic()
                with lock:
                    running = sorted(started.values())
                eng.notify(busy_line(eng, len(items) - len(pending), len(items), len(running),
                                     len(pending) - len(running), last - running[0] if running else 0.0, tokens_each))
    except BaseException:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return results
