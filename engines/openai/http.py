"""JSON over HTTP for the openai client: one request function, errors classified before retrying.

Classification (`classify`): a reply is retried only when trying again can change it.
  retried      5xx (except validation errors), timeouts, resets and refused connections, and
               malformed or partial bodies
  not retried  every 4xx, and a validation error whatever its status: some servers (llama.cpp's
               Python server among them) report a request-schema violation as HTTP 500. The
               message names the rejected field(s).
Every failure ends in one line naming the endpoint; the API key never appears in it.
"""

from __future__ import annotations

import json
import re
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
            attempts: int = MAX_ATTEMPTS, check=None) -> dict:
    """JSON request with classified retries; check(reply) raises ValueError for a malformed body."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    last = "no attempt"
    for attempt in range(attempts):
        if attempt:
            time.sleep(BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)])
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            try:
                payload = e.read()
            except OSError:
                payload = b""
            f = classify(e.code, payload)
            if not f.retry:
                raise ModelError(f"{method} {url}: {f.message}") from None
            last = f.message
            continue
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            last = _one_line(f"no reply ({type(reason).__name__}: {reason})")
            continue
        try:
            out = json.loads(raw)
            if not isinstance(out, dict):
                raise ValueError("not a JSON object")
            if check:
                check(out)
            return out
        except (ValueError, KeyError, TypeError, IndexError) as e:
            last = _one_line(f"malformed response ({e})")
            continue
    raise ModelError(f"{method} {url}: {last} after {attempts} attempt{'s' if attempts > 1 else ''}")
