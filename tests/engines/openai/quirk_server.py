"""A real `evalsuite serve` on loopback (mini-llama, reference engine) behind a layer that reproduces
the quirks of third-party OpenAI-compatible servers, so CI covers them without building llama.cpp.

Each quirk was seen on llama-cpp-python 0.3.36's server serving the SmolLM2 GGUF (interop/README.md):
  no_token_prompts   token-id prompts are a request-validation error, returned as HTTP 500
  single_prompt      a list of several prompts is HTTP 500 with an empty message
  no_token_ids       replies carry no token ids (no token_ids, prompt_token_ids, top_logprobs_by_id,
                     no evalsuite extension fields; /v1/models lists no context length)
  misaligned_echo    echo's prompt logprobs sit one position off the tokens they belong to
  extras_tokenize    the tokenize endpoint is POST /extras/tokenize {"input": text}, not /tokenize
and two that other servers have:
  no_tokenize        no tokenize endpoint at all (OpenAI's own API)
  strict_schema_500  any field outside OpenAI's completion schema is a validation error as HTTP 500
Those of transformers serve 5.24.0 (established with curl, interop/README.md; TSERVE is the set):
  text_only          a token-id prompt or a list of prompts is HTTP 400 "prompt must be a string."
  no_logprobs        `logprobs` and `echo` are ignored: no logprobs in any reply
  strict_schema_422  any field outside OpenAI's completion schema is HTTP 422 "Unexpected fields"
  strips_special     the text is decoded with special tokens removed
  keeps_stop         it stops at a stop string but leaves the string in its text
  serial             one request at a time, each taking at least SERIAL_S (one inference thread)
  long_split         a text prompt over LONG_SPLIT_CHARS characters is counted one token longer in `usage` (its
                     tokenizer splits long texts otherwise: transformers serve's did, 1102 for 1101 on GSM8K 5-shot)
  another_model      every prompt is counted as another model's tokenizer would (twice the tokens, and 3)
and a crash (llama.cpp's server segfaulted in llama_decode):
  dies               set_dies(n): the n-th completion from now gets no reply, and the server stops
                     listening (every later connection is refused)
Every request is logged (path, status, body) so a test can prove nothing refused was retried.
"""

from __future__ import annotations

import json
import socket
import threading
import time

QUIRKS = ("no_token_prompts", "single_prompt", "no_token_ids", "misaligned_echo", "extras_tokenize", "no_tokenize",
          "strict_schema_500", "text_only", "no_logprobs", "strict_schema_422", "strips_special", "keeps_stop",
          "serial", "long_split", "another_model")
LONG_SPLIT_CHARS = 200
LLAMA_CPP = frozenset({"no_token_prompts", "single_prompt", "no_token_ids", "misaligned_echo", "extras_tokenize"})
TSERVE = frozenset({"text_only", "no_token_ids", "no_logprobs", "no_tokenize", "strict_schema_422", "strips_special",
                    "keeps_stop", "serial"})
SERIAL_S = 0.25  # the least a completion takes on the `serial` quirk: two at once then take 0.5 s or more
OPENAI_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "logprobs", "echo", "stop",
                 "presence_penalty", "frequency_penalty", "best_of", "logit_bias", "user", "suffix", "seed"}


def _validation_500(field: str, kind: str, msg: str, value) -> tuple[int, dict]:
    text = (f"1 validation error:\n  {{'type': '{kind}', 'loc': ('body', '{field}'), 'msg': '{msg}', "
            f"'input': {value!r}}}")
    return 500, {"error": {"message": text, "type": "internal_server_error", "param": None, "code": None}}


