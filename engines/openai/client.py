"""OpenAIEngine: greedy generation and prompt logprobs over an OpenAI-compatible API.

What such a server can give is probed at construction and declared in `capabilities`:
  "generate"       always (POST /v1/completions with token-id prompts, temperature 0)
  "token_ids"      the server returns generated token ids (vLLM's `token_ids` extension); without
                   them the text is re-tokenized locally, which `diff` reports
  "gen_logprobs"   logprobs of generated tokens (top-k) are returned
  "echo_logprobs"  echo=True returns prompt logprobs: teacher-forced scoring (`forced_topk`), so
                   loglikelihood tasks and `golden check` work; without it they are refused
  "tokenize"       POST /tokenize exists (else the local tokenizer of --model is used)
  "stop_strings"   generate(..., stop_strings=...) stops on the server (OpenAI's `stop`)
It never provides full-vocabulary logits ("logits") or per-layer taps ("taps").

Retries: 5xx, timeouts, refused connections and malformed or partial bodies are retried
MAX_ATTEMPTS times with bounded exponential backoff, then fail with one line naming the endpoint.
A 4xx is not retried. The API key is read from the named environment variable and sent as a
bearer token; it is never printed, logged or put in an error message.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from engines.base import Generation
from engines.config import Config
from engines.errors import ModelError

MAX_ATTEMPTS = 4  # first try + 3 retries
BACKOFF_S = (0.25, 0.5, 1.0)  # waits between attempts (bounded: 1.75 s in all)
TIMEOUT_S = 300.0  # one request; a batch of 16 prompts x 256 tokens on a CPU server can take minutes
CANARY_PROMPT = "evalsuite canary: one, two, three,"  # greedy ids + logprobs of it identify a served engine
ROWS_PER_REQUEST = 16  # prompts per /v1/completions call
CONCURRENT_REQUESTS = 4  # in flight at once (the server batches what arrives together)


@dataclass(frozen=True)
class Remote:
    base_url: str  # e.g. http://127.0.0.1:8000/v1
    served_model: str | None = None
    api_key_env: str | None = None
    timeout_s: float = TIMEOUT_S


class OpenAIEngine:
    def __init__(self, remote: Remote, config: Config, tokenizer, dtype: str = "float32"):
        self.name = "openai"
        self.remote = remote
        self.config = config
        self.dtype = dtype
        self.tok = tokenizer
        self.base = remote.base_url.rstrip("/")
        if not self.base.startswith(("http://", "https://")):
            raise ModelError(f"--base-url {remote.base_url!r} must start with http:// or https://")
        self.root = self.base[:-3] if self.base.endswith("/v1") else self.base
        self._key = None
        if remote.api_key_env:
            self._key = os.environ.get(remote.api_key_env)
            if not self._key:
                raise ModelError(f"--api-key-env {remote.api_key_env}: that environment variable is not set")
        self.weights_sha256 = None
        self.notes: list[str] = []
        self.echo_not_checked: list[str] = []
        self.echo_path: str | None = None
        self.identity: dict = {}
        self.canary: dict = {}
        self._tok_cache: dict[str, list[int]] = {}
        self.model_id, self.server_info, self.capabilities = self._probe()
        reported = (self.server_info.get("evalsuite") or {}).get("dtype") if isinstance(
            self.server_info.get("evalsuite"), dict) else None
        if reported is not None and reported != dtype:
            raise ModelError(f"--dtype {dtype} contradicts the server, which reports dtype {reported}")
        if reported is None and dtype != "float32":
            self.notes.append(f"dtype {dtype} is the user's claim: the server reports none")

    # ---- HTTP ------------------------------------------------------------------------------------
    def _request(self, method: str, url: str, body: dict | None = None, check=None) -> dict:
        """JSON request with retries. check(resp) raises ValueError for a malformed body."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        last = "no attempt"
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                time.sleep(BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)])
            req = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(req, timeout=self.remote.timeout_s) as r:
                    raw = r.read()
            except urllib.error.HTTPError as e:
                msg = _error_message(e)
                if 400 <= e.code < 500:
                    raise ModelError(f"{method} {url}: HTTP {e.code}: {msg}") from None
                last = f"HTTP {e.code}: {msg}"
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                reason = getattr(e, "reason", e)
                last = f"no reply ({type(reason).__name__}: {reason})"
                continue
            try:
                out = json.loads(raw)
                if not isinstance(out, dict):
                    raise ValueError("not a JSON object")
                if check:
                    check(out)
                return out
            except (ValueError, KeyError, TypeError, IndexError) as e:
                last = f"malformed response ({e})"
                continue
        raise ModelError(f"{method} {url}: {last} after {MAX_ATTEMPTS} attempts")

    # ---- probing ---------------------------------------------------------------------------------
    def _probe(self):
        def models_ok(r):
            if not isinstance(r.get("data"), list) or not r["data"]:
                raise ValueError("no models listed")

        listed = self._request("GET", f"{self.base}/models", check=models_ok)["data"]
        ids = [m.get("id") for m in listed]
        want = self.remote.served_model
        if want is None:
            if len(ids) != 1:
                raise ModelError(f"{self.base}/models lists {ids}: pick one with --served-model")
            want = ids[0]
        elif want not in ids:
            raise ModelError(f"--served-model {want!r} is not served at {self.base} (it lists {ids})")
        info = next(m for m in listed if m.get("id") == want)
        caps = {"generate", "stop_strings"}
        if isinstance(info.get("max_model_len"), int):
            self.config = _with_context(self.config, min(self.config.max_context, info["max_model_len"]))
        try:
            probe_text = "The probe: 12,345 apples."
            r = self._request("POST", f"{self.root}/tokenize", {"model": want, "prompt": probe_text})
            if isinstance(r.get("tokens"), list):
                caps.add("tokenize")
                if self.tok is not None and r["tokens"] != self.tok.encode(probe_text):
                    self.notes.append("the server's tokenizer differs from --model's: token ids are not comparable")
        except ModelError:
            self.notes.append("no /tokenize: the local tokenizer of --model is used")
        self.model_id = want
        probe = self.tok.encode("The probe") if self.tok else [1, 2]
        r = self._completion(probe, 1, logprobs=2, echo=True, allow_reject=True)
        if r is None:  # echo refused: try a plain completion
            self.notes.append("the server refuses echo: prompt logprobs (loglikelihood tasks) impossible")
            r = self._completion(probe, 1, logprobs=2, echo=False, allow_reject=True)
            if r is None:
                r = self._completion(probe, 1, logprobs=None, echo=False)
            ch = r["choices"][0]
        else:
            ch = r["choices"][0]
            tl = (ch.get("logprobs") or {}).get("token_logprobs") or []
            if len(tl) >= len(probe) + 1 and all(isinstance(x, (int, float)) for x in tl[1:len(probe)]):
                caps.add("echo_logprobs")
            else:
                self.notes.append("echo returns no prompt logprobs: loglikelihood tasks impossible")
        ext = r.get("evalsuite") if isinstance(r.get("evalsuite"), dict) else {}
        self.echo_path = ext.get("echo_path") if "echo_logprobs" in caps else None
        if "echo_logprobs" in caps and self.echo_path != "decode":
            self.echo_not_checked.append(
                "decode path: the server does not say that its echo (prompt) logprobs come from its decode "
                "path, so golden checks and loglikelihood scores over it may never exercise the decode kernel")
        if isinstance(ch.get("token_ids"), list):
            caps.add("token_ids")
        else:
            self.notes.append("no generated token ids: generations are compared on re-tokenized text")
        lp = ch.get("logprobs") or {}
        if isinstance(lp.get("token_logprobs"), list) and lp["token_logprobs"] and lp["token_logprobs"][-1] is not None:
            caps.add("gen_logprobs")
        else:
            self.notes.append("no logprobs for generated tokens: only the tokens are compared")
        self.identity = {k: info.get(k) for k in ("id", "root", "owned_by", "created", "max_model_len", "evalsuite")}
        # the canary: greedy ids and logprobs of a fixed prompt, taken now; any change of the served
        # engine behind the same URL changes it, so journals never reuse another engine's answers
        canary = self._completion(self.tok.encode(CANARY_PROMPT) if self.tok else [1, 2, 3], 8, logprobs=1,
                                  echo=False, allow_reject=True)
        cch = (canary or {}).get("choices", [{}])[0]
        self.canary = {"text": cch.get("text"), "token_ids": cch.get("token_ids"),
                       "logprobs": [None if x is None else round(float(x), 4)
                                    for x in ((cch.get("logprobs") or {}).get("token_logprobs") or [])]}
        return want, info, frozenset(caps)

    @property
    def fingerprint(self) -> str:
        """The server's reported identity and the canary taken at start (see _probe)."""
        import hashlib

        blob = json.dumps({"base": self.base, "identity": self.identity, "canary": self.canary,
                           "dtype": self.dtype}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def _completion(self, prompt, max_tokens, logprobs, echo, ignore_eos=False, stop=(), allow_reject=False,
                    decode_from: int | None = None):
        body = {"model": self.model_id, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "echo": echo}
        if decode_from is not None and decode_from >= 1:  # evalsuite serve's extension (see serve.py)
            body["echo_decode_from"] = decode_from
        if logprobs is not None:
            body["logprobs"] = logprobs
        if ignore_eos:
            body["ignore_eos"] = True
        if stop:
            body["stop"] = list(stop)
        n = len(prompt) if prompt and isinstance(prompt[0], list) else 1

        def ok(r):
            ch = r["choices"]
            if not isinstance(ch, list) or len(ch) != n:
                raise ValueError(f"{len(ch) if isinstance(ch, list) else 'no'} choices for {n} prompts")
            for c in ch:
                if not isinstance(c.get("text"), str) or c.get("finish_reason") not in ("stop", "length"):
                    raise ValueError("a choice without text or finish_reason (partial reply?)")

        try:
            return self._request("POST", f"{self.base}/completions", body, check=ok)
        except ModelError as e:
            if allow_reject and "HTTP 4" in str(e):
                return None
            raise

    def tokenize(self, text: str) -> list[int]:
        """Token ids from the server's /tokenize when it has one, else from the local tokenizer."""
        if "tokenize" not in self.capabilities:
            if self.tok is None:
                raise ModelError("no /tokenize on the server and no local tokenizer (--model)")
            return self.tok.encode(text)
        hit = self._tok_cache.get(text)
        if hit is None:
            def ok(r):
                if not isinstance(r.get("tokens"), list):
                    raise ValueError("no tokens")

            hit = self._request("POST", f"{self.root}/tokenize", {"model": self.model_id, "prompt": text},
                                check=ok)["tokens"]
            if len(self._tok_cache) < 100_000:
                self._tok_cache[text] = hit
        return list(hit)

    # ---- the protocol ----------------------------------------------------------------------------
    def score(self, seqs, want_taps: bool = False):
        raise ModelError("the openai engine has no full-vocabulary logits (an API returns top-k logprobs only)")

    def decode_forced(self, prompts, continuations):
        raise ModelError("the openai engine has no full-vocabulary logits; use forced_topk (echo logprobs)")

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int] = (),
                 top_k: int = 5, want_logits: bool = False, stop_check=None,
                 stop_strings: Sequence[str] = ()) -> list[Generation]:
        if want_logits:
            raise ModelError("the openai engine cannot return full-vocabulary logits")
        stop_set = {int(s) for s in stop_ids}
        eos = set(self.tok.eos_ids) if self.tok else set()
        ignore_eos = not (eos and eos <= stop_set)  # the caller wants to run past end-of-turn
        k = top_k if "gen_logprobs" in self.capabilities else None
        chunks = [list(range(s, min(s + ROWS_PER_REQUEST, len(prompts)))) for s in range(0, len(prompts),
                                                                                       ROWS_PER_REQUEST)]

        def run(idx):
            r = self._completion([list(map(int, prompts[i])) for i in idx], max_new_tokens, k, False,
                                 ignore_eos=ignore_eos, stop=tuple(stop_strings))
            return [self._generation(prompts[i], c, stop_set, top_k)
                    for i, c in zip(idx, sorted(r["choices"], key=lambda c: c.get("index", 0)))]

        with ThreadPoolExecutor(max_workers=CONCURRENT_REQUESTS) as pool:
            out = [g for part in pool.map(run, chunks) for g in part]
        if stop_check is not None:
            for g in out:
                for j in range(1, len(g.token_ids) + 1):
                    if stop_check(g.token_ids[:j]):
                        g.token_ids, g.top_ids, g.top_logprobs = g.token_ids[:j], g.top_ids[:j], g.top_logprobs[:j]
                        g.finish_reason = "stop"
                        break
        return out

    def _generation(self, prompt, ch: dict, stop_set: set[int], k: int) -> Generation:
        if "token_ids" in self.capabilities and isinstance(ch.get("token_ids"), list):
            ids = [int(t) for t in ch["token_ids"]]
        else:
            ids = self.tok.encode(ch["text"]) if self.tok else []
        lp = ch.get("logprobs") or {}
        n = len(ids)
        top_ids = np.full((n, k), -1, np.int64)
        top_lp = np.full((n, k), np.nan, np.float32)
        by_id = lp.get("top_logprobs_by_id")
        if isinstance(by_id, list) and len(by_id) == n:
            for j, row in enumerate(by_id):
                for m, (a, b) in enumerate((row or [])[:k]):
                    top_ids[j, m], top_lp[j, m] = int(a), float(b)
        elif isinstance(lp.get("top_logprobs"), list) and len(lp["top_logprobs"]) == n:
            for j, row in enumerate(lp["top_logprobs"]):
                for m, (a, b) in enumerate(self._by_id(row)[:k]):
                    top_ids[j, m], top_lp[j, m] = a, b
        tl = lp.get("token_logprobs")
        if isinstance(tl, list) and len(tl) == n:  # the chosen token's own logprob (greedy: the top-1)
            top_lp[:, 0] = [np.nan if x is None else float(x) for x in tl]
            top_ids[:, 0] = ids
        cut = next((j + 1 for j, t in enumerate(ids) if t in stop_set), n)
        finish = "stop" if cut < n or (ids and ids[-1] in stop_set) or ch.get("finish_reason") == "stop" else "length"
        return Generation(list(map(int, prompt)), ids[:cut], top_ids[:cut], top_lp[:cut], finish)

    def _by_id(self, top: dict | None) -> list[tuple[int, float]]:
        """OpenAI's {token string: logprob} as [(id, logprob)], most likely first; a string that is not
        exactly one token of the local tokenizer gets id -1 (never matched)."""
        out = []
        for s, v in sorted((top or {}).items(), key=lambda z: -z[1]):
            enc = self.tok.encode(s) if self.tok else []
            out.append((enc[0] if len(enc) == 1 else -1, float(v)))
        return out

    def forced_topk(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], k: int = 5):
        """Teacher-forced through echo: per row (token_logprobs [N], top_ids [N, k], top_logprobs
        [N, k]) for the continuation tokens, from the server's prompt-logprob path."""
        if "echo_logprobs" not in self.capabilities:
            raise ModelError(f"{self.base}: the server returns no prompt logprobs (echo), so loglikelihood "
                             "scoring and golden checks are impossible over it")
        out = []
        for p, x in zip(prompts, continuations):
            seq = list(map(int, p)) + list(map(int, x))
            r = self._completion(seq, 1, k, True, decode_from=len(p) - 1 if self.echo_path == "decode" else None)
            lp = r["choices"][0].get("logprobs") or {}
            tl = lp.get("token_logprobs") or []
            if len(tl) < len(seq):
                raise ModelError(f"POST {self.base}/completions: echo returned {len(tl)} logprobs for {len(seq)} "
                                 "prompt tokens")
            span = range(len(p), len(seq))
            by_id = lp.get("top_logprobs_by_id")
            tops = lp.get("top_logprobs") or []
            ti = np.full((len(x), k), -1, np.int64)
            tv = np.full((len(x), k), np.nan, np.float64)
            for j, t in enumerate(span):
                if isinstance(by_id, list) and len(by_id) > t and by_id[t]:
                    row = by_id[t]
                else:
                    row = self._by_id(tops[t]) if len(tops) > t else []
                for m, (a, b) in enumerate(row[:k]):
                    ti[j, m], tv[j, m] = int(a), float(b)
            out.append((np.array([float(tl[t]) for t in span]), ti, tv))
        return out


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read() or b"{}")
        err = body.get("error", body)
        msg = err.get("message") if isinstance(err, dict) else str(err)
        return str(msg or e.reason)[:300]
    except (ValueError, AttributeError, OSError):
        return str(e.reason)[:300]


def _with_context(c: Config, n: int) -> Config:
    import dataclasses

    return c if c.max_context == n else dataclasses.replace(c, max_context=n)
