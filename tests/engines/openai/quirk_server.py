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
Every request is logged (path, status, body) so a test can prove nothing refused was retried.
"""

from __future__ import annotations

import json
import socket
import threading
import time

QUIRKS = ("no_token_prompts", "single_prompt", "no_token_ids", "misaligned_echo", "extras_tokenize", "no_tokenize",
          "strict_schema_500")
LLAMA_CPP = frozenset({"no_token_prompts", "single_prompt", "no_token_ids", "misaligned_echo", "extras_tokenize"})
OPENAI_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "logprobs", "echo", "stop",
                 "presence_penalty", "frequency_penalty", "best_of", "logit_bias", "user", "suffix", "seed"}


def _validation_500(field: str, kind: str, msg: str, value) -> tuple[int, dict]:
    text = (f"1 validation error:\n  {{'type': '{kind}', 'loc': ('body', '{field}'), 'msg': '{msg}', "
            f"'input': {value!r}}}")
    return 500, {"error": {"message": text, "type": "internal_server_error", "param": None, "code": None}}


class Quirks:
    """ASGI layer over the serve app: rewrites requests and replies per the quirks asked for."""

    def __init__(self, app, quirks):
        unknown = set(quirks) - set(QUIRKS)
        assert not unknown, f"unknown quirks {unknown}"
        self.app, self.q = app, frozenset(quirks)
        self.log: list[tuple[str, int, str, str]] = []  # path, status, request body, reply body

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
        early, path2, req2 = self.before(path, req)
        if early is None:
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
        self.app = Quirks(build_app(eng, model, model.name, info), quirks)
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
