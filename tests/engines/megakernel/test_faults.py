"""The fault catalogue as knobs: each fault turns named knobs, derived once from its name; the engine reads
knobs, never a fault's name."""

import ast
from pathlib import Path

from engines.megakernel.faults import ALL_FAULTS, CATALOGUE, FAULTS, PARTS, Knobs, knobs

ROOT = Path(__file__).resolve().parents[3]


def test_each_fault_turns_its_own_knobs_in_one_part():
    assert knobs(None) == Knobs() and Knobs().set() == {}
    turned = [f.knobs.set() for f in CATALOGUE]
    assert all(turned), [f.name for f in CATALOGUE if not f.knobs.set()]
    assert len({f.knobs for f in CATALOGUE}) == len(CATALOGUE)  # no two faults alike
    assert {f.where for f in CATALOGUE} <= set(PARTS)
    assert FAULTS == tuple(f.name for f in CATALOGUE if f.where == "kernel")
    assert ALL_FAULTS == tuple(f.name for f in CATALOGUE)


def test_only_keeps_the_named_parts():
    loop = knobs("refill_wrong_row")
    assert loop.only("kernel", "head") == Knobs()  # a loop fault shares the faithful engine's programs
    assert knobs("attn_scale").only("kernel") == knobs("attn_scale")
    assert knobs("topk_renormalized").only("kernel") == Knobs()


def test_no_fault_name_is_compared_in_the_engine():
    found = []
    for rel in ("engines/megakernel/kernel.py", "engines/megakernel/engine.py", "engines/megakernel/prefill.py",
                "engines/megakernel/ops.py"):
        for node in ast.walk(ast.parse((ROOT / rel).read_text())):
            if isinstance(node, ast.Compare):
                found += [f"{rel}:{node.lineno} {c.value!r}" for c in [node.left, *node.comparators]
                          if isinstance(c, ast.Constant) and c.value in ALL_FAULTS]
    assert found == []