class Quirks:
    """ASGI layer over the serve app: rewrites requests and replies per the quirks asked for."""

    def __init__(self, app, quirks, tokenizer=None):
        import asyncio

        unknown = set(quirks) - set(QUIRKS)
        assert not unknown, f"unknown quirks {unknown}"
        self.app, self.q, self.tok = app, frozenset(quirks), tokenizer
        self.log: list[tuple[str, int, str, str]] = []  # path, status, request body, reply body
        self.lock = asyncio.Lock()  # the `serial` quirk's one inference thread
        self.die_in: int | None = None  # completions until the crash (set_dies)
        self.on_death = None  # called when the server "crashes" (QuirkServer stops listening)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw, more = b"", True
        while more:
            m = await receive()
            raw += m.get("body", b"")
            more = m.get("more_body", False)
        path = scope["path"]
        req = json.loads(raw) if raw else None
        if path == "/v1/completions" and self.die_in is not None:
            self.die_in -= 1
            if self.die_in <= 0:  # the crash: no reply to this request, and nothing listens any more
                self.log.append((path, 0, raw.decode(), "(died)"))
                self.on_death()
                import asyncio

                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:  # the shutdown: the connection drops without a reply
                    return
        early, path2, req2 = self.before(path, req)
        if early is None:
            if "serial" in self.q and path == "/v1/completions":
                import asyncio

                async with self.lock:
                    t = asyncio.get_running_loop().time()
                    status, out = await self._inner(scope, path2, req2)
                    await asyncio.sleep(max(0.0, SERIAL_S - (asyncio.get_running_loop().time() - t)))
            else:
                status, out = await self._inner(scope, path2, req2)
            status, out = self.after(path, req, status, out)
        else:
            status, out = early
        body = json.dumps(out).encode()
        self.log.append((path, status, raw.decode(), body.decode()))
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _inner(self, scope, path, req):
        data = json.dumps(req).encode() if req is not None else b""
        got, chunks = {}, []

        async def rcv():
            return {"type": "http.request", "body": data, "more_body": False}

        async def snd(m):
            if m["type"] == "http.response.start":
                got["status"] = m["status"]
            elif m["type"] == "http.response.body":
                chunks.append(m.get("body", b""))

        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(data)).encode()))
        await self.app(dict(scope, path=path, raw_path=path.encode(), headers=headers), rcv, snd)
        raw = b"".join(chunks)
        try:
            return got["status"], (json.loads(raw) if raw else {})
        except ValueError:  # a plain-text reply (starlette's own 404)
            return got["status"], {"detail": raw.decode("utf-8", "replace")}

    def before(self, path, req):
        q = self.q
        if path in ("/tokenize", "/extras/tokenize"):
            if "no_tokenize" in q or (path == "/tokenize") == ("extras_tokenize" in q):
                return (404, {"detail": "Not Found"}), path, req
            if path == "/extras/tokenize":
                return None, "/tokenize", {"prompt": (req or {}).get("input")}
        if path == "/v1/completions" and isinstance(req, dict):
            if "strict_schema_422" in q:
                extra = sorted(set(req) - OPENAI_FIELDS)
                if extra:
                    return (422, {"error": {"message": f"Unexpected fields in the request: {set(extra)}",
                                            "type": "invalid_request_error"}}), path, req
            if "keeps_stop" in q and req.get("stop"):  # it generates on; after() cuts after the stop string
                req = {k: v for k, v in req.items() if k != "stop"}
            if "text_only" in q and not isinstance(req.get("prompt"), str):
                return (400, {"error": {"message": "prompt must be a string.", "type": "invalid_request_error"}}), \
                    path, req
            if "strict_schema_500" in q:
                extra = sorted(set(req) - OPENAI_FIELDS)
                if extra:
                    return _validation_500(extra[0], "extra_forbidden", "Extra inputs are not permitted",
                                           req[extra[0]]), path, req
            p = req.get("prompt")
            if "no_token_prompts" in q and isinstance(p, list) and any(not isinstance(x, str) for x in p):
                return _validation_500("prompt", "string_type", "Input should be a valid string", p), path, req
            if "single_prompt" in q and isinstance(p, list) and len(p) > 1:
                return (500, {"error": {"message": "", "type": "internal_server_error", "param": None,
                                        "code": None}}), path, req
        return None, path, req

    def after(self, path, req, status, out):
        q = self.q
        if status != 200 or not isinstance(out, dict):
            return status, out
        if path == "/v1/completions":
            for ch in out.get("choices", []):
                ids = ch.get("token_ids")
                if "strips_special" in q and isinstance(ids, list) and self.tok is not None:
                    ch["text"] = self.tok.decode(ids, skip_special=True)
                if "keeps_stop" in q and (req or {}).get("stop"):  # generated without stops (before): cut here
                    stops = req["stop"] if isinstance(req["stop"], list) else [req["stop"]]
                    hits = [(ch["text"].find(s), s) for s in stops if s and s in ch["text"]]
                    if hits:
                        at, s = min(hits)
                        ch["text"], ch["finish_reason"] = ch["text"][:at + len(s)], "stop"
                if "no_logprobs" in q:
                    ch.pop("logprobs", None)
                    ch["logprobs"] = None
            if "no_logprobs" in q and (req or {}).get("echo"):
                out.pop("evalsuite", None)
            usage = out.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
                p = (req or {}).get("prompt")
                if "long_split" in q and isinstance(p, str) and len(p) > LONG_SPLIT_CHARS:
                    usage["prompt_tokens"] += 1
                if "another_model" in q:
                    usage["prompt_tokens"] = 2 * usage["prompt_tokens"] + 3
        if "no_token_ids" in q:
            out.pop("evalsuite", None)
            out.pop("prompt_token_ids", None)
            for m in out.get("data", []) if path == "/v1/models" else []:
                for k in ("evalsuite", "max_model_len", "root"):
                    m.pop(k, None)
            for ch in out.get("choices", []):
                for k in ("token_ids", "prompt_token_ids", "stop_reason"):
                    ch.pop(k, None)
                if isinstance(ch.get("logprobs"), dict):
                    ch["logprobs"].pop("top_logprobs_by_id", None)
        if "misaligned_echo" in q and path == "/v1/completions" and (req or {}).get("echo"):
            for ch in out.get("choices", []):
                lp = ch.get("logprobs")
                if isinstance(lp, dict):
                    for k in ("token_logprobs", "top_logprobs", "top_logprobs_by_id"):
                        v = lp.get(k)
                        if isinstance(v, list) and len(v) > 2:
                            lp[k] = [None] + v[2:] + [v[-1]]
        return status, out


