"""The sanity task's answer extraction (a custom lm-eval filter)."""

from __future__ import annotations

import re

_WORD = re.compile(r"[A-Za-z0-9]+")


def first_three(text: str) -> str:
    """The first three words of the first line, a leading "and" skipped, joined by ", "."""
    words = _WORD.findall(text.split("\n")[0])
    if words[:1] == ["and"]:
        words = words[1:]
    return ", ".join(words[:3])


def extract(resps, docs):
    return [[first_three(r) for r in rs] for rs in resps]
