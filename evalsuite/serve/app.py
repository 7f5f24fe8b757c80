"""`evalsuite serve`: an engine behind an OpenAI-compatible HTTP API in vLLM's request/response shapes.

Starlette app served by uvicorn. Endpoints: GET /health, GET /v1/models, POST /tokenize,
POST /detokenize, POST /v1/completions, POST /v1/chat/completions.

Greedy only: temperature absent or 0 (a request for sampling is a 400, never silently greedy).
Extensions to the OpenAI shapes (as vLLM's `return_token_ids`): every choice carries `token_ids`
(all generated ids, including any that produced a stop string or the end-of-turn id) and
`prompt_token_ids`; completions carry `evalsuite.batch_rows` (rows in the engine call that served
it; `echo_batch_rows` for the teacher-forced call that scored an echo) and their `logprobs` carry
`top_logprobs_by_id` ([[id, logprob], ...] per position), since the token-string keys of
`top_logprobs` can collide.

Logprobs: those of generated tokens come from the engine's decode path, and so do echo's prompt
logprobs by default (teacher-forced through decode steps, `forced_topk`), so that a check over
the API exercises the path under test: a decode-only kernel bug shows in golden checks and
loglikelihood scores. The extension field `echo_decode_from` (int, default 1) prefills the first
positions instead (a client scoring a continuation sends the continuation's start). Each
response says which path produced its echo logprobs (`evalsuite.echo_path`, `echo_decode_from`).
The first prompt token has none (null), nor has any position before the extension field
`echo_logprobs_from` (int, default 1): those are not computed (a client scoring only a continuation
sends its start, and the server skips the prompt's forward pass).

Concurrency: requests queue; one worker batches those that arrive within BATCH_WAIT_S and share
(max_tokens, stop strings, logprobs k) into one engine call, a second batches concurrent echoes'
teacher-forced scoring into one forced_topk call, and every engine call runs on one thread, so
rows never mix. Bounds: MAX_BODY_BYTES, MAX_TOKENS, MAX_PROMPTS, MAX_LOGPROBS,
MAX_QUEUE; violations are 4xx with an OpenAI-style error body, and the server keeps serving.
"""

from __future__ import annotations

import sys
import time
import uuid

from engines.errors import ModelError
from evalsuite.serve import parse
from evalsuite.serve.parse import MAX_BODY_BYTES, MAX_LOGPROBS, APIError
from evalsuite.serve.worker import Job, Server, self_check
from evalsuite.stops import cut_at_stop, visible_text


