"""benchmarks/detection.py's --recheck-evalsuite and --merge: bad input stops in one line (exit 2) before any model
loads and leaves the table as it was; a re-checked catch that moved is shown beside the old one; tables run apart
merge into one."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def detection():
    return importlib.import_module("benchmarks.detection")


def _table(path: Path, **settings) -> str:
    doc = {"prompts": 64, "order_seed": 0, "max_new_tokens": 32, "dtype": "float32", "rows": []} | settings
    path.write_text(json.dumps(doc))
    return path.read_text()


@pytest.mark.parametrize("case, why", [
    ("with_resume", "goes alone"),
    ("missing", "does not exist"),
    ("other_settings", "other settings"),
    ("not_json", "is not a detection table"),
    ("no_rows", "is not a detection table"),
])
def test_recheck_refuses_bad_input_in_one_line(detection, tmp_path, capsys, case, why):
    out = tmp_path / "t.json"
    before = {"with_resume": lambda: _table(out), "missing": lambda: None,
              "other_settings": lambda: _table(out, prompts=32),  # a table run with 32 prompts, rechecked at 64
              "not_json": lambda: out.write_text("{half") and out.read_text(),
              "no_rows": lambda: out.write_text("[]") and out.read_text()}[case]()
    argv = ["--out", str(out), "--recheck-evalsuite"] + (["--resume"] if case == "with_resume" else [])
    assert detection.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert why in err and "\n" not in err and "Traceback" not in err
    assert (out.read_text() if out.exists() else None) == before  # nothing written over


def _rows(path: Path, rows: list[tuple[str, str | None]], **settings) -> Path:
    doc = {"prompts": 64, "order_seed": 0, "max_new_tokens": 32, "dtype": "bfloat16", "seconds": 10.0,
           "rows": [{"model": m, "fault": f} for m, f in rows]} | settings
    path.write_text(json.dumps(doc))
    return path


def test_merge_joins_tables_run_apart(detection, tmp_path):
    """--part splits a table over processes; --merge joins their rows into one table with the same settings."""
    a = _rows(tmp_path / "a.json", [("mini-kimi", None), ("mini-kimi", "latent_norm_padded")])
    b = _rows(tmp_path / "b.json", [("mini-muse", "nope_rotated")])
    out = tmp_path / "t.json"
    assert detection.main(["--out", str(out), "--merge", str(a), str(b)]) == 0
    doc = json.loads(out.read_text())
    assert [(r["model"], r["fault"]) for r in doc["rows"]] == [("mini-kimi", None), ("mini-kimi", "latent_norm_padded"),
                                                               ("mini-muse", "nope_rotated")]
    assert doc["dtype"] == "bfloat16" and doc["seconds"] == 20.0 and doc["merged_from"] == 2
    again = _rows(tmp_path / "c.json", [("mini-kimi", None)])
    again.write_text(again.read_text().replace('"fault": null}', '"fault": null, "rerun": true}'))
    assert detection.main(["--out", str(out), "--merge", str(out), str(again), "--replace"]) == 0
    rows = json.loads(out.read_text())["rows"]  # the re-run row in the old one's place
    assert len(rows) == 3 and rows[0] == {"model": "mini-kimi", "fault": None, "rerun": True}


@pytest.mark.parametrize("case, why", [("repeat", "repeats the row"), ("settings", "other settings"),
                                       ("broken", "is not a detection table")])
def test_merge_refuses_bad_input_in_one_line(detection, tmp_path, capsys, case, why):
    a = _rows(tmp_path / "a.json", [("mini-kimi", None)])
    b = {"repeat": lambda: _rows(tmp_path / "b.json", [("mini-kimi", None)]),
         "settings": lambda: _rows(tmp_path / "b.json", [("mini-muse", None)], dtype="float32"),
         "broken": lambda: (tmp_path / "b.json").write_text("{half") and tmp_path / "b.json"}[case]()
    out = tmp_path / "t.json"
    assert detection.main(["--out", str(out), "--merge", str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip()
    assert why in err and "\n" not in err and not out.exists()


def test_runs_as_a_module_from_the_root(tmp_path):
    """As documented: `.venv/bin/python -m benchmarks.detection ...` from the repository root."""
    out = tmp_path / "missing.json"
    p = subprocess.run([sys.executable, "-m", "benchmarks.detection", "--out", str(out), "--recheck-evalsuite"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    err = p.stderr.strip()
    assert p.returncode == 2, err[-2000:]
    assert "does not exist" in err.splitlines()[-1] and "Traceback" not in err  # the one-line message: above
    assert not out.exists()


def test_a_moved_catch_shows_the_old_one(detection):
    row = {"fault": "attn_scale", "dtype": "bfloat16", "model": "m",
           "first_caught": {r: None for r in detection.RULES}, "prompts_taken": 64}
    moved = {**row, "first_caught": {**row["first_caught"], "evalsuite": 8},
             "evalsuite_recheck": {"before": 3}}
    same = {**moved, "evalsuite_recheck": {"before": 8}}
    lines = detection.table([moved, same]).splitlines()[2:]
    assert "| 8 (was 3) |" in lines[0] and "(was" not in lines[1] and "| 8 |" in lines[1]


def test_benchmarks_use_only_public_names_and_no_path_edits():
    """Benchmarks run as `python -m benchmarks.NAME` against the checkout: no sys.path edits, and nothing private
    of another module (an import of `_name`, or `obj._name` on anything but self/cls)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    third_party = {"_attn_implementation", "_experts_implementation"}  # transformers' config fields (hf_oracle.py)
    found = []
    for f in sorted((root / "benchmarks").rglob("*.py")):
        rel = f.relative_to(root)
        text = f.read_text("utf-8")
        found += [f"{rel}: sys.path edit"] if "sys.path.insert" in text or "sys.path.append" in text else []
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                found += [f"{rel}:{node.lineno} import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and node.attr not in third_party \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{rel}:{node.lineno} .{node.attr}")
    assert found == []


def test_the_bf16_judge_is_the_recipe_diff_uses(detection):
    """The drift and scale baseline, the witness and the peers' same-dtype reference are the reference in the
    faithful megakernel's declared recipe, as diff builds them: a default recipe rounds an MoE router the engine
    keeps in float32 (a faithful mini-gptoss's drift read 1.84x against it, 1.00x against its own)."""
    from engines.megakernel import MegakernelEngine
    from evalsuite.models import load_model

    model = load_model("mini-moe")
    judge = detection.Judge(model, "bfloat16", [], 32, lambda s: None)
    declared = MegakernelEngine(model.weights, "bfloat16").recipe
    assert judge.declared == declared and judge._same.recipe == declared
    assert "router" in declared.f32_weights  # what a default recipe would round
