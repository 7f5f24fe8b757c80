"""JSON over HTTP for the openai client: one request function, errors classified before retrying.

Classification (`classify`): a reply is retried only when trying again can change it.
  retried      5xx (except validation errors), refused connections, and malformed or partial bodies
  not retried  every 4xx, and a validation error whatever its status: some servers (llama.cpp's
               Python server among them) report a request-schema violation as HTTP 500. The
               message names the rejected field(s).
  not re-sent  (resend=False: generations) a request that got no reply in time or whose connection
               was dropped: the server may still be running it, and servers that do not cancel
               abandoned requests (transformers serve, llama.cpp) would run every copy in turn
Each engine keeps a Trail of its requests; when a request gets no reply the trail asks the server
whether it still answers at all, and a dead server is named as such, with the request after which
it stopped answering. Every failure ends in one line naming the endpoint; the API key never
appears in it.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from engines.errors import ModelError

MAX_ATTEMPTS = 4  # first try + 3 retries
BACKOFF_S = (0.25, 0.5, 1.0)  # waits between attempts (bounded: 1.75 s in all)
# Phrases of request-validation errors (pydantic v1/v2 as FastAPI servers render them, and
# OpenAI's own wording); a reply containing one is the request's fault, never the server's mood.
VALIDATION_MARKERS = ("validation error", "input should be", "field required", "extra inputs are not permitted",
                      "value is not a valid", "unexpected keyword", "is not of type")


# EVALSUITE_HTTP_LOG=PATH: one JSON line per attempt (method, path, attempt, outcome), so a request sent twice
# can be told from the server's own access log (interop/matrix.py compares the two)
HTTP_LOG_ENV = "EVALSUITE_HTTP_LOG"
LIVENESS_TIMEOUT_S = 10.0  # GET /v1/models after a request got no reply: a live server lists its models at once


def summary(method: str, url: str, body: dict | None) -> str:
    """A request in a few words, for messages: "POST /v1/completions (2 prompts, max_tokens 1, ignore_eos)"."""
    path = "/" + url.split("://", 1)[-1].split("/", 1)[-1] if "://" in url else url
    if not isinstance(body, dict) or "prompt" not in body:
        return f"{method} {path}"
    p = body["prompt"]
    n = len(p) if isinstance(p, list) and p and isinstance(p[0], (list, str)) else 1
    bits = [f"{n} prompt{'s' if n != 1 else ''}", f"max_tokens {body.get('max_tokens')}"]
    bits += [k for k in ("echo", "ignore_eos", "stop") if body.get(k)]
    if body.get("logprobs") is not None:
        bits.append(f"logprobs {body['logprobs']}")
    return f"{method} {path} ({', '.join(bits)})"


class Trail:
    """What one client asked a server and how it answered: the last answered request, for naming a server
    that has stopped answering. Thread-safe (requests run concurrently)."""

    def __init__(self, root: str):
        self.root = root
        self.last_answered: str | None = None  # "POST /v1/completions (...) -> HTTP 500: ..." / "-> 200"
        self.answered = 0
        self._lock = threading.Lock()

    def answered_with(self, what: str, status: int, note: str = "") -> None:
        with self._lock:
            self.answered += 1
            self.last_answered = f"{what} -> HTTP {status}" + (f" ({note[:80]})" if note else "")

    def dead(self, key: str | None) -> str | None:
        """None when the server still lists its models; else why it does not (refused, reset, no reply)."""
        req = urllib.request.Request(self.root + "/v1/models", headers=_headers(key), method="GET")
        try:
            with urllib.request.urlopen(req, timeout=LIVENESS_TIMEOUT_S) as r:
                r.read()
            return None
        except urllib.error.HTTPError:
            return None  # it answered (an error is an answer)
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, TimeoutError) or "timed out" in str(reason):
                return None  # busy, not gone: a server running a long request may be slow to list its models
            return f"{type(reason).__name__}: {reason}"

    def dead_message(self, what: str, failure: str, why: str) -> str:
        before = (f"the last request it answered was {self.last_answered}" if self.last_answered
                  else "it answered nothing before")
        return _one_line(
            f"the server at {self.root} has stopped answering: {what} got {failure}, and it now refuses even GET "
            f"/v1/models ({why}); {before}. It has most likely crashed on or after that request: see the server's "
            "own log, restart it, and rerun (`run` resumes from its journal).", 1000)


def _log(method: str, url: str, attempt: int, outcome) -> None:
    path = os.environ.get(HTTP_LOG_ENV)
    if path:
        line = json.dumps({"t": round(time.time(), 3), "method": method, "path": "/" + url.split("://", 1)[-1]
                           .split("/", 1)[-1], "attempt": attempt, "outcome": outcome})
        with open(path, "a") as fh:
            fh.write(line + "\n")


def _headers(key: str | None) -> dict:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


class ServerDead(ModelError):
    """The server stopped answering altogether (Trail.dead_message says after which request): never a refusal."""


@dataclass(frozen=True)
class Failure:
    status: int | None  # HTTP status, None when no reply came
    message: str  # one line
    retry: bool


def _one_line(s: str, limit: int = 300) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _fields(text: str, body) -> list[str]:
    """The request fields a validation error names (FastAPI detail lists, pydantic reprs)."""
    found: list[str] = []
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):
        for d in detail:
            loc = d.get("loc") if isinstance(d, dict) else None
            if isinstance(loc, list):
                found.append(next((str(x) for x in loc if x not in ("body", "query")), ""))
    for m in re.finditer(r"'loc': \(([^)]*)\)", text):
        parts = [p.strip().strip("'\"") for p in m.group(1).split(",")]
        found.append(next((p for p in parts if p and p not in ("body", "query")), ""))
    for m in re.finditer(r"(?m)^([A-Za-z_][\w.\[\]]*)\n\s+(?:Input should|Field required|Extra inputs)", text):
        found.append(m.group(1).split(".")[0])
    return list(dict.fromkeys(f for f in found if f))


def classify(status: int, raw: bytes) -> Failure:
    """What an error reply means: its one-line message and whether retrying may help."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = None
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body))
        msg = err.get("message") if isinstance(err, dict) else err
        text = msg if isinstance(msg, str) else json.dumps(msg)
    else:
        text = raw.decode("utf-8", "replace") if raw else ""
    validation = any(m in text.lower() for m in VALIDATION_MARKERS)
    if validation:
        fields = _fields(text, body)
        first = next((ln.strip() for ln in text.splitlines() if "input should" in ln.lower() or "msg" in ln), "")
        what = f"field {', '.join(repr(f) for f in fields)}" if fields else "the request"
        return Failure(status, _one_line(f"HTTP {status}: the server rejected {what} (validation error"
                                         + (f": {_short_reason(first)}" if first else "") + ")"), False)
    return Failure(status, _one_line(f"HTTP {status}: {text or 'no message'}"), not 400 <= status < 500)


