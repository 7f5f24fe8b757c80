"""GPQA helpers: answer order shuffled with a seed derived from each question, never the global
random state, so the order is the same across runs, task order and processes."""

from __future__ import annotations

import hashlib
import random
import re


def _clean(text) -> str:
    if text is None:
        return " "
    return re.sub(r"\s+", " ", str(text).replace(" [title]", ". ")).strip()


def question_seed(question: str) -> int:
    return int.from_bytes(hashlib.sha256(_clean(question).encode()).digest()[:8], "big")


def process_docs(dataset):
    def _doc(doc):
        choices = [_clean(doc["Incorrect Answer 1"]), _clean(doc["Incorrect Answer 2"]),
                   _clean(doc["Incorrect Answer 3"]), _clean(doc["Correct Answer"])]
        random.Random(question_seed(doc["Question"])).shuffle(choices)
        right = choices.index(_clean(doc["Correct Answer"]))
        return {"Question": _clean(doc["Question"]), "choice1": choices[0], "choice2": choices[1],
                "choice3": choices[2], "choice4": choices[3], "answer": f"({'ABCD'[right]})",
                "answer_letter": "ABCD"[right]}

    return dataset.map(_doc)
