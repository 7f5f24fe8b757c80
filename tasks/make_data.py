"""Generate the bundled sample sets (written for this project; not copied from GSM8K or GPQA).

    python tasks/make_data.py     # rewrites tasks/data/*.jsonl deterministically (seed below)

gsm8k_sample.jsonl: 60 grade-school word problems in GSM8K's schema (question, answer with a worked
solution ending "#### N"). gpqa_sample.jsonl: 40 four-option science questions in GPQA's schema
(Question, Correct Answer, Incorrect Answer 1..3). Easy enough that a 135M model sometimes
solves them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 20261130
NAMES = ["Mia", "Liam", "Ava", "Noah", "Zoe", "Omar", "Lena", "Ravi", "Sofia", "Ken", "Iris", "Tomas"]
THINGS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "shells", "cards"]


def gsm8k_items(rng: random.Random) -> list[dict]:
    out: list[dict] = []
    seen: set[str] = set()
    while len(out) < 60:  # every question distinct (a duplicate is drawn again)
        i = len(out)
        n, t = rng.choice(NAMES), rng.choice(THINGS)
        kind = i % 6
        if kind == 0:
            a, b = rng.randint(2, 30), rng.randint(2, 30)
            q = f"{n} has {a} {t}. A friend gives {n} {b} more. How many {t} does {n} have now?"
            sol, ans = f"{n} has {a} + {b} = {a + b} {t}.", a + b
        elif kind == 1:
            a, b = rng.randint(20, 60), rng.randint(2, 19)
            q = f"{n} had {a} {t} and gave away {b}. How many {t} are left?"
            sol, ans = f"{a} - {b} = {a - b} {t} are left.", a - b
        elif kind == 2:
            a, b = rng.randint(2, 9), rng.randint(3, 12)
            q = f"{n} buys {a} bags with {b} {t} in each bag. How many {t} does {n} buy in total?"
            sol, ans = f"{a} bags x {b} {t} = {a * b} {t}.", a * b
        elif kind == 3:
            b = rng.randint(2, 6)
            a = b * rng.randint(2, 9)
            q = f"{n} shares {a} {t} equally among {b} friends. How many {t} does each friend get?"
            sol, ans = f"{a} / {b} = {a // b} {t} each.", a // b
        elif kind == 4:
            p, c = rng.randint(2, 9), rng.randint(2, 6)
            q = f"A notebook costs {p} dollars. {n} buys {c} notebooks and pays with a 100 dollar bill. " \
                "How much change does " + n + " get?"
            sol, ans = f"The notebooks cost {c} x {p} = {c * p} dollars. The change is 100 - {c * p} = " \
                       f"{100 - c * p} dollars.", 100 - c * p
        else:
            a, b, c = rng.randint(3, 15), rng.randint(3, 15), rng.randint(1, 5)
            q = f"{n} reads {a} pages on Monday and {b} pages on Tuesday, then skips {c} pages. " \
                "How many pages has " + n + " read?"
            sol, ans = f"{a} + {b} = {a + b}, and {a + b} - {c} = {a + b - c} pages.", a + b - c
        if q not in seen:
            seen.add(q)
            out.append({"question": q, "answer": f"{sol}\n#### {ans}"})
    return out


def _mc(q: str, right, wrongs) -> dict:
    w = list(dict.fromkeys(str(x) for x in wrongs if str(x) != str(right)))  # distinct, in order
    assert len(w) >= 3, (q, right, wrongs)
    return {"Question": q, "Correct Answer": str(right), "Incorrect Answer 1": w[0],
            "Incorrect Answer 2": w[1], "Incorrect Answer 3": w[2]}


def gpqa_items(rng: random.Random) -> list[dict]:
    out = []
    elements = [("H", 1), ("He", 2), ("C", 6), ("N", 7), ("O", 8), ("Na", 11), ("Cl", 17), ("Fe", 26)]
    for sym, z in elements:
        out.append(_mc(f"How many protons does a neutral atom of {sym} have?", z,
                       [z + 1, z + 2, z - 1 or z + 3, 2 * z + 1]))
    planets = [("Mercury", 1), ("Venus", 2), ("Earth", 3), ("Mars", 4), ("Jupiter", 5), ("Saturn", 6)]
    for p, k in planets:
        out.append(_mc(f"Counting outward from the Sun, which position does {p} occupy?", k,
                       [x for x in range(1, 9) if x != k][:3]))
    for _ in range(10):
        m, a = rng.randint(2, 9), rng.randint(2, 9)
        out.append(_mc(f"A {m} kg mass accelerates at {a} m/s^2. What net force acts on it, in newtons?",
                       m * a, [m + a, m * a + m, abs(m * a - a) or 1, m * a * 2]))
    for _ in range(8):
        v, r = rng.randint(2, 12), rng.randint(1, 6)
        out.append(_mc(f"A resistor of {r} ohms carries a current of {v} A. What is the voltage across it, "
                       "in volts?", v * r, [v + r, v * r + 1, v * r * 2, max(v - r, 1) + 100]))
    facts = [
        ("Which gas do plants take in for photosynthesis?", "carbon dioxide", ["oxygen", "nitrogen", "helium"]),
        ("What is the chemical formula of water?", "H2O", ["CO2", "O2", "NaCl"]),
        ("Which organelle is the site of aerobic respiration in cells?", "mitochondrion",
         ["ribosome", "nucleus", "Golgi apparatus"]),
        ("What is the SI unit of electric charge?", "coulomb", ["volt", "ohm", "tesla"]),
        ("Which particle carries a negative electric charge?", "electron", ["proton", "neutron", "photon"]),
        ("What is the pH of pure water at 25 degrees Celsius?", "7", ["1", "14", "10"]),
        ("Which blood cells carry oxygen?", "red blood cells", ["white blood cells", "platelets", "plasma"]),
        ("How many chromosomes does a typical human body cell have?", "46", ["23", "44", "48"]),
    ]
    for q, right, wrong in facts:
        out.append(_mc(q, right, wrong))
    assert len(out) == 40, len(out)
    # GPQA's Record ID column: the seed of each question's answer order (tasks/gpqa/utils.py)
    return [{"Record ID": f"evalsuite-sample-{i:02d}", **x} for i, x in enumerate(out)]


def main() -> None:
    rng = random.Random(SEED)
    d = Path(__file__).parent / "data"
    d.mkdir(exist_ok=True)
    for name, items in (("gsm8k_sample.jsonl", gsm8k_items(rng)), ("gpqa_sample.jsonl", gpqa_items(rng))):
        (d / name).write_text("".join(json.dumps(x) + "\n" for x in items))
        print(f"wrote {d / name}: {len(items)} items")


if __name__ == "__main__":
    main()
