"""`evalsuite serve`: an engine behind an OpenAI-compatible HTTP API in vLLM's request/response shapes.

Starlette app served by uvicorn. Endpoints: GET /health, GET /v1/models, POST /tokenize,
POST /detokenize, POST /v1/completions, POST /v1/chat/completions.

Greedy only: temperature absent or 0 (a request for sampling is a 400, never silently greedy).
Extensions to the OpenAI shapes (as vLLM's `return_token_ids`): every choice carries `token_ids`
(all generated ids, including any that produced a stop string or the end-of-turn id) and
`prompt_token_ids`; completions carry `evalsuite.batch_rows` (rows in the engine call that served
it) and their `logprobs` carry `top_logprobs_by_id` ([[id, logprob], ...] per position), since the
token-string keys of `top_logprobs` can collide.

Logprobs: those of generated tokens come from the engine's decode path, and so do echo's prompt
logprobs by default (teacher-forced through decode steps, `decode_forced`), so that a check over
the API exercises the path under test: a decode-only kernel bug shows in golden checks and
loglikelihood scores. The extension field `echo_decode_from` (int, default 1) prefills the first
positions instead (a client scoring a continuation sends the continuation's start). Each
response says which path produced its echo logprobs (`evalsuite.echo_path`, `echo_decode_from`).
The first prompt token has none (null).

Concurrency: requests queue; one worker batches those that arrive within BATCH_WAIT_S and share
(max_tokens, stop strings, logprobs k) into one engine call, and runs every engine call on one
thread, so rows never mix. Bounds: MAX_BODY_BYTES, MAX_TOKENS, MAX_PROMPTS, MAX_LOGPROBS,
MAX_QUEUE; violations are 4xx with an OpenAI-style error body, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from engines.errors import ModelError
from evalsuite.stops import cut_at_stop, stop_check, visible_text

MAX_BODY_BYTES = 1 << 20  # 1 MiB: a 2,048-token prompt as JSON ids is about 12 KB
MAX_TOKENS = 2048  # per request, and prompt + max_tokens must fit the model's context
MAX_PROMPTS = 64  # prompts in one /v1/completions request (lm-eval batches several)
MAX_LOGPROBS = 20  # as OpenAI's top_logprobs bound
MAX_QUEUE = 256  # waiting jobs beyond this get 503 (retry later) instead of unbounded memory
NEUTRAL_PENALTIES = {"frequency_penalty": 0, "presence_penalty": 0, "repetition_penalty": 1, "repeat_penalty": 1}
BATCH_WAIT_S = 0.01  # how long the worker waits for more requests to batch with the first


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


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
                cap = getattr(self.engine, "max_batch", 8)
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
        """Per prompt position t >= 1: (logprob of ids[t], top-k [(id, logprob)]). Positions after
        decode_from come from the engine's decode path (teacher-forced decode steps); ids[1..decode_from]
        from its prefill."""
        if len(ids) < 2:
            return []
        s = min(max(1, decode_from), len(ids) - 1)
        loop = asyncio.get_running_loop()
        forced = await loop.run_in_executor(self.pool, self.engine.decode_forced, [ids[:s]], [ids[s:]])
        rows = [forced[0]]
        if s > 1:
            scored = await loop.run_in_executor(self.pool, self.engine.score, [ids[:s - 1]])
            rows.insert(0, scored[0].logits)
        lg = np.concatenate(rows).astype(np.float64)
        z = lg - lg.max(axis=-1, keepdims=True)
        lp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        out = []
        for t in range(1, len(ids)):
            row = lp[t - 1]
            top = np.argsort(-row)[:max(k, 1)]
            out.append((float(row[ids[t]]), [(int(i), float(row[i])) for i in top]))
        return out

    # ---- request parsing ---------------------------------------------------------------------
    def check_model(self, body: dict) -> None:
        m = body.get("model")
        if m is not None and m != self.name:
            raise APIError(404, f"The model `{m}` does not exist; this server serves `{self.name}`",
                           "NotFoundError", "model")

    def sampling(self, body: dict, default_max: int) -> tuple[int, tuple[str, ...]]:
        """(max_tokens, stop strings) of a completion request; 400 for what greedy serving refuses."""
        if body.get("stream"):
            raise APIError(400, "stream is not supported", param="stream")
        t = body.get("temperature", 0)
        if not isinstance(t, (int, float)) or t != 0:
            raise APIError(400, f"temperature {t!r}: this server decodes greedily only (temperature 0)",
                           param="temperature")
        if body.get("n", 1) != 1:
            raise APIError(400, "n must be 1 (greedy decoding gives one answer)", param="n")
        for name, neutral in NEUTRAL_PENALTIES.items():  # accepted only where they change nothing
            v = body.get(name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v != neutral):
                raise APIError(400, f"{name} {v!r}: this server decodes greedily only ({name} must be {neutral})",
                               param=name)
        mt = body.get("max_tokens", body.get("max_completion_tokens", default_max))
        if mt is None:
            mt = default_max
        if not isinstance(mt, int) or isinstance(mt, bool) or not 0 <= mt <= MAX_TOKENS:
            raise APIError(400, f"max_tokens must be an integer in [0, {MAX_TOKENS}], got {mt!r}", param="max_tokens")
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 8:
            raise APIError(400, "stop must be a string or a list of at most 8 strings", param="stop")
        return mt, tuple(s for s in stop if s)

    def prompt_ids(self, prompt) -> list[list[int]]:
        """OpenAI's prompt forms: a string, a list of ids, or a list of either."""
        if isinstance(prompt, str):
            items = [prompt]
        elif isinstance(prompt, list) and prompt and all(_is_int(x) for x in prompt):
            items = [prompt]
        elif isinstance(prompt, list) and prompt:
            items = prompt
        else:
            raise APIError(400, "prompt must be a non-empty string, list of token ids, or list of those",
                           param="prompt")
        if len(items) > MAX_PROMPTS:
            raise APIError(400, f"at most {MAX_PROMPTS} prompts per request, got {len(items)}", param="prompt")
        out = []
        V = self.model.config.vocab_size
        for x in items:
            if isinstance(x, str):
                ids = self.tok.encode(x)
            elif isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x):
                bad = [t for t in x if not 0 <= t < V]
                if bad:
                    raise APIError(400, f"token id {bad[0]} outside the vocabulary [0, {V})", param="prompt")
                ids = list(x)
            else:
                raise APIError(400, "each prompt must be a string or a list of integer token ids", param="prompt")
            if not ids:
                raise APIError(400, "empty prompt", param="prompt")
            out.append(ids)
        return out

    def check_length(self, prompts: list[list[int]], max_tokens: int) -> None:
        for ids in prompts:
            if len(ids) + max_tokens > self.ctx:
                raise APIError(400, f"This model's maximum context length is {self.ctx} tokens. However, you "
                                    f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the prompt, "
                                    f"{max_tokens} for the completion).", param="prompt")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def build_app(engine, model, served_name: str, info: dict | None = None):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    srv = Server(engine, model, served_name)
    tok = srv.tok

    def error(e: APIError) -> JSONResponse:
        return JSONResponse({"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.status}},
                            status_code=e.status)

    async def body_of(request: Request) -> dict:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise APIError(413, f"request body of {declared} bytes exceeds {MAX_BODY_BYTES}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise APIError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks) or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"request body is not valid JSON ({e.msg if hasattr(e, 'msg') else e})") from None
        if not isinstance(body, dict):
            raise APIError(400, "request body must be a JSON object")
        return body

    def endpoint(fn):
        async def wrapped(request: Request):
            try:
                return await fn(request)
            except APIError as e:
                return error(e)
            except ModelError as e:
                return error(APIError(400, str(e)))
            except Exception as e:  # never a traceback to the client, never a dead server
                print(f"serve: {request.url.path}: {type(e).__name__}: {e}", file=sys.stderr)
                return error(APIError(500, f"internal error: {type(e).__name__}", "internal_error"))
        return wrapped

    async def health(request: Request):
        return Response(status_code=200)

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{
            "id": srv.name, "object": "model", "created": srv.created, "owned_by": "evalsuite",
            "root": model.name, "max_model_len": srv.ctx, "evalsuite": info or {}}]})

    async def tokenize(request: Request):
        body = await body_of(request)
        srv.check_model(body)
        if "messages" in body:
            ids = tok.encode(tok.render_chat(_messages(body), body.get("add_generation_prompt", True)))
        elif isinstance(body.get("prompt"), str):
            ids = tok.encode(body["prompt"])
        else:
            raise APIError(400, "tokenize needs `prompt` (a string) or `messages`", param="prompt")
        return JSONResponse({"count": len(ids), "max_model_len": srv.ctx, "tokens": ids})

    async def detokenize(request: Request):
        body = await body_of(request)
        srv.check_model(body)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise APIError(400, "detokenize needs `tokens`, a list of integer ids", param="tokens")
        V = model.config.vocab_size
        if any(not 0 <= t < V for t in ids):
            raise APIError(400, f"token id outside the vocabulary [0, {V})", param="tokens")
        return JSONResponse({"prompt": tok.decode(ids)})

    async def completions(request: Request):
        body = await body_of(request)
        srv.check_model(body)
        max_tokens, stops = srv.sampling(body, 16)
        prompts = srv.prompt_ids(body.get("prompt"))
        echo = bool(body.get("echo", False))
        decode_from = body.get("echo_decode_from", 1)
        if not isinstance(decode_from, int) or isinstance(decode_from, bool) or decode_from < 1:
            raise APIError(400, "echo_decode_from must be an integer >= 1", param="echo_decode_from")
        k = body.get("logprobs")
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_LOGPROBS):
            raise APIError(400, f"logprobs must be an integer in [0, {MAX_LOGPROBS}]", param="logprobs")
        if max_tokens == 0 and not echo:
            raise APIError(400, "max_tokens 0 is only meaningful with echo", param="max_tokens")
        srv.check_length(prompts, max_tokens)
        ignore_eos = bool(body.get("ignore_eos", False))
        job = Job(prompts, max_tokens, stops, k or 0, ignore_eos)
        gens = await srv.submit(job) if max_tokens else [None] * len(prompts)
        choices, n_gen = [], 0
        for i, (ids, g) in enumerate(zip(prompts, gens)):
            gen_ids = g.token_ids if g is not None else []
            n_gen += len(gen_ids)
            text, hit = cut_at_stop(visible_text(tok, gen_ids), stops)
            finish = "stop" if hit or (g is not None and g.finish_reason == "stop") else "length"
            lp = None
            if k is not None:
                toks, tlps, tops, by_id, offsets = [], [], [], [], []
                pos = 0
                if echo:
                    pl = await srv.prompt_logprobs(ids, k, decode_from)
                    for t, tid in enumerate(ids):
                        s = tok.decode([tid])
                        toks.append(s)
                        offsets.append(pos)
                        pos += len(s)
                        if t == 0:
                            tlps.append(None), tops.append(None), by_id.append(None)
                        else:
                            lpv, top = pl[t - 1]
                            tlps.append(lpv)
                            tops.append({tok.decode([a]): b for a, b in top[:k]} if k else {})
                            by_id.append([[a, b] for a, b in top[:k]])
                for j, tid in enumerate(gen_ids):
                    s = tok.decode([tid])
                    toks.append(s)
                    offsets.append(pos)
                    pos += len(s)
                    tlps.append(float(g.top_logprobs[j][0]))
                    top = list(zip(g.top_ids[j][:k].tolist(), g.top_logprobs[j][:k].tolist()))
                    tops.append({tok.decode([a]): float(b) for a, b in top})
                    by_id.append([[int(a), float(b)] for a, b in top])
                lp = {"text_offset": offsets, "token_logprobs": tlps, "tokens": toks, "top_logprobs": tops,
                      "top_logprobs_by_id": by_id}
            choices.append({"index": i, "text": (tok.decode(ids) if echo else "") + text, "logprobs": lp,
                            "finish_reason": finish, "stop_reason": hit, "token_ids": gen_ids,
                            "prompt_token_ids": ids})
        n_prompt = sum(len(p) for p in prompts)
        return JSONResponse({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                             "model": srv.name, "choices": choices,
                             "evalsuite": {"batch_rows": job.batched_with, "echo_path": "decode" if echo else None,
                                           "echo_decode_from": decode_from if echo else None},
                             "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_gen,
                                       "total_tokens": n_prompt + n_gen}})

    async def chat(request: Request):
        body = await body_of(request)
        srv.check_model(body)
        max_tokens, stops = srv.sampling(body, 256)
        if max_tokens == 0:
            raise APIError(400, "max_tokens must be >= 1", param="max_tokens")
        want_lp = bool(body.get("logprobs", False))
        k = body.get("top_logprobs") or 0
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_LOGPROBS:
            raise APIError(400, f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}]", param="top_logprobs")
        ids = tok.encode(tok.render_chat(_messages(body), True))
        srv.check_length([ids], max_tokens)
        g = (await srv.submit(Job([ids], max_tokens, stops, k if want_lp else 0,
                                  bool(body.get("ignore_eos", False)))))[0]
        text, hit = cut_at_stop(visible_text(tok, g.token_ids), stops)
        content_lp = None
        if want_lp:
            content_lp = [{"token": tok.decode([t]), "logprob": float(g.top_logprobs[j][0]),
                           "bytes": list(tok.decode([t]).encode()),
                           "top_logprobs": [{"token": tok.decode([int(a)]), "logprob": float(b), "id": int(a)}
                                            for a, b in zip(g.top_ids[j][:k], g.top_logprobs[j][:k])]}
                          for j, t in enumerate(g.token_ids)]
        return JSONResponse({"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                             "created": int(time.time()), "model": srv.name,
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                          "logprobs": {"content": content_lp} if want_lp else None,
                                          "finish_reason": "stop" if hit or g.finish_reason == "stop" else "length",
                                          "stop_reason": hit, "token_ids": g.token_ids}],
                             "prompt_token_ids": ids,
                             "usage": {"prompt_tokens": len(ids), "completion_tokens": len(g.token_ids),
                                       "total_tokens": len(ids) + len(g.token_ids)}})

    routes = [Route("/health", endpoint(health), methods=["GET"]),
              Route("/v1/models", endpoint(models), methods=["GET"]),
              Route("/tokenize", endpoint(tokenize), methods=["POST"]),
              Route("/detokenize", endpoint(detokenize), methods=["POST"]),
              Route("/v1/completions", endpoint(completions), methods=["POST"]),
              Route("/v1/chat/completions", endpoint(chat), methods=["POST"])]
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        await srv.start()
        yield
        srv.worker.cancel()
        srv.pool.shutdown(wait=False, cancel_futures=True)

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.server = srv
    return app


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs):
        raise APIError(400, "messages must be a non-empty list of {role, content} objects with string content",
                       param="messages")
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def serve(engine_name: str, model_name: str, dtype: str, fault: str | None, host: str, port: int,
          served_name: str | None = None) -> None:
    import uvicorn

    from evalsuite.engines import make_engine
    from evalsuite.registry import load_model

    model = load_model(model_name)
    if model.tokenizer is None:
        raise ModelError(f"model {model_name} has no tokenizer: the API needs one")
    engine = make_engine(engine_name, model, dtype, fault)
    name = served_name or model_name
    info = {"engine": engine_name, "dtype": dtype, "fault": fault, "weights_sha256": model.weights.sha256,
            "fingerprint": engine.fingerprint, "echo_path": "decode"}
    app = build_app(engine, model, name, info)
    print(f"serve: {engine_name} ({dtype}, fault={fault}) serving {name} on http://{host}:{port}/v1",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
