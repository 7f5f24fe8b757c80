"""OpenAIEngine: greedy generation and prompt logprobs over an OpenAI-compatible API.

What the server can do is discovered at construction (engines/openai/probe.py) and reported in
`findings` (every result file carries them as `engine_capabilities`); `capabilities` is the typed
engines.base.Capabilities built from them, and `usable` names what was found usable:
  "generate"       always (POST /v1/completions, temperature 0, penalties pinned neutral)
  "token_ids"      the server returns generated token ids; without them they are rebuilt from the
                   logprob token strings or the text (said in `notes`)
  "gen_logprobs"   logprobs of generated tokens (top-k) are returned
  "echo_logprobs"  echo=True returns prompt logprobs AND they are shown aligned with the decode
                   path's (teacher-forced scoring, `forced_topk`: loglikelihood tasks, golden
                   checks); absent, misaligned or unverifiable echo is refused in one line naming why
  "tokenize"       a tokenize endpoint exists (one of the known paths)
  "stop_strings"   the server honours stop strings (else the client cuts at them)
  "chat"           POST /v1/chat/completions answers
Prompts go as token-id lists where the server accepts them, else as text whose tokenization is
checked per prompt through the tokenize endpoint; without one, `prompt_not_checked` says so and
no verdict over this engine can PASS. It never provides full-vocabulary logits or taps.

Requests: engines/openai/http.py (what is retried; a generation without a reply is never re-sent;
a dead server is named). engines/openai/pace.py: how many requests go at once and each one's
deadline, learned at the probe; while requests wait the console says so ("server busy: ..."). The API
key is read from the named environment variable and sent as a bearer token; it is never printed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from engines.base import Engine, EngineOptions, Forced, Generation
from engines.config import Config
from engines.errors import ModelError
from engines.openai import http, pace, parse, probe
from engines.openai.http import BACKOFF_S, MAX_ATTEMPTS  # noqa: F401  (re-exported for callers and tests)
from engines.openai.probe import CANARY_PROMPT  # noqa: F401

TIMEOUT_S = 300.0  # the least a request's deadline is; the learned deadline (pace.deadline) is often longer
ROWS_PER_REQUEST = 16  # prompts per /v1/completions call (where the server takes several)
CONCURRENT_REQUESTS = 4  # in flight at once where the server serves requests together (pace.probe_pace)
ECHO_CONCURRENT = 8  # teacher-forced (echo) requests in flight at once, one prompt each, on such a server
WAIT_REPORT_S = 30.0  # while requests are outstanding, the console hears about them this often


@dataclass(frozen=True)
class Remote:
    base_url: str  # e.g. http://127.0.0.1:8000/v1
    served_model: str | None = None
    api_key_env: str | None = None
    timeout_s: float | None = None  # seconds per request; None: learned from the server's pace (pace.deadline)


class OpenAIEngine(Engine):
    """A server speaking the OpenAI completions API (vLLM, SGLang, llama.cpp, evalsuite serve): --base-url."""

    takes_remote = True
    # the CLI's --base-url and its companions; numerics=TEXT: the server's numbers are its own (e.g. "Q8_0 GGUF"),
    # so a run reports its token parity with the judge instead of judging it
    options = ("base_url", "served_model", "api_key_env", "timeout", "numerics")
    no_float32_build = "a served engine runs in the server's dtype; diff the server started in float32"
    max_batch = ROWS_PER_REQUEST

    @classmethod
    def create(cls, model, options: EngineOptions) -> OpenAIEngine:
        x = options.extra
        try:
            timeout = float(x["timeout"]) if x.get("timeout") not in (None, "") else None
        except ValueError:
            raise ModelError(f"--timeout {x['timeout']!r}: expected seconds") from None
        remote = Remote(x["base_url"], x.get("served_model") or None, x.get("api_key_env") or None, timeout)
        eng = cls(remote, model.config, model.tokenizer, options.dtype)
        eng.own_numerics = str(x.get("numerics") or "")
        return eng

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
        self.echo_not_checked: list[str] = []  # blocks a PASS of checks that use echo logprobs
        self.prompt_not_checked: list[str] = []  # blocks a PASS of every check over this engine
        self.echo_path: str | None = None
        self.echo_misaligned = False
        self.token_prompts = True
        self.batched = True
        self.ignore_eos = True
        self.sampling: dict = {}
        self.max_context: int | None = None
        self.tokenize_route = None
        self.identity: dict = {}
        self.canary: dict = {}
        self._tok_cache: dict[str, list[int]] = {}
        self.trail = http.Trail(self.root)
        self.probing = True  # a prompt-count mismatch while probing is fatal (another model); later it marks a row
        self.read_differently: list[tuple[int, int]] = []  # (server's count, ours) of prompts read otherwise
        self._lock = threading.Lock()
        self.concurrency = 1  # requests in flight at once; pace.probe_pace raises it where the server overlaps them
        self.tokens_per_s: float | None = None  # the server's decode pace at the probe (None: not measured)
        self.prefill_per_s: float | None = None  # and its prefill pace (prompt tokens/s)
        self.stops_kept = False  # the server stops at a stop string but leaves it in the text
        self.notify = lambda msg: print(msg, file=sys.stderr, flush=True)  # console lines while requests wait
        self.model_id, self.server_info, self.findings = self._probe()
        self.probing = False
        self.usable = frozenset(self._usable())
        reported = (self.server_info.get("evalsuite") or {}).get("dtype") if isinstance(
            self.server_info.get("evalsuite"), dict) else None
        if reported is not None and reported != dtype:
            raise ModelError(f"--dtype {dtype} contradicts the server, which reports dtype {reported}")
        if reported is None and dtype != "float32":
            self.notes.append(f"dtype {dtype} is the user's claim: the server reports none")
        self.capabilities = probe.capabilities(self)

    # ---- HTTP ------------------------------------------------------------------------------------
    def post(self, url: str, body: dict, attempts: int = MAX_ATTEMPTS, check=None, timeout: float | None = None,
             resend: bool = True) -> dict:
        return http.request("POST", url, body, key=self._key, timeout=self.remote.timeout_s or timeout or TIMEOUT_S,
                            attempts=attempts, check=check, resend=resend, trail=self.trail)

    def get(self, url: str, attempts: int = MAX_ATTEMPTS, check=None) -> dict:
        return http.request("GET", url, None, key=self._key, timeout=self.remote.timeout_s or TIMEOUT_S,
                            attempts=attempts, check=check, trail=self.trail)

    def deadline(self, body: dict) -> float:
        """Seconds this request may take: the user's --timeout, else sized from the server's measured pace."""
        return self.remote.timeout_s or pace.deadline(self, body)

    # ---- probing ---------------------------------------------------------------------------------
    def _probe(self):
        def models_ok(r):
            if not isinstance(r.get("data"), list) or not r["data"]:
                raise ValueError("no models listed")

        listed = self.get(f"{self.base}/models", check=models_ok)["data"]
        ids = [m.get("id") for m in listed]
        want = self.remote.served_model
        if want is None:
            if len(ids) != 1:
                raise ModelError(f"{self.base}/models lists {ids}: pick one with --served-model")
            want = ids[0]
        elif want not in ids:
            raise ModelError(f"--served-model {want!r} is not served at {self.base} (it lists {ids})")
        info = next(m for m in listed if m.get("id") == want)
        self.model_id = want
        f: dict[str, probe.Finding] = {"models": probe.Finding(True, f"serves {want!r}")}
        self.findings = f  # filled in below
        self.tokenize_route, f["tokenize"] = probe.probe_tokenize(self)
        if "differently" in f["tokenize"].detail:
            self.notes.append("the server's tokenizer differs from --model's: token ids are not comparable")
        self.token_prompts = probe.probe_token_prompts(self, f)  # before the probes that send prompts
        self.ignore_eos, self.sampling = probe.probe_request_fields(self, f)
        canary = probe.probe_generation(self, f)
        pace.probe_pace(self, f, canary)
        self.echo_path, self.echo_misaligned = probe.probe_echo(self, f, canary)
        self.max_context = probe.probe_extras(self, f, canary, info)
        self.batched = probe.probe_batched(self, f)  # last: the request some servers break on
        if self.max_context:
            self.config = _with_context(self.config, min(self.config.max_context, self.max_context))
        if not self.token_prompts and self.tokenize_route is None:
            self.prompt_not_checked.append(
                "prompt tokenization: the server takes only text prompts and has no tokenize endpoint, so the "
                "token ids it decodes cannot be checked against the reference's")
        if self.echo_usable() and self.echo_path != "decode":
            self.echo_not_checked.append(
                "decode path: the server does not say that its echo (prompt) logprobs come from its decode "
                "path, so golden checks and loglikelihood scores over it may never exercise the decode kernel")
        for name in ("token_ids", "gen_logprobs", "greedy", "echo_logprobs", "echo_consistency", "stop_strings"):
            if f[name].ok is False:
                self.notes.append(f"{name}: {f[name].detail}")
        if not self.echo_usable():
            self.notes.append("loglikelihood tasks and golden checks are impossible over this server (no usable "
                              "echo prompt logprobs)")
        self.identity = {k: info.get(k) for k in ("id", "root", "owned_by", "created", "max_model_len", "evalsuite")}
        self.canary = {"text": canary["text"], "token_ids": canary["ids"],
                       "logprobs": [round(float(x), 4) for x in canary["logprobs"] or []]}
        return want, info, f

    def _usable(self) -> set[str]:
        """Names of what the probe found usable (for the record; typed: self.capabilities)."""
        f = self.findings
        caps = {"generate"}
        for name in ("token_ids", "gen_logprobs", "stop_strings", "chat", "tokenize"):
            if f[name].ok:
                caps.add(name)
        if self.echo_usable():
            caps.add("echo_logprobs")
        return caps

    def echo_usable(self) -> bool:
        """Echo logprobs are used only when present and shown aligned with the decode path: misaligned
        echo, or echo whose alignment could not be checked, would score on bad data. (Aligned echo whose
        values disagree with decode is used: that is the engine's own inconsistency, for checks to judge.)"""
        f = self.findings
        return bool(f["echo_logprobs"].ok) and f["echo_consistency"].ok is not None and not self.echo_misaligned

    @property
    def fingerprint(self) -> str:
        """The server's reported identity and the canary's greedy text and ids taken at start (see
        probe.probe_generation). The canary's logprobs are not hashed (a server with a prompt cache,
        llama.cpp's, returns values that move by up to 0.063 nats between identical requests); the
        journal compares them within CANARY_TOL instead (bench/adapter.py)."""
        blob = json.dumps({"base": self.base, "identity": self.identity, "dtype": self.dtype,
                           "canary": {k: self.canary.get(k) for k in ("text", "token_ids")}},
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    canary_tol = probe.ECHO_CONSISTENCY_TOL  # the same server's echo against decode logprobs, measured

    def canary_logprobs(self) -> list[float]:
        return [float(x) for x in self.canary.get("logprobs") or []]

    # ---- requests --------------------------------------------------------------------------------
    def wire_prompt(self, ids: Sequence[int]):
        """A prompt as the server takes it: token ids, or text whose tokenization is checked."""
        ids = list(map(int, ids))
        if self.token_prompts:
            return ids
        if self.tok is None:
            raise ModelError("the server takes only text prompts and there is no local tokenizer (--model)")
        text = self.tok.decode(ids)
        if self.tok.encode(text) != ids:
            raise ModelError(f"a prompt of {len(ids)} tokens does not survive decode/encode with --model's tokenizer, "
                             "so it cannot be sent as text to a server that refuses token ids")
        if self.tokenize_route is not None:
            got = self.tokenize(text)
            if got != ids:
                at = next((i for i, (a, b) in enumerate(zip(got, ids)) if a != b), min(len(got), len(ids)))
                raise ModelError(f"the server tokenizes a prompt differently from --model's tokenizer (first "
                                 f"difference at token {at} of {len(ids)}): token-level comparison is impossible")
        return text

    def body(self, ids: Sequence[int], max_tokens: int) -> dict:
        return {"prompt": self.wire_prompt(ids), "max_tokens": max_tokens}

    def completion_raw(self, body: dict, attempts: int = MAX_ATTEMPTS, n: int | None = None) -> dict:
        body = {"model": self.model_id, "temperature": 0, **self.sampling, **body}

        def ok(r):
            ch = r["choices"]
            if n is not None and (not isinstance(ch, list) or len(ch) != n):
                raise ValueError(f"{len(ch) if isinstance(ch, list) else 'no'} choices for {n} prompts")
            for c in ch:
                if not isinstance(c.get("text"), str) or c.get("finish_reason") not in ("stop", "length"):
                    raise ValueError("a choice without text or finish_reason (partial reply?)")

        # a generation that got no reply is never sent again: the server may still be running it
        return self.post(f"{self.base}/completions", body, attempts=attempts, check=ok, timeout=self.deadline(body),
                         resend=False)

    def completion(self, prompt, max_tokens, logprobs, echo, ignore_eos=False, stop=(), decode_from: int | None = None,
                   logprobs_from: int | None = None):
        """One /v1/completions call for one prompt (ids) or several (a list of id lists). decode_from and
        logprobs_from: evalsuite serve's echo extensions (evalsuite/serve/app.py)."""
        rows = prompt if prompt and isinstance(prompt[0], (list, tuple)) else [prompt]
        wire = [self.wire_prompt(p) for p in rows]
        body = {"prompt": wire if len(rows) > 1 else wire[0], "max_tokens": max_tokens, "echo": echo}
        if decode_from is not None and decode_from >= 1:  # evalsuite serve's extension (see serve.py)
            body["echo_decode_from"] = decode_from
        if logprobs_from is not None and logprobs_from >= 1:
            body["echo_logprobs_from"] = logprobs_from
        if logprobs is not None:
            body["logprobs"] = logprobs
        if ignore_eos:
            body["ignore_eos"] = True
        if stop:
            body["stop"] = list(stop)
        r = self.completion_raw(body, n=len(rows))
        used = (r.get("usage") or {}).get("prompt_tokens")
        if not self.token_prompts and len(rows) == 1 and isinstance(used, int) and used != len(rows[0]):
            if self.probing:  # the canary itself: another model or tokenizer behind the URL
                raise ModelError(f"POST {self.base}/completions: {probe.count_mismatch(self, used, len(rows[0]))}")
            with self._lock:  # one prompt the server's tokenizer splits otherwise: that row is not comparable
                self.read_differently.append((used, len(rows[0])))
            r["_prompt_counted"] = used
        return r

    def tokenize(self, text: str) -> list[int]:
        """Token ids from the server's tokenize endpoint when it has one, else from the local tokenizer."""
        if self.tokenize_route is None:
            if self.tok is None:
                raise ModelError("no tokenize endpoint on the server and no local tokenizer (--model)")
            return self.tok.encode(text)
        hit = self._tok_cache.get(text)
        if hit is None:
            path, shape = self.tokenize_route

            def ok(r):
                if not isinstance(r.get("tokens"), list):
                    raise ValueError("no tokens")

            hit = self.post(self.root + path, shape(self.model_id, text), check=ok)["tokens"]
            if len(self._tok_cache) < 100_000:
                self._tok_cache[text] = hit
        return list(hit)

    # ---- the protocol ----------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int] = (),
                 top_k: int = 5, want_logits: bool = False, stop_check=None,
                 stop_strings: Sequence[str] = ()) -> list[Generation]:
        if want_logits:
            raise ModelError("the openai engine cannot return full-vocabulary logits")
        stop_set = {int(s) for s in stop_ids}
        eos = set(self.tok.eos_ids) if self.tok else set()
        ignore_eos = not (eos and eos <= stop_set)  # the caller wants to run past end-of-turn
        k = top_k if self.capabilities.gen_logprobs else None
        per = ROWS_PER_REQUEST if self.batched else 1
        chunks = [list(range(s, min(s + per, len(prompts)))) for s in range(0, len(prompts), per)]
        server_stops = tuple(stop_strings) if self.capabilities.stop_strings else ()

        send_stops = server_stops or (tuple(stop_strings) if self.stops_kept else ())

        def run(idx):
            rows = [list(map(int, prompts[i])) for i in idx]
            r = self.completion(rows if len(rows) > 1 else rows[0], max_new_tokens, k, False,
                                ignore_eos=ignore_eos and self.ignore_eos, stop=send_stops)
            choices = sorted(r["choices"], key=lambda c: c.get("index", 0))
            n = parse.counted(r, len(choices))
            if self.stops_kept and send_stops:  # it stopped at the string but kept it: cut it off here
                cuts = [parse.drop_kept_stop(c, send_stops) for c in choices]
                choices = [c for c, _ in cuts]
                n = None if any(cut for _, cut in cuts) else n  # its count includes the cut-off string
            gens = [parse.generation(self.tok, prompts[i], c, stop_set, top_k, counted=n)
                    for i, c in zip(idx, choices)]
            if not server_stops and self.tok is not None and len(self.tok.eos_ids) == 1:
                for g, c in zip(gens, choices):
                    parse.restore_eos(g, c, max_new_tokens, self.tok.eos_ids[0])
            for g, c in zip(gens, choices):
                parse.cross_check(g)
                if c.get("_stop_cut"):  # its text was cut here: re-tokenized ids at the cut are not the server's
                    g.ids_exact, g.text = False, c["text"]
                if "_prompt_counted" in r:
                    g.prompt_counted = r["_prompt_counted"]
            return gens

        tokens = [len(prompts[i]) + max_new_tokens for c in chunks for i in c]
        out = [g for part in pace.fan_out(self, run, chunks, self.concurrency, sum(tokens) // max(len(chunks), 1))
               for g in part]
        if stop_check is not None:
            for g in out:
                for j in range(1, len(g.token_ids) + 1):
                    if stop_check(g.token_ids[:j]):
                        g.token_ids, g.top_ids, g.top_logprobs = g.token_ids[:j], g.top_ids[:j], g.top_logprobs[:j]
                        g.finish_reason = "stop"
                        break
        return out

    def forced_topk(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], k: int = 5,
                    want_logits: bool = False) -> list[Forced]:
        """Teacher-forced through echo, from the server's prompt-logprob path (evalsuite serve: its decode
        path from the prompt's last token on, `echo_decode_from`)."""
        if not self.capabilities.forced:
            raise ModelError(f"{self.capabilities.forced_refusal}, so loglikelihood scoring and golden checks are "
                             "impossible over it")
        if want_logits:
            raise ModelError("the openai engine cannot return full-vocabulary logits")
        def one(px):
            p, x = px
            seq = list(map(int, p)) + list(map(int, x))
            if self.echo_path == "decode":  # evalsuite serve: no token generated, the prompt's positions skipped
                r = self.completion(seq, 0, k, True, decode_from=len(p) - 1, logprobs_from=len(p))
            else:
                r = self.completion(seq, 1, k, True)
            lp = r["choices"][0].get("logprobs") or {}
            if len(lp.get("token_logprobs") or []) < len(seq):
                raise ModelError(f"POST {self.base}/completions: echo returned {len(lp.get('token_logprobs') or [])} "
                                 f"logprobs for {len(seq)} prompt tokens")
            return Forced(*parse.echo_rows(self.tok, lp, len(p), seq, k))

        # one echo request per prompt (the API's echo takes one prompt), ECHO_CONCURRENT in flight where the server
        # overlaps requests: one that batches concurrent requests (evalsuite serve does) scores them in one call
        pairs = list(zip(prompts, continuations))
        workers = ECHO_CONCURRENT if self.concurrency > 1 else 1
        return pace.fan_out(self, one, pairs, workers, sum(len(p) + len(x) for p, x in pairs) // max(len(pairs), 1))

    def run_notes(self) -> list[str]:
        """What blocks a PASS that was found while running (not at the probe): prompts the server read otherwise."""
        return [probe.read_otherwise(self.read_differently)] if self.read_differently else []

def _with_context(c: Config, n: int) -> Config:
    import dataclasses

    return c if c.max_context == n else dataclasses.replace(c, max_context=n)