class QuirkServer:
    """with QuirkServer(model, {"no_token_ids"}) as s: s.url is http://127.0.0.1:PORT/v1"""

    def __init__(self, model, quirks=(), engine: str = "reference", dtype: str = "float32", fault: str | None = None):
        import uvicorn

        from evalsuite.plugins import make_engine
        from evalsuite.serve import build_app

        eng = make_engine(engine, model, dtype, fault)
        info = {"engine": engine, "dtype": dtype, "fault": fault, "weights_sha256": model.weights.sha256,
                "fingerprint": eng.fingerprint, "echo_path": "decode"}
        self.app = Quirks(build_app(eng, model, model.name, info), quirks, model.tokenizer)
        self.app.on_death = self._die
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def log(self):
        return self.app.log

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "quirk server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=20)

    def set_dies(self, n: int) -> None:
        """The n-th completion request from now is the one the server dies on (no reply; nothing listens after)."""
        self.app.die_in = n

    def _die(self) -> None:
        for server in getattr(self.server, "servers", []) or []:  # stop listening: new connections are refused
            server.close()
        self.server.should_exit = True
        self.server.force_exit = True

    def mark(self) -> None:
        """Start a new client's window: retried_refusals looks at requests after the last mark."""
        self._mark = len(self.log)

    def retried_refusals(self) -> list[str]:
        """Refused requests (4xx, or a validation error whatever the status) sent more than once since
        the last mark (one client: a second probe by another client is not a retry)."""
        from collections import Counter

        refused = Counter((p, b) for p, st, b, reply in self.log[getattr(self, "_mark", 0):]
                          if 400 <= st < 500 or "validation error" in reply)
        return [f"{p} x{n}" for (p, _), n in refused.items() if n > 1]
