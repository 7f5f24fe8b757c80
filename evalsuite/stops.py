"""Stop strings over generated token ids: shared by the lm-eval adapter and `evalsuite serve`."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def visible_text(tok, ids: Sequence[int]) -> str:
    """The text of generated ids without the end-of-turn ids (which end a turn, not text)."""
    return tok.decode([i for i in ids if i not in tok.eos_ids])


def stop_check(tok, stops: Sequence[str]) -> Callable[[list[int]], bool] | None:
    """An engine stop_check: a row ends as soon as its text holds one of stops (None: no stops)."""
    stops = [s for s in stops if s]
    if not stops:
        return None
    return lambda ids: any(s in visible_text(tok, ids) for s in stops)


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """text up to the earliest stop string, and that string (None when none occurs)."""
    hits = [(text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return text, None
    at, s = min(hits)
    return text[:at], s
