"""Pure parsers of OpenAI-compatible replies: no I/O, no state. Token ids are carried as the server
sends them; token strings are turned into ids (with --model's tokenizer) only where a server sends
no ids."""

from __future__ import annotations

import numpy as np

from engines.base import Generation


def top_rows(tok, lp: dict, n: int, k: int) -> list[list[tuple[int, float]]]:
    """Per position the top alternatives [(id, logprob)], most likely first; [] when the reply has none.
    Ids from `top_logprobs_by_id` (evalsuite serve's extension) as sent; an OpenAI token-string key that
    is not exactly one token of --model gets id -1 (never matched)."""
    by_id = lp.get("top_logprobs_by_id")
    if isinstance(by_id, list) and len(by_id) >= n:
        return [[(int(a), float(b)) for a, b in (row or [])[:k]] for row in by_id]
    tops = lp.get("top_logprobs")
    if isinstance(tops, list) and len(tops) >= n:
        return [by_string(tok, row)[:k] for row in tops]
    return []


def by_string(tok, top: dict | None) -> list[tuple[int, float]]:
    out = []
    for s, v in sorted((top or {}).items(), key=lambda z: -z[1]):
        enc = tok.encode(s) if tok and s else []
        out.append((enc[0] if len(enc) == 1 else -1, float(v)))
    return out


def generated_ids(tok, ch: dict) -> tuple[list[int], str, int]:
    """(ids, how, exact): the generated ids of a choice, how they were obtained ("token_ids",
    "pieces": the logprob token strings, each exactly one token of --model, or "text": re-tokenized),
    and how many leading ids are surely the engine's own."""
    if isinstance(ch.get("token_ids"), list):
        ids = [int(t) for t in ch["token_ids"]]
        return ids, "token_ids", len(ids)
    text = ch.get("text") or ""
    if tok is None:
        return [], "text", 0
    pieces = (ch.get("logprobs") or {}).get("tokens")
    prefix: list[int] = []
    for s in pieces if isinstance(pieces, list) else []:
        enc = tok.encode(s) if isinstance(s, str) and s else []
        if len(enc) != 1:
            break
        prefix.append(enc[0])
    if isinstance(pieces, list) and pieces and len(prefix) == len(pieces) and tok.decode(prefix) == text:
        return prefix, "pieces", len(prefix)
    ids = tok.encode(text)
    return ids, "text", len(ids) if "\ufffd" not in text else len(prefix)


def generation(tok, prompt, ch: dict, stop_set: set[int], k: int, counted: int | None = None) -> Generation:
    """A choice of a /v1/completions reply as a Generation (ids cut after the first stop id). counted: the
    server's own `usage.completion_tokens` for this choice, where the reply gives it for one choice."""
    ids, how, exact_n = generated_ids(tok, ch)
    lp = ch.get("logprobs") or {}
    tl = lp.get("token_logprobs")
    if exact_n < len(ids):  # rebuilt ids are not the engine's; keep the server's per-token logprobs as they came
        n = len(tl) if isinstance(tl, list) else 0
        top_lp = np.full((n, k), np.nan, np.float32)
        top_lp[:, 0] = [np.nan if x is None else float(x) for x in (tl or [])]
        return Generation(list(map(int, prompt)), ids, np.full((n, k), -1, np.int64), top_lp,
                          ch.get("finish_reason") or "length", ids_exact=False, text=ch["text"], counted=counted)
    n = len(ids)
    top_ids = np.full((n, k), -1, np.int64)
    top_lp = np.full((n, k), np.nan, np.float32)
    for j, row in enumerate(top_rows(tok, lp, n, k)[:n]):
        for m, (a, b) in enumerate(row[:k]):
            top_ids[j, m], top_lp[j, m] = a, b
    if isinstance(tl, list) and len(tl) == n:  # the chosen token's own logprob (greedy: the top-1)
        top_lp[:, 0] = [np.nan if x is None else float(x) for x in tl]
        top_ids[:, 0] = ids
    cut = next((j + 1 for j, t in enumerate(ids) if t in stop_set), n)
    finish = "stop" if cut < n or (ids and ids[-1] in stop_set) or ch.get("finish_reason") == "stop" else "length"
    return Generation(list(map(int, prompt)), ids[:cut], top_ids[:cut], top_lp[:cut], finish, counted=counted,
                      text=ch.get("text") if how == "text" else None)


def cross_check(g: Generation) -> None:
    """Ids re-tokenized from text are trusted only where their number is the server's own count (where it gives
    one): a server that strips special tokens from its text, or whose text re-tokenizes differently, would
    otherwise be judged on ids it never generated. Where the counts differ the generation is compared as text."""
    if g.counted is None or g.text is None or not g.ids_exact or g.counted == len(g.token_ids):
        return
    g.ids_exact = False
    n = len(g.token_ids)
    g.top_ids, g.top_logprobs = np.full((n, 1), -1, np.int64), np.full((n, 1), np.nan, np.float32)


def counted(reply: dict, n_choices: int) -> int | None:
    """The server's `usage.completion_tokens` when the reply holds one choice (a sum over several says nothing
    about each); None when absent."""
    used = (reply.get("usage") or {}).get("completion_tokens")
    return used if n_choices == 1 and isinstance(used, int) and not isinstance(used, bool) and used >= 0 else None


def restore_eos(g: Generation, ch: dict, max_new_tokens: int, eos: int) -> None:
    """A server that stops at end-of-turn and leaves the token out of its reply (llama.cpp): with no
    stop strings sent, an early "stop" can only be that token, so it is put back (logprob unknown)."""
    if ch.get("finish_reason") == "stop" and len(g.token_ids) < max_new_tokens and g.ids_exact and (
            not g.token_ids or g.token_ids[-1] != eos):
        k = g.top_ids.shape[1] if g.top_ids.ndim == 2 else 1
        g.token_ids = list(g.token_ids) + [eos]
        g.top_ids = np.concatenate([g.top_ids.reshape(-1, k), np.full((1, k), -1, np.int64)])
        g.top_ids[-1, 0] = eos
        g.top_logprobs = np.concatenate([g.top_logprobs.reshape(-1, k), np.full((1, k), np.nan, np.float32)])
        g.finish_reason = "stop"


def echo_rows(tok, lp: dict, start: int, seq: list[int], k: int):
    """(token_logprobs [N], top_ids [N, k], top_logprobs [N, k]) of an echo reply's positions start.. of seq."""
    tl = lp.get("token_logprobs") or []
    rows = top_rows(tok, lp, len(seq), k)
    n = len(seq) - start
    ti = np.full((n, k), -1, np.int64)
    tv = np.full((n, k), np.nan, np.float64)
    for j, t in enumerate(range(start, len(seq))):
        for m, (a, b) in enumerate((rows[t] if len(rows) > t and rows[t] else [])[:k]):
            ti[j, m], tv[j, m] = a, b
    return np.array([float(tl[t]) for t in range(start, len(seq))]), ti, tv


def drop_kept_stop(ch: dict, stops) -> tuple[dict, bool]:
    """A choice from a server that stops at a stop string but leaves it at the end of its text (transformers
    serve): (the choice with the stop string cut off, as the API defines it; whether anything was cut)."""
    text = ch.get("text")
    if ch.get("finish_reason") != "stop" or not isinstance(text, str):
        return ch, False
    for s in stops:
        if s and text.endswith(s):
            return {**ch, "text": text[:-len(s)], "_stop_cut": True}, True
    return ch, False