def _short_reason(line: str) -> str:
    m = re.search(r"'msg': '([^']*)'", line)
    return m.group(1) if m else line[:120]


def request(method: str, url: str, body: dict | None = None, *, key: str | None = None, timeout: float = 300.0,
            attempts: int = MAX_ATTEMPTS, check=None, resend: bool = True, trail: Trail | None = None) -> dict:
    """JSON request with classified retries; check(reply) raises ValueError for a malformed body. resend=False:
    a request that got no reply (timeout, dropped connection) is not sent again (the server may still run it)."""
    data = json.dumps(body).encode() if body is not None else None
    what = summary(method, url, body)
    last = "no attempt"
    for attempt in range(attempts):
        if attempt:
            time.sleep(BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)])
        req = urllib.request.Request(url, data=data, headers=_headers(key), method=method)
        outcome = "no reply"
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                status = r.status
                outcome = status
        except urllib.error.HTTPError as e:
            outcome = e.code
            try:
                payload = e.read()
            except OSError:
                payload = b""
            f = classify(e.code, payload)
            _log(method, url, attempt, outcome)
            if trail is not None:
                trail.answered_with(what, e.code, f.message.split(": ", 1)[-1][:80])
            if not f.retry:
                raise ModelError(f"{method} {url}: {f.message}") from None
            last = f.message
            continue
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
            _log(method, url, attempt, outcome)
            reason = getattr(e, "reason", e)
            refused = isinstance(reason, ConnectionRefusedError)
            timed_out = isinstance(reason, TimeoutError) or "timed out" in str(reason)
            last = _one_line(f"no reply in {timeout:.0f} s" if timed_out else
                             f"no reply ({type(reason).__name__}: {reason})")
            why = trail.dead(key) if trail is not None and (trail.answered or not refused) else None
            if why is not None:
                raise ServerDead(trail.dead_message(what, last, why)) from None
            if not resend and not refused:  # it may have reached the server, which may still be running it
                raise ModelError(_one_line(
                    f"{method} {url}: {last}; not sent again, since the server may still be running it (it answers "
                    f"other requests). {'Raise --timeout (seconds per request)' if timed_out else 'See its log'}, or "
                    "check that nothing else is using the server.", 500)) from None
            continue
        _log(method, url, attempt, outcome)
        try:
            out = json.loads(raw)
            if not isinstance(out, dict):
                raise ValueError("not a JSON object")
            if check:
                check(out)
            if trail is not None:
                trail.answered_with(what, status)
            return out
        except (ValueError, KeyError, TypeError, IndexError) as e:
            last = _one_line(f"malformed response ({e})")
            if trail is not None:
                trail.answered_with(what, status, "malformed")
            continue
    raise ModelError(f"{method} {url}: {last} after {attempts} attempt{'s' if attempts > 1 else ''}")