def _int_field(body: dict, name: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    """An optional integer field in [lo, hi] (bools are not integers here), or a 400 naming it."""
    v = body.get(name, default)
    if v is None and default is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        rng = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise APIError(400, f"{name} must be an integer {rng}", param=name)
    return v


def _echo_rows(tok, ids, pl, k: int, pos: int, acc: dict) -> int:
    """Echo's prompt positions into the logprobs lists: the first token, and any before echo_logprobs_from, have
    none. Returns the text offset after the prompt."""
    for t, tid in enumerate(ids):
        s = tok.decode([tid])
        acc["tokens"].append(s)
        acc["text_offset"].append(pos)
        pos += len(s)
        if t == 0 or pl[t - 1] is None:
            for key in ("token_logprobs", "top_logprobs", "top_logprobs_by_id"):
                acc[key].append(None)
        else:
            lpv, top = pl[t - 1]
            acc["token_logprobs"].append(lpv)
            acc["top_logprobs"].append({tok.decode([a]): b for a, b in top[:k]} if k else {})
            acc["top_logprobs_by_id"].append([[a, b] for a, b in top[:k]])
    return pos


def _generated_rows(tok, g, k: int, pos: int, acc: dict) -> None:
    """The generated tokens into the logprobs lists (the engine's own decode-path logprobs)."""
    for j, tid in enumerate(g.token_ids if g is not None else []):
        s = tok.decode([tid])
        acc["tokens"].append(s)
        acc["text_offset"].append(pos)
        pos += len(s)
        acc["token_logprobs"].append(float(g.top_logprobs[j][0]))
        top = list(zip(g.top_ids[j][:k].tolist(), g.top_logprobs[j][:k].tolist()))
        acc["top_logprobs"].append({tok.decode([a]): float(b) for a, b in top})
        acc["top_logprobs_by_id"].append([[int(a), float(b)] for a, b in top])


class _Api:
    """The endpoints over one Server (its engine, tokenizer and queue)."""

    def __init__(self, engine, model, served_name: str, info: dict | None):
        self.engine, self.model, self.info = engine, model, info or {}
        self.srv = Server(engine, model, served_name)
        self.tok = self.srv.tok

    @staticmethod
    async def body_of(request) -> dict:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise APIError(413, f"request body of {declared} bytes exceeds {MAX_BODY_BYTES}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise APIError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
        return parse.json_body(b"".join(chunks))

    async def request_body(self, request) -> dict:
        body = await self.body_of(request)
        parse.check_model(body, self.srv.name)
        return body

    async def health(self, request):
        from starlette.responses import Response

        return Response(status_code=200)

    async def models(self, request):
        from starlette.responses import JSONResponse

        srv = self.srv
        return JSONResponse({"object": "list", "data": [{
            "id": srv.name, "object": "model", "created": srv.created, "owned_by": "evalsuite",
            "root": self.model.name, "max_model_len": srv.ctx, "evalsuite": self.info}]})

    async def tokenize(self, request):
        from starlette.responses import JSONResponse

        body, tok = await self.request_body(request), self.tok
        if "messages" in body:
            ids = tok.encode(tok.render_chat(parse.messages(body), body.get("add_generation_prompt", True)))
        elif isinstance(body.get("prompt"), str):
            ids = tok.encode(body["prompt"])
        else:
            raise APIError(400, "tokenize needs `prompt` (a string) or `messages`", param="prompt")
        return JSONResponse({"count": len(ids), "max_model_len": self.srv.ctx, "tokens": ids})

    async def detokenize(self, request):
        from starlette.responses import JSONResponse

        body = await self.request_body(request)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise APIError(400, "detokenize needs `tokens`, a list of integer ids", param="tokens")
        V = self.model.config.vocab_size
        if any(not 0 <= t < V for t in ids):
            raise APIError(400, f"token id outside the vocabulary [0, {V})", param="tokens")
        return JSONResponse({"prompt": self.tok.decode(ids)})

    async def _choice(self, i, ids, g, stops, k, echo, decode_from, logprobs_from) -> tuple[dict, int]:
        """One completion choice, and the rows of the teacher-forced call that scored its echo (0 without)."""
        tok, rows = self.tok, 0
        gen_ids = g.token_ids if g is not None else []
        text, hit = cut_at_stop(visible_text(tok, gen_ids), stops)
        finish = "stop" if hit or (g is not None and g.finish_reason == "stop") else "length"
        lp = None
        if k is not None:
            lp = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": [], "top_logprobs_by_id": []}
            pos = 0
            if echo:
                pl, rows = await self.srv.prompt_logprobs(ids, k, decode_from, logprobs_from)
                pos = _echo_rows(tok, ids, pl, k, pos, lp)
            _generated_rows(tok, g, k, pos, lp)
        return {"index": i, "text": (tok.decode(ids) if echo else "") + text, "logprobs": lp,
                "finish_reason": finish, "stop_reason": hit, "token_ids": gen_ids, "prompt_token_ids": ids}, rows

    async def completions(self, request):
        from starlette.responses import JSONResponse

        body, srv = await self.request_body(request), self.srv
        max_tokens, stops = parse.sampling(body, 16)
        prompts = parse.prompt_ids(body.get("prompt"), self.tok, self.model.config.vocab_size)
        echo = bool(body.get("echo", False))
        decode_from = _int_field(body, "echo_decode_from", 1, 1)
        logprobs_from = _int_field(body, "echo_logprobs_from", 1, 1)
        k = _int_field(body, "logprobs", None, 0, MAX_LOGPROBS)
        if max_tokens == 0 and not echo:
            raise APIError(400, "max_tokens 0 is only meaningful with echo", param="max_tokens")
        parse.check_length(prompts, max_tokens, srv.ctx)
        job = Job(prompts, max_tokens, stops, k or 0, bool(body.get("ignore_eos", False)))
        gens = await srv.submit(job) if max_tokens else [None] * len(prompts)
        choices, echo_rows = [], 0
        for i, (ids, g) in enumerate(zip(prompts, gens)):
            choice, rows = await self._choice(i, ids, g, stops, k, echo, decode_from, logprobs_from)
            choices.append(choice)
            echo_rows = max(echo_rows, rows)
        n_prompt, n_gen = sum(len(p) for p in prompts), sum(len(c["token_ids"]) for c in choices)
        return JSONResponse({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                             "model": srv.name, "choices": choices,
                             "evalsuite": {"batch_rows": job.batched_with,
                                           "echo_path": self.engine.capabilities.forced_path if echo else None,
                                           "echo_decode_from": decode_from if echo else None,
                                           "echo_batch_rows": echo_rows if echo else None},
                             "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_gen,
                                       "total_tokens": n_prompt + n_gen}})

    async def chat(self, request):
        from starlette.responses import JSONResponse

        body, srv, tok = await self.request_body(request), self.srv, self.tok
        max_tokens, stops = parse.sampling(body, 256)
        if max_tokens == 0:
            raise APIError(400, "max_tokens must be >= 1", param="max_tokens")
        want_lp = bool(body.get("logprobs", False))
        k = _int_field({"top_logprobs": body.get("top_logprobs") or 0}, "top_logprobs", 0, 0, MAX_LOGPROBS)
        ids = tok.encode(tok.render_chat(parse.messages(body), True))
        parse.check_length([ids], max_tokens, srv.ctx)
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


def _endpoint(fn):
    """A handler whose errors become OpenAI-style error bodies: never a traceback to the client, never a dead
    server."""
    from starlette.responses import JSONResponse

    def error(e: APIError) -> JSONResponse:
        return JSONResponse({"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.status}},
                            status_code=e.status)

    async def wrapped(request):
        try:
            return await fn(request)
        except APIError as e:
            return error(e)
        except ModelError as e:
            return error(APIError(400, str(e)))
        except Exception as e:
            print(f"serve: {request.url.path}: {type(e).__name__}: {e}", file=sys.stderr)
            return error(APIError(500, f"internal error: {type(e).__name__}", "internal_error"))
    return wrapped


def build_app(engine, model, served_name: str, info: dict | None = None):
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.routing import Route

    api = _Api(engine, model, served_name, info)
    srv = api.srv
    routes = [Route("/health", _endpoint(api.health), methods=["GET"]),
              Route("/v1/models", _endpoint(api.models), methods=["GET"]),
              Route("/tokenize", _endpoint(api.tokenize), methods=["POST"]),
              Route("/detokenize", _endpoint(api.detokenize), methods=["POST"]),
              Route("/v1/completions", _endpoint(api.completions), methods=["POST"]),
              Route("/v1/chat/completions", _endpoint(api.chat), methods=["POST"])]

    @asynccontextmanager
    async def lifespan(app):
        await srv.start()
        yield
        srv.stop()
        srv.pool.shutdown(wait=False, cancel_futures=True)

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.server = srv
    return app


def check_port(host: str, port: int) -> None:
    """A busy port is a one-line error before the model loads, not uvicorn's traceback after."""
    import socket

    from evalsuite.errors import SpecError

    try:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise SpecError(f"serve: cannot listen on {host}:{port} ({e.strerror})") from None


def serve(engine_name: str, model_name: str, dtype: str, fault: str | None, host: str, port: int,
          served_name: str | None = None, extra: dict | None = None) -> None:
    import uvicorn

    from evalsuite.errors import SpecError
    from evalsuite.models import load_model
    from evalsuite.plugins import engine_class, make_engine

    if engine_class(engine_name).takes_remote:
        raise SpecError(f"serve: --engine {engine_name} is itself a server client; pick an in-process engine")
    check_port(host, port)

    model = load_model(model_name)
    if model.tokenizer is None:
        raise ModelError(f"model {model_name} has no tokenizer: the API needs one")
    engine = make_engine(engine_name, model, dtype, fault, extra)
    name = served_name or model_name
    check = self_check(engine, model.tokenizer)
    print(f"serve: self-check {check['verdict']}: {check['detail']}", file=sys.stderr, flush=True)
    info = {"engine": engine_name, "engine_options": extra or {}, "dtype": dtype, "fault": fault,
            "weights_sha256": model.weights.sha256,
            "fingerprint": engine.fingerprint, "echo_path": engine.capabilities.forced_path, "self_check": check}
    app = build_app(engine, model, name, info)
    print(f"serve: {engine_name} ({dtype}, fault={fault}) serving {name} on http://{host}:{port}/v1",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
