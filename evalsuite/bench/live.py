"""Running accuracy for the progress bars, read from each request's lm-eval doc.

An estimate shown while a run is in progress: the same extraction rules as the task YAMLs
(GSM8K: last number, as flexible-extract; GPQA CoT: the last "(X)", as flexible-extract's
group_select -1, which also maps a quoted choice text to its letter; multiple choice: the choice with
the highest loglikelihood). On smollm2's full GPQA-Diamond CoT run the last "(X)" agreed
with flexible-extract on 196 of 198 items; the earlier rule, "answer is (X)", on 162. The scores that
count are lm-eval's, computed after the run. Docs that carry none of the known gold fields give no
estimate (the bar then shows none).
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # flexible-extract's pattern
_LETTER = re.compile(r"\(([A-Z])\)", re.IGNORECASE)  # flexible-extract's "(\([A-Z]\))"


def _norm_number(s: str) -> str:
    return s.replace(",", "").replace("$", "").rstrip(".").strip()


def gold_of(doc) -> tuple[str, str] | None:
    """(kind, gold) for a doc: ("number", "18") for GSM8K, ("letter", "B") for GPQA."""
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("answer"), str) and "####" in doc["answer"]:
        return "number", _norm_number(doc["answer"].split("####")[-1])
    if isinstance(doc.get("answer_letter"), str):
        return "letter", doc["answer_letter"]
    return None


def judge_generation(doc, response: str) -> bool | None:
    gold = gold_of(doc)
    if gold is None:
        return None
    kind, want = gold
    if kind == "number":
        found = [m.group(0) for m in _NUMBER.finditer(response)]
        return bool(found) and _norm_number(found[-1]) == want
    found = _LETTER.findall(response)
    return bool(found) and found[-1].upper() == want


class Tally:
    """Correct/seen counts, rendered as the bar's postfix."""

    def __init__(self):
        self.right = 0
        self.seen = 0

    def add(self, ok: bool | None) -> None:
        if ok is not None:
            self.seen += 1
            self.right += int(ok)

    def postfix(self) -> dict:
        return {"acc": f"{self.right / self.seen:.3f} ({self.right}/{self.seen})"} if self.seen else {}


class ChoiceTally(Tally):
    """Multiple choice: a doc counts once all its choices are scored (argmax loglikelihood vs gold)."""

    def __init__(self):
        super().__init__()
        self.pending: dict = {}

    def add_choice(self, doc, doc_id, idx: int, n_choices: int, ll: float) -> None:
        gold = gold_of(doc)
        if gold is None or gold[0] != "letter":
            return
        got = self.pending.setdefault(doc_id, {})
        got[idx] = ll
        if len(got) == n_choices:
            best = max(got, key=got.get)
            self.add("ABCD"[best] == gold[1] if best < 4 else False)
            del self.pending[doc_id]
