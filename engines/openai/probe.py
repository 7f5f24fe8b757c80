"""What an OpenAI-compatible server can do, discovered by asking it, never assumed.

Each finding is (ok, detail): ok True/False, or None where it could not be determined. The
probe sends a handful of small requests (optional features are tried once, without retries):
  models           the served model id (and the context length where /v1/models lists one)
  tokenize         a tokenize endpoint at one of the known paths, and whether it agrees with the
                   local tokenizer of --model on a text with digits, accents and a control token
  token_prompts    prompts as token-id lists (else text, each prompt's tokenization checked
                   through the tokenize endpoint, or reported unchecked)
  batched_prompts  several prompts in one request (else one request per prompt); asked last
  pace             tokens/s decoding one request (and prefilling), and whether two requests at once
                   overlap: how many the client sends at once and each request's deadline
  ignore_eos       vLLM's extension to run past end-of-turn (diff decodes exactly N tokens)
  neutral_sampling repetition/frequency/presence penalties pinned to their neutral values
                   (llama.cpp's server applies repeat_penalty 1.1 unless told otherwise)
  token_ids        generated token ids in the reply (else reconstructed from logprob pieces/text)
  gen_logprobs     logprobs of generated tokens, and top-k alternatives
  greedy           each generated token is the argmax of the logprobs the server itself reports
  echo_logprobs    echo=True returns prompt logprobs
  echo_consistency echo's logprob of each token equals the decode path's for the same token
                   (a known continuation scored both ways); misaligned echo is named as such
  echo_path        which path the server says its echo logprobs come from (evalsuite serve: decode)
  chat             POST /v1/chat/completions answers
  stop_strings     a stop string is honoured (the text ends before it; or it stops there and keeps it)
  max_context      the server's context length, where it tells
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engines.base import Capabilities
from engines.errors import ModelError
from engines.openai import http, parse

# Known tokenize endpoints: (path relative to the server root, request body for a text).
TOKENIZE_ROUTES = (
    ("/tokenize", lambda model, text: {"model": model, "prompt": text}),  # vLLM, SGLang, evalsuite serve
    ("/extras/tokenize", lambda model, text: {"model": model, "input": text}),  # llama-cpp-python
    ("/tokenize", lambda model, text: {"content": text}),  # llama.cpp's own llama-server
)
PROBE_TEXT = "<|im_start|>user\nThe probe: 12,345 apples, naïve café.<|im_end|>"
CANARY_PROMPT = "evalsuite canary: one, two, three,"  # greedy ids + logprobs of it identify a served engine
CANARY_TOKENS = 8
# Neutral values of the penalties servers apply to "greedy" requests by default: names used by
# OpenAI (frequency/presence), vLLM/TGI (repetition_penalty) and llama.cpp (repeat_penalty).
NEUTRAL_SAMPLING = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
                    "repeat_penalty": 1.0}
# Echo and decode logprobs of the same token agree within this when echo is aligned. Measured on
# the reference (not on any server): its bf16 recipe, prefill path vs decode path, smollm2-135m,
# quick set, 128 positions: max |Δlogprob| 0.044 (f32: 1.6e-5); 0.1 is about twice that. A
# misaligned echo differs by nats (llama-cpp-python 0.3.36: 7-18 nats on the canary).
ECHO_CONSISTENCY_TOL = 0.1
# The generated token counts as the argmax of the server's own logprobs when its logprob is within
# this of the reported top-1 (exact ties and float printing).
GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class Finding:
    ok: bool | None
    detail: str

    def to_json(self) -> dict:
        return {"ok": self.ok, "detail": self.detail}


def probe_tokenize(eng) -> tuple[tuple | None, Finding]:
    for path, shape in TOKENIZE_ROUTES:
        try:
            r = eng.post(eng.root + path, shape(eng.model_id, PROBE_TEXT))
        except ModelError:
            continue
        toks = r.get("tokens")
        if isinstance(toks, list) and toks and all(isinstance(t, int) for t in toks):
            route = (path, shape)
            if eng.tok is not None and toks != eng.tok.encode(PROBE_TEXT):
                return route, Finding(True, f"POST {path}; it tokenizes differently from --model's tokenizer "
                                            "(token ids are not comparable)")
            return route, Finding(True, f"POST {path}; agrees with --model's tokenizer on the probe text")
    return None, Finding(False, "no tokenize endpoint at " + ", ".join(sorted({p for p, _ in TOKENIZE_ROUTES})))


def _try(eng, body, attempts: int | None = None) -> tuple[dict | None, str]:
    """A completion that may be refused: (reply, "") or (None, why). A 5xx is retried as always (unless
    attempts=1), so a flaky server is not mistaken for one without the feature; a 4xx or validation error is
    final. A server that stopped answering is not a refusal: that error is raised."""
    try:
        return (eng.completion_raw(body) if attempts is None else eng.completion_raw(body, attempts=attempts)), ""
    except http.ServerDead:
        raise
    except ModelError as e:
        return None, str(e).split(": ", 1)[-1]


PROMPT_TEXT = "The probe"  # the short prompt of the request-field probes


def _probe_ids(eng) -> list[int]:
    return eng.tok.encode(PROMPT_TEXT) if eng.tok else [1, 2]


def probe_token_prompts(eng, f: dict) -> bool:
    """Whether the server takes token-id prompts (else prompts go as text)."""
    r, why = _try(eng, {"prompt": _probe_ids(eng), "max_tokens": 1})
    f["token_prompts"] = Finding(r is not None, "token-id prompts accepted" if r is not None else
                                 f"token-id prompts refused ({why}): prompts are sent as text")
    return r is not None


def probe_batched(eng, f: dict) -> bool:
    """Several prompts per request. Asked last and once: llama-cpp-python's server answers a list of prompts with
    an assertion (HTTP 500), and a server that breaks on it should break after everything else is known, with
    the request named. A 5xx here is followed by asking whether the server still answers at all."""
    ids = _probe_ids(eng)
    two = [eng.wire_prompt(ids), eng.wire_prompt(ids[:1])]
    r, why = _try(eng, {"prompt": two, "max_tokens": 1}, attempts=1)
    ok = r is not None and len(r.get("choices") or []) == 2
    f["batched_prompts"] = Finding(ok, "several prompts per request" if ok else
                                   f"one prompt per request ({why or 'the reply had the wrong number of choices'})")
    if r is None and "HTTP 5" in why:
        dead = eng.trail.dead(eng._key)
        if dead is not None:
            raise http.ServerDead(eng.trail.dead_message("the probe's list-of-prompts completion", why, dead))
    return ok


def probe_request_fields(eng, f: dict) -> tuple[bool, dict]:
    """(ignore_eos accepted, the sampling fields pinned neutral), in the prompt form the client already chose."""
    ids = _probe_ids(eng)
    r, why = _try(eng, {"prompt": eng.wire_prompt(ids), "max_tokens": 1, "ignore_eos": True})
    ignore_eos = r is not None
    f["ignore_eos"] = Finding(r is not None, "ignore_eos accepted (if not honoured, generations end at end-of-turn)"
                              if r is not None
                              else f"ignore_eos refused ({why}): generations end at the end-of-turn token")
    r, why = _try(eng, {"prompt": eng.wire_prompt(ids), "max_tokens": 1, **NEUTRAL_SAMPLING})
    sampling = dict(NEUTRAL_SAMPLING) if r is not None else {"frequency_penalty": 0.0, "presence_penalty": 0.0}
    f["neutral_sampling"] = Finding(r is not None, ("penalties pinned neutral: " + ", ".join(NEUTRAL_SAMPLING))
                                    if r is not None else f"server-specific penalty fields refused ({why}); "
                                    "only frequency/presence_penalty pinned to 0")
    return ignore_eos, sampling


def probe_generation(eng, f: dict) -> dict:
    """The canary: greedy ids + logprobs of a fixed prompt (also the server's fingerprint)."""
    p = eng.tok.encode(CANARY_PROMPT) if eng.tok else [1, 2, 3]
    r = eng.completion(p, CANARY_TOKENS, logprobs=5, echo=False)
    ch = r["choices"][0]
    ids, how, exact = parse.generated_ids(eng.tok, ch)
    f["token_ids"] = Finding(how == "token_ids", {
        "token_ids": "returned (token_ids)",
        "pieces": "not returned; rebuilt from the logprob token strings (each exactly one token of --model)",
        "text": "not returned; generated text re-tokenized with --model's tokenizer"}[how])
    lp = ch.get("logprobs") or {}
    tl = lp.get("token_logprobs")
    has_lp = isinstance(tl, list) and bool(tl) and all(isinstance(x, (int, float)) for x in tl)
    tops = parse.top_rows(eng.tok, lp, len(tl), 5) if has_lp else []
    k = min((sum(1 for a, _ in row if a >= 0) for row in tops), default=0)
    f["gen_logprobs"] = Finding(has_lp, f"generated-token logprobs with top-{k} alternatives" if has_lp
                                else "no logprobs for generated tokens")
    if has_lp and tops:
        off = [j for j, row in enumerate(tops) if row and tl[j] < max(v for _, v in row) - GREEDY_EPS]
        f["greedy"] = Finding(not off, "every generated token is the argmax of the server's own logprobs" if not off
                              else f"generated tokens at positions {off} are not the argmax of the server's own "
                                   "logprobs (a sampler setting or penalty is active)")
    else:
        f["greedy"] = Finding(None, "not checked: the server returns no logprobs to check its tokens against")
    # the exactly known prefix (a byte-level token cut mid-character cannot be rebuilt from text)
    usable = exact if has_lp and len(tl) >= exact else 0
    return {"prompt": p, "ids": ids, "text": ch.get("text"), "logprobs": tl if has_lp else None,
            "exact": usable}


def probe_echo(eng, f: dict, canary: dict) -> tuple[str | None, bool]:
    """(the path the server says echo logprobs come from, whether they sit one position off)."""
    p, ids = canary["prompt"], canary["ids"][:canary["exact"]]
    seq = list(p) + list(ids)
    try:
        wire = eng.body(seq, 1)
    except ModelError:  # a text-only server and a continuation that is not valid text
        seq, ids, canary = list(p), [], {**canary, "exact": 0}
        wire = eng.body(seq, 1)
    r, why = _try(eng, {**wire, "logprobs": 5, "echo": True})
    ch = (r or {}).get("choices", [{}])[0]
    lp = ch.get("logprobs") or {}
    tl = lp.get("token_logprobs") or []
    present = len(tl) >= len(seq) and len(seq) > 1 and all(isinstance(x, (int, float)) for x in tl[1:len(seq)])
    f["echo_logprobs"] = Finding(present, "echo=True returns prompt logprobs" if present else
                                 f"no prompt logprobs with echo=True ({why or 'none in the reply'})")
    ext = (r or {}).get("evalsuite") if isinstance((r or {}).get("evalsuite"), dict) else {}
    echo_path = ext.get("echo_path") if present else None
    f["echo_path"] = Finding((echo_path == "decode") if present and echo_path else None,
                             f"the server says echo logprobs come from its {echo_path} path" if echo_path
                             else "not stated by the server")
    if not present:
        f["echo_consistency"] = Finding(None, "not checked: no echo logprobs")
        return echo_path, False
    if canary["logprobs"] is None or canary["exact"] < 2:
        f["echo_consistency"] = Finding(None, "not checked: no generated tokens known exactly (ids and logprobs, "
                                              "sendable back) to compare echo with")
        return echo_path, False
    P, n = len(p), len(ids)
    gen = np.asarray(canary["logprobs"][:n], float)
    echo = np.asarray(tl[P:P + n], float)
    d0 = float(np.max(np.abs(echo - gen)))
    if d0 <= ECHO_CONSISTENCY_TOL:
        f["echo_consistency"] = Finding(True, f"echo and decode logprobs of {n} generated tokens agree "
                                              f"(max |Δ| {d0:.2g} <= {ECHO_CONSISTENCY_TOL})")
        return echo_path, False
    shift = _misalignment(eng, lp, tl, P, ids, gen)
    if shift is not None:
        f["echo_consistency"] = Finding(False, (
            f"MISALIGNED by one position: echo's logprobs sit {shift:+d} position from the tokens they belong to "
            f"(max |Δ| against the decode path {d0:.3g} nats where they should agree); loglikelihood scores over "
            "it would be wrong"))
        return echo_path, True
    bad = int(np.sum(np.abs(echo - gen) > ECHO_CONSISTENCY_TOL))
    f["echo_consistency"] = Finding(False, (
        f"echo and decode logprobs of the same tokens differ by up to {d0:.3g} nats at {bad} of {n} positions, "
        "aligned: the engine's prefill/echo and decode paths disagree (one of them is wrong); echo is used and "
        "the checks over it judge it"))
    return echo_path, False


def _misalignment(eng, lp: dict, tl: list, P: int, ids: list[int], gen: np.ndarray) -> int | None:
    """+1 (or -1) when echo's entries are shifted by one position against the decode path's: either its
    values (entry t holds token t+1's logprob), or its distributions (entry t-1 holds the distribution
    that token t is drawn from, as llama-cpp-python 0.3.36 returns); None otherwise."""
    n = len(ids)
    for o in (1, -1):
        pairs = [(tl[P + j + o], gen[j]) for j in range(n)
                 if 1 <= P + j + o < len(tl) and isinstance(tl[P + j + o], (int, float))]
        if len(pairs) >= max(2, n - 1) and max(abs(a - b) for a, b in pairs) <= ECHO_CONSISTENCY_TOL:
            return o
    tops = parse.top_rows(eng.tok, lp, len(tl), 5)
    shifted = []
    for j in range(n):
        row = dict(tops[P + j - 1]) if tops and P + j - 1 >= 1 and tops[P + j - 1] else {}
        if ids[j] in row:
            shifted.append(abs(row[ids[j]] - gen[j]))
    if len(shifted) >= max(2, n // 2) and max(shifted) <= ECHO_CONSISTENCY_TOL:
        return -1
    return None


def probe_extras(eng, f: dict, canary: dict, listed: dict) -> int | None:
    """Chat and stop-string support (findings only), and the server's context length (None: not stated)."""
    try:
        r = eng.post(eng.base + "/chat/completions", {"model": eng.model_id, "max_tokens": 1, "temperature": 0,
                                                       "messages": [{"role": "user", "content": "Hi"}]}, attempts=1)
        ok = isinstance((r.get("choices") or [{}])[0].get("message"), dict)
        f["chat"] = Finding(ok, "POST /v1/chat/completions answers" if ok else "chat reply without a message")
    except ModelError as e:
        f["chat"] = Finding(False, f"no chat endpoint ({str(e).split(': ', 1)[-1]})")
    text = canary.get("text") or ""
    stop = None
    # a piece of the canary's own text, after its start and first seen where it stands, as the stop string
    for size in (3, 2, 1):
        stop = next((text[k:k + size] for k in range(max(1, len(text) // 3), len(text) - size + 1)
                     if text[k:k + size].strip() == text[k:k + size] and "\ufffd" not in text[k:k + size]
                     and text.find(text[k:k + size]) == k), None)
        if stop:
            break
    if stop is None:
        f["stop_strings"] = Finding(None, "not checked: the canary text offers no stop string")
    else:
        r, why = _try(eng, {**eng.body(canary["prompt"], CANARY_TOKENS), "stop": [stop]})
        got = ((r or {}).get("choices") or [{}])[0].get("text")
        ok = got == text[:text.find(stop)]
        eng.stops_kept = not ok and got == text[:text.find(stop) + len(stop)]
        f["stop_strings"] = Finding(ok, "honoured (the text ends before the stop string)" if ok else
                                    "the server stops at a stop string but keeps it in its text: they are sent, "
                                    "and the client cuts the string off" if eng.stops_kept else
                                    f"not honoured ({why or f'text {got!r}'}): stop strings are applied by the client")
    n = listed.get("max_model_len")
    if not isinstance(n, int):
        try:
            props = eng.get(eng.root + "/props", attempts=1)
            n = ((props.get("default_generation_settings") or {}).get("n_ctx"))
        except ModelError:
            n = None
    f["max_context"] = Finding(isinstance(n, int), f"{n} tokens" if isinstance(n, int) else
                               "not stated: --model's context is assumed; a longer request gets the server's error")
    return n if isinstance(n, int) else None


def capabilities(eng) -> Capabilities:
    """The probe's findings as the engine's typed Capabilities: what is usable, what blocks a PASS
    (prompt tokenization not confirmed; echo not stated to come from the decode path) and why echo is
    refused where it is."""
    f = eng.findings
    bad = f["echo_consistency"] if f["echo_logprobs"].ok else f["echo_logprobs"]
    refusal = (f"{eng.base}: echo prompt logprobs unusable ({'echo consistency' if f['echo_logprobs'].ok else 'echo'}: "
               f"{bad.detail})")
    return Capabilities(
        logits=False, taps=False, gen_logprobs=bool(f["gen_logprobs"].ok), forced=eng.echo_usable(),
        forced_path=eng.echo_path or "unstated", forced_refusal="" if eng.echo_usable() else refusal,
        stop_strings=bool(f["stop_strings"].ok),
        runs_past_eos=False,  # ignore_eos accepted is not ignore_eos honoured (llama.cpp accepts and ignores it)
        blocking=tuple(eng.prompt_not_checked), forced_blocking=tuple(eng.echo_not_checked),
        notes=tuple(eng.notes), findings=tuple((k, v.ok, v.detail) for k, v in f.items()))


def count_mismatch(eng, used: int, n: int) -> str:
    """Why a server's prompt-token count differs from --model's tokenization, said as the evidence allows."""
    tokenize = eng.findings.get("tokenize") if isinstance(getattr(eng, "findings", None), dict) else None
    if tokenize is not None and tokenize.ok and "differently" in tokenize.detail:
        why = "its tokenizer differs from --model's (the probe's tokenize check says so)"
    elif used == n + 1 and getattr(eng, "probing", True):
        why = "one more: does it add a BOS token?"
    else:
        why = (f"it tokenizes differently from --model's tokenizer: is it serving another model than --model? "
               f"(it serves {eng.model_id!r})")
    return (f"the server counted {used} prompt tokens where --model's tokenizer makes {n} ({why}): token-level "
            "comparison is impossible")


def read_otherwise(pairs: list[tuple[int, int]]) -> str:
    """The not-checked line for prompts a server counted otherwise than --model's tokenizer, (its count, ours)."""
    used, n = pairs[0]
    return (f"prompt tokenization: the server read {len(pairs)} prompt(s) as a different number of tokens than "
            f"--model's tokenizer (e.g. {used} where it makes {n}; the canary's counts agreed): its tokenizer splits "
            "some texts otherwise, so those rows are not comparable token for token")
