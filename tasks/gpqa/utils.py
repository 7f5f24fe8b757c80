"""GPQA helpers: lm-eval's own document processing (gpqa/zeroshot and gpqa/cot_zeroshot utils in
lm-eval 0.4.13: each answer stripped, " [title]" -> ". ", the first double space of each run halved;
the question left as written), with one deliberate difference: lm-eval shuffles the four answers with
the process-wide `random` state, so an item's order depends on which tasks were built before it and
in what order; here each question's order comes from its own seed, derived from its Record ID
(`choice_seed`), and is the same in every run, process and task order.
benchmarks/prompt_parity.py shows that this is the only difference in the prompts."""

from __future__ import annotations

import hashlib
import random


def preprocess(text) -> str:
    """lm-eval's answer clean-up, step for step (str.replace("  ", " ") halves each run of spaces once)."""
    if text is None:
        return " "
    return str(text).strip().replace(" [title]", ". ").replace("  ", " ")


def choice_seed(record_id: str) -> int:
    """The answer-order seed of one question: the first 8 bytes of sha256("gpqa:" + Record ID)."""
    return int.from_bytes(hashlib.sha256(f"gpqa:{record_id}".encode()).digest()[:8], "big")


def shuffled(doc) -> tuple[list[str], int]:
    """(the four answers in this question's order, index of the correct one)."""
    right = preprocess(doc["Correct Answer"])
    choices = [preprocess(doc["Incorrect Answer 1"]), preprocess(doc["Incorrect Answer 2"]),
               preprocess(doc["Incorrect Answer 3"]), right]
    random.Random(choice_seed(str(doc["Record ID"]))).shuffle(choices)
    return choices, choices.index(right)


def process_docs(dataset):
    def _doc(doc):
        choices, right = shuffled(doc)
        return {"choice1": choices[0], "choice2": choices[1], "choice3": choices[2], "choice4": choices[3],
                "choices": choices, "answer": f"({'ABCD'[right]})", "answer_letter": "ABCD"[right]}

    return dataset.map(_doc)
