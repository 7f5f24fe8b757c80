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
        return parse.json_body(b"".join(chunks))

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
        parse.check_model(body, srv.name)
        if "messages" in body:
            ids = tok.encode(tok.render_chat(parse.messages(body), body.get("add_generation_prompt", True)))
        elif isinstance(body.get("prompt"), str):
            ids = tok.encode(body["prompt"])
        else:
            raise APIError(400, "tokenize needs `prompt` (a string) or `messages`", param="prompt")
        return JSONResponse({"count": len(ids), "max_model_len": srv.ctx, "tokens": ids})

    async def detokenize(request: Request):
        body = await body_of(request)
        parse.check_model(body, srv.name)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise APIError(400, "detokenize needs `tokens`, a list of integer ids", param="tokens")
        V = model.config.vocab_size
        if any(not 0 <= t < V for t in ids):
            raise APIError(400, f"token id outside the vocabulary [0, {V})", param="tokens")
        return JSONResponse({"prompt": tok.decode(ids)})

    async def completions(request: Request):
        body = await body_of(request)
        parse.check_model(body, srv.name)
        max_tokens, stops = parse.sampling(body, 16)
        prompts = parse.prompt_ids(body.get("prompt"), tok, model.config.vocab_size)
        echo = bool(body.get("echo", False))
        decode_from = body.get("echo_decode_from", 1)
        if not isinstance(decode_from, int) or isinstance(decode_from, bool) or decode_from < 1:
            raise APIError(400, "echo_decode_from must be an integer >= 1", param="echo_decode_from")
        logprobs_from = body.get("echo_logprobs_from", 1)
        if not isinstance(logprobs_from, int) or isinstance(logprobs_from, bool) or logprobs_from < 1:
            raise APIError(400, "echo_logprobs_from must be an integer >= 1", param="echo_logprobs_from")
        k = body.get("logprobs")
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_LOGPROBS):
            raise APIError(400, f"logprobs must be an integer in [0, {MAX_LOGPROBS}]", param="logprobs")
        if max_tokens == 0 and not echo:
            raise APIError(400, "max_tokens 0 is only meaningful with echo", param="max_tokens")
        parse.check_length(prompts, max_tokens, srv.ctx)
        ignore_eos = bool(body.get("ignore_eos", False))
        job = Job(prompts, max_tokens, stops, k or 0, ignore_eos)
        gens = await srv.submit(job) if max_tokens else [None] * len(prompts)
        choices, n_gen, echo_rows = [], 0, 0
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
                    pl, rows = await srv.prompt_logprobs(ids, k, decode_from, logprobs_from)
                    echo_rows = max(echo_rows, rows)
                    for t, tid in enumerate(ids):
                        s = tok.decode([tid])
                        toks.append(s)
                        offsets.append(pos)
                        pos += len(s)
                        if t == 0 or pl[t - 1] is None:  # the first token, or before echo_logprobs_from
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
                             "evalsuite": {"batch_rows": job.batched_with,
                                           "echo_path": engine.capabilities.forced_path if echo else None,
                                           "echo_decode_from": decode_from if echo else None,
                                           "echo_batch_rows": echo_rows if echo else None},
                             "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_gen,
                                       "total_tokens": n_prompt + n_gen}})

    async def chat(request: Request):
        body = await body_of(request)
        parse.check_model(body, srv.name)
        max_tokens, stops = parse.sampling(body, 256)
        if max_tokens == 0:
            raise APIError(400, "max_tokens must be >= 1", param="max_tokens")
        want_lp = bool(body.get("logprobs", False))
        k = body.get("top_logprobs") or 0
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_LOGPROBS:
            raise APIError(400, f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}]", param="top_logprobs")
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
          served_name: str | None = None) -> None:
    import uvicorn

    from evalsuite.engines import engine_class, make_engine
    from evalsuite.errors import SpecError
    from evalsuite.registry import load_model

    if engine_class(engine_name).takes_remote:
        raise SpecError(f"serve: --engine {engine_name} is itself a server client; pick an in-process engine")
    check_port(host, port)

    model = load_model(model_name)
    if model.tokenizer is None:
        raise ModelError(f"model {model_name} has no tokenizer: the API needs one")
    engine = make_engine(engine_name, model, dtype, fault)
    name = served_name or model_name
    check = self_check(engine, model.tokenizer)
    print(f"serve: self-check {check['verdict']}: {check['detail']}", file=sys.stderr, flush=True)
    info = {"engine": engine_name, "dtype": dtype, "fault": fault, "weights_sha256": model.weights.sha256,
            "fingerprint": engine.fingerprint, "echo_path": engine.capabilities.forced_path, "self_check": check}
    app = build_app(engine, model, name, info)
    print(f"serve: {engine_name} ({dtype}, fault={fault}) serving {name} on http://{host}:{port}/v1",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
