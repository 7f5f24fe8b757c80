"""A large, varied, seeded prompt set for false-alarm runs and the detection table (issue 14).

    .venv/bin/python -m benchmarks.make_prompts --n 1000 --seed 0 --out runs/prompts-1000.jsonl

Every prompt is generated here from word lists and templates (no dataset text), in the prompt-set
JSONL of evalsuite/prompts.py: raw and chat; short (a few tokens) to long (raw prompts of up to 1,500
tokens, cut to an exact token count with "tokens"); prose, code, numbers, JSON, unicode (accents,
CJK, Cyrillic, Greek, emoji) and repetition. The same seed gives the same file, byte for byte; the file's
sha256 is printed and every diff result records the set's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

NOUNS = ("river", "engine", "garden", "letter", "market", "violin", "harbour", "ledger", "mountain", "window",
         "teacher", "bridge", "forest", "signal", "kitchen", "planet", "compiler", "island", "library", "storm")
VERBS = ("carried", "opened", "measured", "painted", "followed", "repaired", "counted", "described", "lifted",
         "watched", "crossed", "sorted", "recorded", "built", "found")
ADJS = ("quiet", "narrow", "bright", "heavy", "ancient", "careful", "distant", "green", "sudden", "small")
NAMES = ("Alice", "Bruno", "Chen", "Dara", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun")
UNICODE = ("café", "naïve", "Straße", "façade", "crème brûlée", "東京", "北京大学", "こんにちは", "안녕하세요",
           "Москва", "Ελλάδα", "שלום", "مرحبا", "नमस्ते", "🙂", "🚀✨", "½ ≤ ∑ ∞", "Ωmega", "Ñandú", "Zürich")
QUESTIONS = ("What is {a} times {b}?", "What is {a} plus {b}?", "Explain what a {n} is in one sentence.",
             "Write a short poem about a {j} {n}.", "Is {a} a prime number? Explain briefly.",
             "Translate 'the {j} {n}' into French.", "Give three facts about {n}s as a numbered list.",
             "Write a Python function named {n}_count that counts the items of a list.",
             "Summarise the following in one sentence: {s}", "How many minutes are in {a} hours?")


def sentence(r: random.Random) -> str:
    return (f"The {r.choice(ADJS)} {r.choice(NOUNS)} {r.choice(VERBS)} the {r.choice(NOUNS)} "
            f"near the {r.choice(ADJS)} {r.choice(NOUNS)}.")


def prose(r: random.Random) -> str:
    return " ".join(sentence(r) for _ in range(r.randint(1, 6)))


def code(r: random.Random) -> str:
    n, m = r.choice(NOUNS), r.choice(NOUNS)
    return r.choice((
        f"def {n}_total(items):\n    total = 0\n    for x in items:\n        total += x * {r.randint(2, 9)}\n",
        f"class {n.title()}:\n    def __init__(self, {m}):\n        self.{m} = {m}\n\n    def ",
        f"// {n} lookup\nfunction find{n.title()}(list, key) {{\n  for (const item of list) {{\n",
        f"SELECT {n}, COUNT(*) FROM {m}s WHERE year > {r.randint(1990, 2024)} GROUP BY",
        f"#include <stdio.h>\nint main(void) {{\n    int {n} = {r.randint(1, 99)};\n    printf(",
    ))


def numbers(r: random.Random) -> str:
    a, d = r.randint(1, 500), r.randint(1, 17)
    return r.choice((
        ", ".join(str(a + d * i) for i in range(r.randint(3, 12))) + ",",
        f"{a} + {d * 7} = ",
        "\n".join(f"{r.choice(NAMES)}: {r.randint(10, 999)}.{r.randint(0, 99):02d}" for _ in range(r.randint(2, 8)))
        + "\nTotal:",
        f"Table of {d}: " + " ".join(f"{d}x{i}={d * i}" for i in range(1, r.randint(4, 11))),
    ))


def jsonish(r: random.Random) -> str:
    obj = {"name": r.choice(NAMES), "id": r.randint(1, 10_000), "tags": r.sample(NOUNS, 3),
           "score": round(r.random() * 100, 2)}
    return json.dumps(obj)[:-1] + ', "'


def uni(r: random.Random) -> str:
    return " ".join(r.choice(UNICODE) for _ in range(r.randint(2, 9))) + " " + prose(r)


def repetition(r: random.Random) -> str:
    return " ".join([f"{r.choice(ADJS)} {r.choice(NOUNS)}"] * r.randint(3, 30))


KINDS = {"prose": prose, "code": code, "numbers": numbers, "json": jsonish, "unicode": uni,
         "repetition": repetition}


def make(n: int, seed: int, max_tokens: int = 1500) -> list[dict]:
    r = random.Random(seed)
    out = []
    for i in range(n):
        kind = r.choice(tuple(KINDS))
        if r.random() < 0.3:  # chat: a question from a template
            q = r.choice(QUESTIONS).format(a=r.randint(2, 99), b=r.randint(2, 99), n=r.choice(NOUNS),
                                           j=r.choice(ADJS), s=prose(r))
            out.append({"id": f"gen-{i:04d}-chat", "kind": "chat", "text": q})
            continue
        text = KINDS[kind](r)
        row = {"id": f"gen-{i:04d}-raw-{kind}", "kind": "raw", "text": text}
        if r.random() < 0.35:  # long: the text repeated and cut to an exact length, log-uniform 64..max_tokens
            row["tokens"] = int(round(64 * (max_tokens / 64) ** r.random()))
            row["text"] = " ".join([text] + [KINDS[kind](r) for _ in range(8)])
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=1500)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.n < 1 or a.max_tokens < 64:
        print("error: --n must be >= 1 and --max-tokens >= 64", file=sys.stderr)
        return 2
    rows = make(a.n, a.seed, a.max_tokens)
    text = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in rows)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(text, "utf-8")
    print(f"{a.out}: {len(rows)} prompts, seed {a.seed}, sha256 {hashlib.sha256(text.encode()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
