"""Generate the bundled sanity task (written for this project): items a 135M model gets right.

    python tasks/make_sanity.py     # rewrites tasks/data/sanity.jsonl deterministically (SEED)

Why it exists: on the GSM8K/GPQA samples smollm2-135m is near 0 / chance, so a fault that
breaks the engine cannot cost accuracy there and `run` could never show a FAIL. Here the
faithful model is accurate (measured in docs/benchmarks.md), so a broken engine loses items and the paired
verdict FAILs; and with 240 items a faithful engine can reach PASS (>= 183 needed at margin 0.02).
Kinds: the next three numbers of a run counting by 1, 2 or 10, the next three weekdays, a repeated
word three more times (each answer spans several decode steps, so a decode bug can change it).
Each item also has 4 choices (the answer and 3 runs of its kind) for the loglikelihood variant.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 20261201
N_ITEMS = 240
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
LETTERS = [chr(ord("A") + i) for i in range(26)]
WORDS = ["apple", "river", "garden", "window", "candle", "pencil", "rabbit", "orange", "silver", "planet",
         "basket", "forest", "butter", "rocket", "guitar", "button", "pillow", "carpet", "dragon", "mirror"]


def _item(rng: random.Random, kind: str) -> tuple[str, str, list[str]]:
    """(question, answer: the next three items, 3 distractors: other runs of three of the same kind)."""
    if kind in ("count", "evens", "tens"):
        step = {"count": 1, "evens": 2, "tens": 10}[kind]
        s = rng.randint(1, 40) * (step if kind == "tens" else 1) * (2 if kind == "evens" else 1)
        seq_all, start = [str(s + step * i) for i in range(10)], 0
    elif kind == "copy":
        w = rng.choice(WORDS)
        q, a = f"{w}, {w}, {w}, {w},", f"{w}, {w}, {w}"
        others = rng.sample([x for x in WORDS if x != w], 3)
        return q, a, [f"{x}, {x}, {x}" for x in others]
    else:
        seq_all = {"day": DAYS, "month": MONTHS, "letter": LETTERS}[kind]
        start = rng.randrange(len(seq_all) - 9 if kind == "letter" else len(seq_all))  # letters never wrap
    n = len(seq_all)
    item = [seq_all[(start + i) % n] for i in range(7)]
    q, a = ", ".join(item[:4]) + ",", ", ".join(item[4:7])
    wrong = [", ".join(seq_all[(start + 4 + d + i) % n] for i in range(3)) for d in (-2, 1, 2)]
    return q, a, wrong


def items() -> list[dict]:
    rng = random.Random(SEED)
    kinds = ["count", "evens", "tens", "day", "copy"]
    out = []
    for i in range(N_ITEMS):
        kind = kinds[i % len(kinds)]
        q, a, wrong = _item(rng, kind)
        choices = [a, *wrong]
        rng.shuffle(choices)
        out.append({"id": f"sanity-{i:03d}", "kind": kind, "question": q, "answer": a,
                    "choices": choices, "label": choices.index(a)})
    return out


def main() -> None:
    path = Path(__file__).resolve().parent / "data" / "sanity.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in items()))
    print(f"wrote {path} ({N_ITEMS} items)")


if __name__ == "__main__":
    main()
